"""Document sources: every local format, the shared samples, and the hub loader pointed at local
files in the hub's layouts (no network)."""

import json
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import headwise.data.sources as sources
from headwise.data.sources import hub_reachable, hub_splits, open_source
from headwise.errors import HeadwiseError

STORIES = ["Once upon a time, a cat sat.", "Tom had a red ball.\n\nHe threw it far!", "The end. Ünïcödé 🐱 ok."]


@pytest.fixture(autouse=True)
def hf_datasets_cache(tmp_path_factory, monkeypatch):
    """datasets leaves lock files in its cache even when streaming: keep them out of HOME."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.mktemp("hf-datasets"))


@pytest.fixture
def data_env(shared_data, monkeypatch):
    """HEADWISE_DATA pointing at the shared samples, so they can be named relatively."""
    monkeypatch.setenv("HEADWISE_DATA", str(shared_data))
    return shared_data


def write_stories_txt(path, stories, trailing=True):
    """TinyStories-train.txt's layout: stories separated by lines <|endoftext|>."""
    text = "\n<|endoftext|>\n".join(stories) + ("\n<|endoftext|>\n" if trailing else "")
    path.write_text(text, encoding="utf-8")
    return path


def docs(*args, **kwargs):
    return list(open_source(*args, **kwargs).documents())


# --- local formats ---------------------------------------------------------------------------


def test_stories_txt(tmp_path):
    src = open_source(str(write_stories_txt(tmp_path / "s.txt", STORIES)))
    assert src.kind == "stories" and src.field is None
    assert list(src.documents()) == STORIES
    assert src.count() == 3


def test_stories_txt_without_final_separator_and_odd_whitespace(tmp_path):
    path = tmp_path / "s.txt"
    path.write_bytes(b"\n  first  \n<|endoftext|>  \r\n\n<|endoftext|>\nsecond\n  <|endoftext|>\nthird")
    # The empty story between two separators is skipped; stories are stripped.
    assert docs(str(path)) == ["first", "second", "third"]


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 23])
def test_stories_txt_chunking_never_changes_the_stories(shared_data, monkeypatch, chunk):
    path = shared_data / "tinystories-tiny-fixture.txt"
    monkeypatch.setattr(sources, "_CHUNK", chunk)
    expected = [s.strip() for s in path.read_text(encoding="utf-8").split("\n<|endoftext|>\n") if s.strip()]
    assert len(expected) == 5
    assert docs(str(path)) == expected


def test_the_shared_train_sample_loads_with_its_partial_last_story(shared_data):
    path = shared_data / "tinystories-train-sample.txt"
    src = open_source(str(path))
    stories = list(src.documents())
    text = path.read_text(encoding="utf-8")
    assert src.kind == "stories"
    assert len(stories) == 2317  # 2,316 complete stories and the cut one
    assert stories[0].startswith("One day, a little girl named Lily found a needle")
    tail = text.rsplit("<|endoftext|>", 1)[1]
    assert len(tail) == 807  # the README's partial story, with the newlines after the separator
    assert stories[-1] == tail.strip()


def test_the_shared_valid_sample_is_one_stream(shared_data):
    path = shared_data / "tinystories-valid-sample.txt"
    src = open_source(str(path))
    assert src.kind == "stream"
    assert list(src.documents()) == [path.read_text(encoding="utf-8")]


def test_relative_paths_are_found_under_headwise_data(tmp_path, monkeypatch):
    write_stories_txt(tmp_path / "mine.txt", STORIES)
    monkeypatch.setenv("HEADWISE_DATA", str(tmp_path))
    monkeypatch.chdir(tmp_path.parent)
    assert docs("mine.txt") == STORIES
    monkeypatch.delenv("HEADWISE_DATA")
    with pytest.raises(HeadwiseError, match="not found.*HEADWISE_DATA is not set"):
        open_source("mine.txt")


def test_stream_txt_and_forced_formats(tmp_path):
    stream = tmp_path / "stream.txt"
    stream.write_text("Para one.\n\nPara two.\n", encoding="utf-8")
    assert docs(str(stream)) == ["Para one.\n\nPara two.\n"]
    odd = tmp_path / "stories.text"
    write_stories_txt(odd, STORIES)
    with pytest.raises(HeadwiseError, match="cannot tell the format"):
        open_source(str(odd))
    assert docs(str(odd), format="stories") == STORIES
    # Forcing "stream" keeps the separators as text.
    assert docs(str(odd), format="stream")[0].count("<|endoftext|>") == 3


