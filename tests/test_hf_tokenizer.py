"""A run's tokenizer as a transformers tokenizer: the same ids and text as headwise's own, for
both kinds (gpt-neo and a trained bpe:N), and a saved copy that AutoTokenizer loads in a fresh
process."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

from conftest import shared_data_dir
from headwise.cli import main
from headwise.text.tokenizer import EOT_TEXT, BPETokenizer, gpt_neo_tokenizer, read_tokenizer

pytest.importorskip("transformers")

from headwise.hf.tokenizer import hf_tokenizer, run_hf_tokenizer, save_hf_tokenizer  # noqa: E402

DATA = shared_data_dir()

TRICKY = [
    "", " ", "   ", "a  b   c    d", "\n", "\n\n", "x\n\n  y \n", "trailing   ", "   leading", "tab\tand\r\nCRLF",
    "héllo wörld ☃ 日本語 🙂 naïve café", "\u00a0no-break\u2003em space", "it's I'll they've we'D",
    "100,000.5 and 123456789", f"Hello{EOT_TEXT}world", EOT_TEXT, f" {EOT_TEXT} ", f"{EOT_TEXT}\n{EOT_TEXT}",
    "<|endoftext", "\"Quoted,\" she said... 'OK?!'",
]


def _stories() -> list[str]:
    return (DATA / "tinystories-train-sample.txt").read_text(encoding="utf-8").split(EOT_TEXT)


@pytest.fixture(scope="module")
def tokenizers_pair():
    """(headwise tokenizer, its transformers tokenizer) for gpt-neo and a small trained BPE."""
    stories = _stories()
    bpe = BPETokenizer.train(stories[:400], 1024)
    return [(tok, hf_tokenizer(tok, model_max_length=128)) for tok in (gpt_neo_tokenizer(), bpe)]


def _texts() -> list[str]:
    valid = (DATA / "tinystories-valid-sample.txt").read_text(encoding="utf-8")
    # stories the BPE never saw, a long stretch of the stream, and the tricky strings
    return TRICKY + _stories()[1000:1040] + [valid[:30000]]


def test_encode_and_decode_are_headwise_s(tokenizers_pair):
    for tok, hf in tokenizers_pair:
        assert (hf.eos_token, hf.bos_token) == (EOT_TEXT, EOT_TEXT)
        assert hf.eos_token_id == hf.bos_token_id == tok.eot_id and len(hf) == tok.vocab_size
        assert hf.model_max_length == 128 and hf.pad_token is None
        for text in _texts():
            ids = tok.encode(text)
            # a literal "<|endoftext|>" is ordinary text, as in headwise: never the end-of-text id
            assert hf.encode(text, add_special_tokens=False) == ids, (tok.spec, text[:50])
            assert hf(text)["input_ids"] == ids, (tok.spec, text[:50])
            assert hf.decode(ids) == tok.decode(ids) == text
            joined = ids + [tok.eot_id] + ids
            assert hf.decode(joined) == tok.decode(joined) == text + EOT_TEXT + text
            assert hf.decode(joined, skip_special_tokens=True) == text + text
        assert hf.encode(EOT_TEXT) != [tok.eot_id]


def test_decoding_any_ids_gives_headwise_s_text(tokenizers_pair):
    # random ids cut multi-byte characters: both replace the broken bytes the same way
    rng = random.Random(0)
    for tok, hf in tokenizers_pair:
        for _ in range(300):
            ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randrange(1, 16))]
            assert hf.decode(ids) == tok.decode(ids), (tok.spec, ids)


def _load_in_fresh_process(folder, text: str) -> dict:
    code = (
        "import json, sys\n"
        "from transformers import AutoTokenizer\n"
        "tok = AutoTokenizer.from_pretrained(sys.argv[1])\n"
        "ids = tok.encode(sys.argv[2])\n"
        "print(json.dumps({'ids': ids, 'text': tok.decode(ids), 'eos': tok.eos_token_id,\n"
        "                  'bos': tok.bos_token_id, 'max': tok.model_max_length, 'n': len(tok)}))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    # run outside the repository, so only what was saved (not headwise) can be used
    out = subprocess.run([sys.executable, "-c", code, str(folder), text], capture_output=True, text=True,
                         env=env, cwd=folder, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


RUN = """\
[model]
preset = "tiny-lm"
d_model = 32
n_layers = 1
heads = [2]
max_seq_len = 48
[task]
kind = "lm"
source = "tinystories-train-sample.txt"
validation = "tinystories-valid-sample.txt"
tokenizer = "bpe:400"
subset = 100
block_size = 32
[train]
steps = 1
micro_batch = 2
"""


def test_a_saved_run_tokenizer_loads_with_auto_tokenizer(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADWISE_DATA", str(DATA))
    monkeypatch.setenv("HEADWISE_CACHE", str(tmp_path / "cache"))
    (tmp_path / "run.toml").write_text(RUN)
    run = tmp_path / "run"
    assert main(["train", str(tmp_path / "run.toml"), "--out", str(run)]) == 0
    text = f"Once upon a time,  Tom saw {EOT_TEXT} — a café!\n\nThe end."
    own = read_tokenizer({"spec": "bpe:400", "eot_id": 399}, run / "tokenizer.json")
    assert run_hf_tokenizer(run).encode(text) == own.encode(text)

    folder = save_hf_tokenizer(run, tmp_path / "hf-tok")
    assert (folder / "tokenizer.json").is_file() and (folder / "tokenizer_config.json").is_file()
    loaded = _load_in_fresh_process(folder, text)
    assert loaded == {"ids": own.encode(text), "text": text, "eos": 399, "bos": 399, "max": 48, "n": 400}


def test_the_saved_gpt_neo_tokenizer_loads_with_auto_tokenizer(tmp_path):
    tok = gpt_neo_tokenizer()
    hf_tokenizer(tok).save_pretrained(str(tmp_path))
    text = f"Hello world {EOT_TEXT}  ☃\n"
    loaded = _load_in_fresh_process(tmp_path, text)
    assert loaded["ids"][:2] == [15496, 995] and loaded["ids"] == tok.encode(text)
    assert (loaded["text"], loaded["eos"], loaded["bos"], loaded["n"]) == (text, 50256, 50256, 50257)
