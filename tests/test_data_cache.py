"""Token caches: contents against an independent tokenizer, reuse, new caches beside old ones,
truncation / corruption / mismatch detection, atomic builds, and bad input writing nothing."""

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

import headwise.text.token_cache as cache_mod
from headwise.data.cache_files import CacheInvalid, default_cache_dir, install, list_caches
from headwise.text.token_cache import TokenCache, prepare, token_dtype
from headwise.text.data_plan import DataConfig
from headwise.text.tokenizer import Tokenizer
from headwise.errors import HeadwiseError
from test_data_sources import (  # noqa: F401
    STORIES,
    data_env,
    hf_datasets_cache,
    hub_layout_roneneldan,
    write_stories_txt,
)
from test_tokenizer import hf_gpt2  # noqa: F401

VALID = ["A separate validation story.", "And another one, a bit longer than the first."]


@pytest.fixture
def small(tmp_path):
    """A three-story training file and a two-story validation file."""
    train = write_stories_txt(tmp_path / "train.txt", STORIES)
    valid = write_stories_txt(tmp_path / "valid.txt", VALID)
    return DataConfig(source=str(train), validation=str(valid)), tmp_path / "cache"


def reference_ids(hf, stories):
    out = []
    for ids in hf(stories)["input_ids"]:
        out.extend(ids + [50256])
    return out


def test_gpt_neo_cache_holds_the_reference_tokens(small, hf_gpt2):
    cfg, root = small
    cache = prepare(cfg, cache_dir=root)
    assert cache.path.parent == root and cache.path.name.startswith("train-gpt-neo-")
    assert cache.dtype == np.uint16 and cache.vocab_size == 50257
    assert cache.tokens("train").tolist() == reference_ids(hf_gpt2, STORIES)
    assert cache.tokens("valid").tolist() == reference_ids(hf_gpt2, VALID)
    meta = json.loads((cache.path / "meta.json").read_text())
    assert meta["format"] == 1
    assert meta["tokenizer"]["spec"] == "gpt-neo" and meta["tokenizer"]["eot_id"] == 50256
    assert meta["splits"]["train"]["documents"] == 3 and meta["splits"]["valid"]["documents"] == 2
    for split in ("train", "valid"):
        data = (cache.path / f"{split}.bin").read_bytes()
        assert meta["splits"][split]["sha256"] == hashlib.sha256(data).hexdigest()
        assert len(data) == 2 * meta["splits"][split]["tokens"]
    assert meta["request"]["train"]["files"][0][0] == cfg.source
    assert meta["request"]["tokenizer"] == "gpt-neo"


def test_the_same_request_reuses_the_cache(small, monkeypatch):
    cfg, root = small
    first = prepare(cfg, cache_dir=root)
    stamp = (first.path / "train.bin").stat().st_mtime_ns

    def no_build(*args, **kwargs):
        raise AssertionError("the cache should have been reused")

    monkeypatch.setattr(cache_mod, "_build", no_build)
    again = prepare(cfg, cache_dir=root)
    assert again.path == first.path
    assert (again.path / "train.bin").stat().st_mtime_ns == stamp


def test_a_different_request_builds_beside(small):
    cfg, root = small
    a = prepare(cfg, cache_dir=root)
    b = prepare(cfg.model_copy(update={"tokenizer": "bpe:300"}), cache_dir=root)
    c = prepare(cfg.model_copy(update={"subset": 2}), cache_dir=root)
    assert len({a.path, b.path, c.path}) == 3
    assert list_caches(root) == sorted([a.path, b.path, c.path])
    assert TokenCache.open(a.path).num_tokens("train") > c.num_tokens("train")


def test_a_changed_source_file_is_a_different_request(small):
    cfg, root = small
    a = prepare(cfg, cache_dir=root)
    write_stories_txt(Path(cfg.source), STORIES[:2])
    b = prepare(cfg, cache_dir=root)
    assert b.path != a.path and b.meta["splits"]["train"]["documents"] == 2


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda p: p.joinpath("train.bin").write_bytes(p.joinpath("train.bin").read_bytes()[:-2]), "truncated"),
        (lambda p: p.joinpath("valid.bin").unlink(), "valid.bin is missing"),
        (lambda p: p.joinpath("meta.json").unlink(), "meta.json is missing"),
        (lambda p: p.joinpath("meta.json").write_text("{oops"), "not valid JSON"),
        (lambda p: _edit_meta(p, lambda m: m.update(format=99)), "format version 99"),
        (lambda p: _edit_meta(p, lambda m: m["request"].update(tokenizer="bpe:999")), "different request"),
        (lambda p: _edit_meta(p, lambda m: m["tokenizer"].update(sha256="0" * 64)), "tokenizer differs"),
        (lambda p: _edit_meta(p, lambda m: m["splits"]["train"].pop("tokens")), "lacks or garbles"),
        (lambda p: _flip_byte(p / "train.bin"), "corrupted"),
    ],
)
def test_a_bad_cache_is_refused_then_rebuilt_on_request(small, damage, reason):
    cfg, root = small
    good = prepare(cfg, cache_dir=root)
    original = (good.path / "train.bin").read_bytes()
    damage(good.path)
    snapshot = {f.name: f.read_bytes() for f in good.path.iterdir()}
    with pytest.raises(CacheInvalid, match=reason) as info:
        prepare(cfg, cache_dir=root)
    assert "\n" not in str(info.value) and "--rebuild" in str(info.value)
    assert {f.name: f.read_bytes() for f in good.path.iterdir()} == snapshot  # refused, not touched
    rebuilt = prepare(cfg, cache_dir=root, rebuild=True)
    assert rebuilt.path == good.path
    assert (rebuilt.path / "train.bin").read_bytes() == original
    assert [p.name for p in root.iterdir()] == [good.path.name]  # no temporaries left