def test_txt_cut_mid_character_drops_the_incomplete_character(tmp_path):
    path = tmp_path / "cut.txt"
    path.write_bytes(b"one\n<|endoftext|>\ncaf\xc3\xa9 caf\xc3")
    assert docs(str(path)) == ["one", "caf\u00e9 caf"]


def test_invalid_utf8_is_refused_with_its_offset(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"one\n<|endoftext|>\nbad \xff byte\n<|endoftext|>\nthree")
    with pytest.raises(HeadwiseError, match=r"not UTF-8 text \(invalid byte at offset 22\)"):
        open_source(str(path))  # found when the file is opened
    deep = tmp_path / "deep.txt"
    deep.write_bytes(b"one\n<|endoftext|>\n" + b"a" * (sources._SNIFF + 10) + b"\xff\n")
    src = open_source(str(deep))  # past the head that opening reads: found while reading
    with pytest.raises(HeadwiseError, match=r"not UTF-8 text \(invalid byte at offset"):
        list(src.documents())
    stream = tmp_path / "bad-stream.txt"
    stream.write_bytes(b"ok \xfe\xff and more")
    with pytest.raises(HeadwiseError, match="not UTF-8"):
        docs(str(stream))


def test_binary_garbage_is_called_not_utf8_before_anything_else(tmp_path):
    # without a story separator it is a stream, which cannot be held out from: what is wrong
    # first is that it is not text at all
    garbage = tmp_path / "garbage.txt"
    garbage.write_bytes(bytes(range(256)) * 64)
    with pytest.raises(HeadwiseError, match=r"garbage.txt is not UTF-8 text \(invalid byte at offset 128\)"):
        open_source(str(garbage))
    with pytest.raises(HeadwiseError, match="not UTF-8 text"):
        open_source(str(garbage), format="stories")


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(HeadwiseError, match="not found"):
        open_source(str(tmp_path / "absent.txt"))
    with pytest.raises(HeadwiseError, match="not found"):
        open_source("subdir/absent.jsonl")  # a relative file path, not a hub name
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(HeadwiseError, match="is empty"):
        open_source(str(tmp_path / "empty.txt"))
    with pytest.raises(HeadwiseError, match="unknown data format"):
        open_source(str(tmp_path / "empty.txt"), format="csv")


def test_jsonl(tmp_path):
    path = tmp_path / "d.jsonl"
    rows = [{"text": s, "id": i} for i, s in enumerate(STORIES)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    src = open_source(str(path))
    assert (src.kind, src.field) == ("jsonl", "text")
    assert list(src.documents()) == STORIES
    story = tmp_path / "s.jsonl"
    story.write_text("\n".join(json.dumps({"story": s, "summary": "x"}) for s in STORIES), encoding="utf-8")
    assert open_source(str(story)).field == "story"
    assert docs(str(story), field="summary") == ["x"] * 3
    with pytest.raises(HeadwiseError, match="no field 'body'; its fields are: story, summary"):
        open_source(str(story), field="body")


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"text": "a"}\n{oops\n', "line 2 is not valid JSON"),
        ('{"text": "a"}\n[1, 2]\n', "line 2 is not a JSON object"),
        ('{"text": "a"}\n{"other": "b"}\n', "line 2 has no field 'text'"),
        ('{"text": "a"}\n{"text": 5}\n', "holds int, not text"),
    ],
)
def test_bad_jsonl_lines(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(HeadwiseError, match=message):
        docs(str(path))


def test_jsonl_without_a_text_field(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"body": "a"}\n', encoding="utf-8")
    with pytest.raises(HeadwiseError, match="neither a 'text' nor a 'story' field"):
        open_source(str(path))


def test_parquet(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"story": STORIES + [None, "  "], "n": [1, 2, 3, 4, 5]}), path, row_group_size=2)
    src = open_source(str(path))
    assert (src.kind, src.field) == ("parquet", "story")
    assert list(src.documents()) == STORIES  # None and blank rows are skipped
    with pytest.raises(HeadwiseError, match="no field 'text'"):
        open_source(str(path), field="text")
    with pytest.raises(HeadwiseError, match="holds int"):
        docs(str(path), field="n")
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"this is not parquet at all")
    with pytest.raises(HeadwiseError, match="not a readable parquet file"):
        open_source(str(bad))


def test_folder_of_shards_in_sorted_order(tmp_path):
    shards = tmp_path / "shards"
    (shards / "b").mkdir(parents=True)
    write_stories_txt(shards / "a-000.txt", STORIES[:2])
    write_stories_txt(shards / "b" / "a-001.txt", STORIES[2:])
    (shards / ".hidden.txt").write_text("never read\n<|endoftext|>\n")
    (shards / "README.md").write_text("ignored")
    src = open_source(str(shards))
    assert src.kind == "stories" and len(src.files) == 2
    assert list(src.documents()) == STORIES


