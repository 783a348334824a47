"""Tokenizers: gpt-neo ids against transformers' GPT-2 tokenizer built from the same files; the
trained byte-level BPE; exact chunked encoding of long streams."""

import hashlib
import json

import numpy as np
import pytest
from conftest import shared_data_dir

from headwise.data.sources import open_source
from headwise.text.tokenizer import (
    BPETokenizer,
    gpt_neo_files,
    gpt_neo_tokenizer,
    parse_tokenizer_spec,
    read_tokenizer,
    split_for_encoding,
)
from headwise.errors import HeadwiseError

TRICKY = [
    "Hello world",
    "",
    "  leading and trailing spaces  ",
    "Tabs\tand\nnewlines\n\n\nmany\r\nCRLF",
    "Contractions: don't, I'm, we'll, they've, she'd, it's, you're. DON'T",
    "Numbers 3.14159 and 2,000,000 and ½ and ١٢٣",
    "Unicode: café, naïve, 日本語, Ελληνικά, emoji 🐶🎉, combining e\u0301",
    "a literal <|endoftext|> inside a story",
    "    indented\n        code\n",
]


@pytest.fixture(scope="module")
def hf_gpt2():
    """transformers' GPT-2 fast tokenizer from the same two files (5.x keywords vocab=/merges=)."""
    transformers = pytest.importorskip("transformers")
    files = gpt_neo_files()
    vocab = json.loads(files["encoder.json"].read_text(encoding="utf-8"))
    lines = files["vocab.bpe"].read_text(encoding="utf-8").split("\n")[1:]
    merges = [tuple(line.split()) for line in lines if line]
    return transformers.GPT2TokenizerFast(vocab=vocab, merges=merges)


def test_gpt_neo_files_are_the_pinned_gpt2_files():
    files = gpt_neo_files()
    assert hashlib.sha256(files["encoder.json"].read_bytes()).hexdigest() == (
        "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
    )
    assert hashlib.sha256(files["vocab.bpe"].read_bytes()).hexdigest() == (
        "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
    )


def test_gpt_neo_basics():
    tok = gpt_neo_tokenizer()
    assert tok.vocab_size == 50257 and tok.eot_id == 50256
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.decode([15496, 995, 50256]) == "Hello world<|endoftext|>"
    # A literal end-of-text in the text stays ordinary text.
    assert 50256 not in tok.encode("a <|endoftext|> b")


@pytest.mark.parametrize("text", TRICKY)
def test_gpt_neo_matches_transformers_on_tricky_text(hf_gpt2, text):
    tok = gpt_neo_tokenizer()
    ids = tok.encode(text)
    if "<|endoftext|>" not in text:  # transformers turns the literal into the special token
        assert ids == hf_gpt2(text)["input_ids"]
    assert tok.decode(ids) == text


def test_gpt_neo_matches_transformers_on_the_train_sample(shared_data, hf_gpt2):
    stories = list(open_source(str(shared_data / "tinystories-train-sample.txt")).documents())
    tok = gpt_neo_tokenizer()
    flat = tok.encode_documents(stories)
    expected = []
    for ids in hf_gpt2(stories)["input_ids"]:
        expected.extend(ids + [50256])
    assert flat.dtype == np.uint32
    assert flat.tolist() == expected
    assert 480_000 < len(flat) < 540_000  # "about 509k GPT-2 tokens"


def test_long_stream_is_cut_without_changing_ids(shared_data, hf_gpt2):
    text = (shared_data / "tinystories-valid-sample.txt").read_text(encoding="utf-8")
    pieces = split_for_encoding(text, piece=4096)
    assert len(pieces) > 100 and "".join(pieces) == text
    whole = hf_gpt2(text)["input_ids"]
    tok = gpt_neo_tokenizer()
    assert tok.encode(text) == whole  # > 64k characters: encoded in pieces
    cut = [i for p in pieces for i in tok.encode(p)]
    assert cut == whole


def test_split_for_encoding_only_cuts_after_non_space():
    text = ("word\n\n  \n" * 50 + "x" * 10 + "\n") * 30
    pieces = split_for_encoding(text, piece=64)
    assert "".join(pieces) == text
    for a, b in zip(pieces, pieces[1:]):
        assert not a[-1].isspace() and b[0] == "\n"


def test_parse_tokenizer_spec():
    assert parse_tokenizer_spec("gpt-neo") is None
    assert parse_tokenizer_spec("bpe:4096") == 4096
    with pytest.raises(HeadwiseError, match="too small"):
        parse_tokenizer_spec("bpe:100")
    with pytest.raises(HeadwiseError, match="unknown tokenizer"):
        parse_tokenizer_spec("gpt2")


@pytest.fixture(scope="module")
def stories():
    data = shared_data_dir()
    return list(open_source(str(data / "tinystories-train-sample.txt")).documents())[:600]


def test_bpe_trains_to_the_requested_size_and_round_trips(stories):
    tok = BPETokenizer.train(stories, 1024)
    assert tok.spec == "bpe:1024" and tok.vocab_size == 1024 and tok.eot_id == 1023
    assert tok._tok.get_vocab_size() == 1023  # BPE tokens; end-of-text is the last id
    for text in TRICKY + stories[:20]:
        ids = tok.encode(text)
        assert all(0 <= i < 1023 for i in ids)
        assert tok.decode(ids) == text
    flat = tok.encode_documents(stories[:3])
    assert (flat == tok.eot_id).sum() == 3 and flat[-1] == tok.eot_id
    assert tok.decode(flat).count("<|endoftext|>") == 3
    # A trained vocabulary compresses the text it was trained on far better than bytes.
    assert len(tok.encode(stories[0])) < 0.5 * len(stories[0].encode())


def test_bpe_training_is_deterministic_and_saves_exactly(stories, tmp_path):
    a = BPETokenizer.train(stories, 512)
    b = BPETokenizer.train(stories, 512)
    assert a.json == b.json and a.sha256 == b.sha256
    a.save(tmp_path / "tokenizer.json")
    c = read_tokenizer(a.describe(), tmp_path / "tokenizer.json")
    assert c.sha256 == a.sha256
    assert c.encode(stories[5]) == a.encode(stories[5])
    assert BPETokenizer.train(stories, 600).sha256 != a.sha256


def test_reading_a_saved_tokenizer_refuses_a_bad_file(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    record = {"spec": "bpe:512", "eot_id": 511}
    with pytest.raises(HeadwiseError, match="damaged: it is not a tokenizer file"):
        read_tokenizer(record, bad)
    with pytest.raises(HeadwiseError, match="missing"):
        read_tokenizer(record, tmp_path / "absent.json")