def _edit_meta(path, change):
    meta = json.loads((path / "meta.json").read_text())
    change(meta)
    (path / "meta.json").write_text(json.dumps(meta))


def _flip_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_bpe_cache_keeps_its_tokenizer(small):
    cfg, root = small
    cache = prepare(cfg.model_copy(update={"tokenizer": "bpe:300"}), cache_dir=root)
    assert (cache.path / "tokenizer.json").is_file()
    assert cache.vocab_size == 300 and cache.tokenizer.eot_id == 299
    text = cache.tokenizer.decode(cache.tokens("train"))
    assert text == "".join(s + "<|endoftext|>" for s in STORIES)
    reopened = TokenCache.open(cache.path)
    assert reopened.tokenizer.sha256 == cache.tokenizer.sha256
    (cache.path / "tokenizer.json").write_text((cache.path / "tokenizer.json").read_text().replace('"a"', '"b"', 1))
    with pytest.raises(CacheInvalid, match="tokenizer"):
        TokenCache.open(cache.path)
    (cache.path / "tokenizer.json").unlink()
    with pytest.raises(CacheInvalid, match="tokenizer.json is missing"):
        TokenCache.open(cache.path)


def test_an_interrupted_build_leaves_nothing_that_looks_complete(small, monkeypatch):
    cfg, root = small
    calls = []
    real = Tokenizer.encode_documents

    def interrupted(self, texts, eot=True):
        calls.append(len(texts))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, texts, eot)

    monkeypatch.setattr(Tokenizer, "encode_documents", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare(cfg, cache_dir=root)
    assert list(root.iterdir()) == []
    monkeypatch.setattr(Tokenizer, "encode_documents", real)
    # A temporary left by a killed process is hidden and ignored.
    (root / ".train-gpt-neo-0000.abc.tmp").mkdir()
    (root / ".train-gpt-neo-0000.abc.tmp" / "train.bin").write_bytes(b"\0\0")
    cache = prepare(cfg, cache_dir=root)
    assert list_caches(root) == [cache.path]


def test_a_finished_cache_of_another_process_is_kept(tmp_path):
    final, tmp = tmp_path / "c", tmp_path / ".c.tmp"
    final.mkdir()
    (final / "meta.json").write_text("theirs")
    tmp.mkdir()
    (tmp / "meta.json").write_text("ours")
    install(tmp, final, replace=False)
    assert (final / "meta.json").read_text() == "theirs"


TWO = b"a\n<|endoftext|>\nb"


@pytest.mark.parametrize(
    "name, content, options, message",
    [
        ("absent.txt", None, {}, "not found"),
        ("empty.txt", b"", {}, "is empty"),
        ("bad.txt", b"ok\n<|endoftext|>\n\xff\xfe", {}, "not UTF-8"),
        ("s.txt", TWO, {"subset": 9}, "larger than the source"),
        ("s.txt", TWO, {"validation": "fraction:0.01"}, "validation set is empty"),
        ("s.txt", TWO, {"tokenizer": "bpe:300", "subset": 9}, "larger than the source"),
        ("v.jsonl", b'{"text": "a"}\n', {"field": "body"}, "no field 'body'"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, name, content, options, message):
    if content is not None:
        (tmp_path / name).write_bytes(content)
    root = tmp_path / "cache"
    with pytest.raises(HeadwiseError, match=message) as info:
        prepare(DataConfig(source=str(tmp_path / name), **options), cache_dir=root)
    assert "\n" not in str(info.value)
    assert not root.exists() or list(root.iterdir()) == []


@pytest.mark.parametrize("tokenizer", ["gpt-neo", "bpe:2048"])
def test_the_shared_samples_with_both_tokenizers(data_env, tmp_path, tokenizer):
    cfg = DataConfig(
        source="tinystories-train-sample.txt", validation="tinystories-valid-sample.txt", tokenizer=tokenizer
    )
    cache = prepare(cfg, cache_dir=tmp_path)
    assert cache.meta["splits"]["train"]["documents"] == 2317
    assert cache.meta["splits"]["valid"]["documents"] == 1
    train = cache.tokens("train")
    assert (np.asarray(train) == cache.tokenizer.eot_id).sum() == 2317 and train[-1] == cache.tokenizer.eot_id
    if tokenizer == "gpt-neo":
        assert 480_000 < len(train) < 540_000 and 180_000 < cache.num_tokens("valid") < 200_000
    valid_text = (data_env / "tinystories-valid-sample.txt").read_text(encoding="utf-8")
    assert cache.tokenizer.decode(cache.tokens("valid")) == valid_text + "<|endoftext|>"
    assert prepare(cfg, cache_dir=tmp_path).path == cache.path


def test_hub_layout_cache(tmp_path):
    root = hub_layout_roneneldan(tmp_path / "TinyStories")
    cache = prepare(DataConfig(source=str(root), format="hub"), cache_dir=tmp_path / "cache")
    assert cache.meta["splits"]["train"]["documents"] == 3
    assert cache.meta["splits"]["valid"]["documents"] == 1
    assert cache.path.name.startswith("TinyStories-gpt-neo-")


def test_token_dtype_and_default_dir(monkeypatch, tmp_path):
    assert token_dtype(50257) == np.uint16 and token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.uint32
    monkeypatch.setenv("HEADWISE_CACHE", str(tmp_path / "hc"))
    assert default_cache_dir() == tmp_path / "hc"
    monkeypatch.delenv("HEADWISE_CACHE")
    assert default_cache_dir() == Path.home() / ".cache" / "headwise"


def test_a_large_vocabulary_is_stored_as_uint32(small, monkeypatch):
    # a vocabulary past 65,536 needs far more text than a test has: store a small one as uint32
    monkeypatch.setattr(cache_mod, "token_dtype", lambda vocab_size: np.dtype(np.uint32))
    cfg, root = small
    cache = prepare(cfg.model_copy(update={"tokenizer": "bpe:300"}), cache_dir=root)
    assert cache.dtype == np.uint32
    assert int(np.asarray(cache.tokens("train")).max()) == 299  # end-of-text
    assert os.path.getsize(cache.path / "train.bin") == 4 * cache.num_tokens("train")


def test_a_bpe_larger_than_the_text_supports_is_refused(data_env, tmp_path):
    # five stories learn 838 tokens: bpe:70000 would leave ~69k embedding rows no token uses
    cfg = DataConfig(source="tinystories-tiny-fixture.txt", validation="tinystories-valid-sample.txt",
                     tokenizer="bpe:70000")
    with pytest.raises(HeadwiseError, match=r"'bpe:70000': the training text supports only 839 tokens "
                                            r"\(838 learnt \+ end-of-text\); use 'bpe:839' or fewer") as info:
        prepare(cfg, cache_dir=tmp_path / "cache")
    assert "\n" not in str(info.value) and list((tmp_path / "cache").iterdir()) == []
    # the number it names is what the text supports: exactly that many tokens, all used
    cache = prepare(cfg.model_copy(update={"tokenizer": "bpe:839"}), cache_dir=tmp_path / "cache")
    assert cache.vocab_size == 839 and cache.tokenizer._tok.get_vocab_size() == 838


@pytest.mark.parametrize(
    "change, reason",
    [
        (lambda m: m["tokenizer"].update(vocab_size=70000), "dtype uint16 for a vocabulary of 70,000"),
        (lambda m: m["tokenizer"].update(vocab_size=1000), "vocab_size 1,000, but its tokenizer bpe:300 has 300"),
        (lambda m: m.update(dtype="int8"), "dtype 'int8'"),
    ],
)
def test_a_meta_whose_vocabulary_does_not_fit_is_damaged(small, change, reason):
    cfg, root = small
    cache = prepare(cfg.model_copy(update={"tokenizer": "bpe:300"}), cache_dir=root)
    _edit_meta(cache.path, change)
    with pytest.raises(CacheInvalid, match=reason):
        TokenCache.open(cache.path)


def test_a_source_without_text_is_refused_before_building(tmp_path, monkeypatch):
    only_separators = tmp_path / "seps.txt"
    only_separators.write_bytes(b"<|endoftext|>\n  \n<|endoftext|>\n")
    monkeypatch.setattr(cache_mod, "_Progress", None)  # nothing may be drawn (or built)
    with pytest.raises(HeadwiseError, match="holds no text"):
        prepare(DataConfig(source=str(only_separators)), cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()