def test_folder_of_parquet_shards(tmp_path):
    for i, s in enumerate(STORIES):
        pq.write_table(pa.table({"text": [s]}), tmp_path / f"train-{i:05d}-of-00003.parquet")
    assert docs(str(tmp_path)) == STORIES


@pytest.mark.parametrize(
    "names, message",
    [
        ([], "holds no .txt"),
        (["a.txt", "b.jsonl"], "mixes .jsonl, .txt"),
        (["train-0.txt", "valid-0.txt"], "other splits"),
    ],
)
def test_bad_folders(tmp_path, names, message):
    for name in names:
        (tmp_path / name).write_text('{"text": "x"}\n' if name.endswith("jsonl") else "x\n")
    with pytest.raises(HeadwiseError, match=message):
        open_source(str(tmp_path))


def test_a_field_for_plain_text_is_refused_unless_optional(tmp_path):
    path = write_stories_txt(tmp_path / "s.txt", STORIES)
    with pytest.raises(HeadwiseError, match="plain text"):
        open_source(str(path), field="text")
    assert open_source(str(path), field="text", strict_field=False).field is None


def test_identity_changes_when_the_file_changes(tmp_path):
    path = write_stories_txt(tmp_path / "s.txt", STORIES)
    before = open_source(str(path)).identity()
    write_stories_txt(path, STORIES + ["one more"])
    assert open_source(str(path)).identity() != before


# --- the hub loader, against local files in the hub's layouts --------------------------------


def hub_layout_skeskinen(root):
    """skeskinen/TinyStories-GPT4's layout: field `story`, train only, parquet shards under data/."""
    (root / "data").mkdir(parents=True)
    for i, chunk in enumerate([STORIES[:2], STORIES[2:]]):
        table = pa.table({"story": chunk, "summary": ["s"] * len(chunk), "source": ["GPT-4"] * len(chunk)})
        pq.write_table(table, root / "data" / f"train-{i:05d}-of-00002-abc.parquet")
    return root


def hub_layout_roneneldan(root, fmt="parquet"):
    """roneneldan/TinyStories's layout: field `text`, train and validation splits."""
    (root / "data").mkdir(parents=True)
    for split, rows in (("train", STORIES), ("validation", ["A held-out story."])):
        if fmt == "parquet":
            pq.write_table(pa.table({"text": rows}), root / "data" / f"{split}-00000-of-00001.parquet")
        else:
            (root / "data" / f"{split}.jsonl").write_text("".join(json.dumps({"text": r}) + "\n" for r in rows))
    return root


def test_hub_loader_reads_a_train_only_parquet_dataset(tmp_path):
    root = hub_layout_skeskinen(tmp_path / "TinyStories-GPT4")
    src = open_source(str(root), format="hub")
    assert (src.kind, src.field, src.split) == ("hub", "story", "train")
    assert list(src.documents()) == STORIES
    assert hub_splits(str(root)) == ["train"]
    with pytest.raises(HeadwiseError, match="has no split 'validation'"):
        open_source(str(root), format="hub", split="validation")
    with pytest.raises(HeadwiseError, match="no field 'text'"):
        open_source(str(root), format="hub", field="text")


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_hub_loader_reads_splits(tmp_path, fmt):
    root = hub_layout_roneneldan(tmp_path / "TinyStories", fmt)
    assert sorted(hub_splits(str(root))) == ["train", "validation"]
    assert docs(str(root), format="hub") == STORIES
    assert docs(str(root), format="hub", split="validation") == ["A held-out story."]


def test_hub_name_offline_fails_at_once_with_one_line():
    # conftest sets HF_HUB_OFFLINE=1, as on a machine without network.
    start = time.monotonic()
    with pytest.raises(HeadwiseError) as info:
        open_source("roneneldan/TinyStories")
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert "\n" not in message
    assert "roneneldan/TinyStories" in message and "HEADWISE_DATA" in message


def test_unreachable_hub_is_detected_before_datasets_retries(monkeypatch):
    from huggingface_hub import constants

    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", "https://hub.invalid")
    monkeypatch.setattr(sources, "hub_offline", lambda: False)
    assert hub_reachable(timeout=2) is False
    start = time.monotonic()
    with pytest.raises(HeadwiseError, match=r"cannot reach the Hugging Face hub .*HEADWISE_DATA"):
        open_source("skeskinen/TinyStories-GPT4")
    assert time.monotonic() - start < 10
