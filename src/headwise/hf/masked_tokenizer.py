"""A masked-LM run's vocabulary as a ``transformers`` tokenizer (``PreTrainedTokenizerFast``).

The masked LM's ids (:class:`~headwise.text.masked_vocab.MaskedVocab`) are a text
tokenizer's ordinary ids shifted past ``[PAD] [CLS] [SEP] [MASK]`` (0-3), its end-of-text
dropped. The same BPE, its vocabulary shifted by four and those four put in front as special
tokens, with a post-processor that frames every text as ``[CLS] text [SEP]``, gives exactly
:meth:`MaskedVocab.encode`'s ids. Unlike headwise's encoder, a literal ``[MASK]`` (or another of
the four) in a text is that special token, as fill-mask needs (``[MASK]`` with the space before
it, as a masked word is its id with its leading space); headwise reads it as plain text.

``transformers`` and ``tokenizers`` are imported lazily, as in :mod:`headwise.hf.tokenizer`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from headwise.errors import HeadwiseError
from headwise.hf.tokenizer import _backend
from headwise.text.masked_vocab import CLS_ID, MASK_ID, NUM_SPECIAL, SEP_ID, SPECIAL_TOKENS, MaskedVocab
from headwise.text.tokenizer import EOT_TEXT, Tokenizer


def _masked_backend(tokenizer: Tokenizer) -> Any:
    """The ``tokenizers.Tokenizer`` of the masked-LM ids over ``tokenizer`` (see the module docstring)."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import processors

    state = json.loads(_backend(tokenizer).to_str())
    vocab = state["model"]["vocab"]
    vocab.pop(EOT_TEXT, None)  # GPT-2's file holds it; a trained BPE's added it as a special token
    state["model"]["vocab"] = {**{name: i for i, name in enumerate(SPECIAL_TOKENS)},
                               **{token: i + NUM_SPECIAL for token, i in vocab.items()}}
    # [MASK] takes the space before it (RoBERTa's lstrip): "The [MASK] sat." masks " cat" as the
    # task masks it, a word with its leading space, rather than leaving the space a token of its own
    state["added_tokens"] = [{"id": i, "content": name, "single_word": False, "lstrip": i == MASK_ID,
                              "rstrip": False, "normalized": False, "special": True}
                             for i, name in enumerate(SPECIAL_TOKENS)]
    backend = Backend.from_str(json.dumps(state))
    cls, sep = SPECIAL_TOKENS[CLS_ID], SPECIAL_TOKENS[SEP_ID]
    backend.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1", special_tokens=[(cls, CLS_ID), (sep, SEP_ID)])
    want = MaskedVocab(tokenizer).vocab_size
    if backend.get_vocab_size() != want:
        raise HeadwiseError(f"tokenizer {tokenizer.spec}: the masked-LM vocabulary would have "
                            f"{backend.get_vocab_size()} ids, but headwise's has {want}")
    return backend


def masked_hf_tokenizer(tokenizer: Tokenizer, model_max_length: int | None = None) -> Any:
    """A ``PreTrainedTokenizerFast`` giving the masked-LM ids over ``tokenizer`` (``[CLS] text
    [SEP]``; ``mask_token`` ``[MASK]``, ``pad_token`` ``[PAD]``); ``model_max_length``: the
    model's ``max_seq_len`` when given."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    extra = {} if model_max_length is None else {"model_max_length": model_max_length}
    pad, cls, sep, mask = SPECIAL_TOKENS
    return PreTrainedTokenizerFast(
        tokenizer_object=_masked_backend(tokenizer), pad_token=pad, cls_token=cls, sep_token=sep,
        mask_token=AddedToken(mask, lstrip=True, rstrip=False, normalized=False, special=True),
        # the model reads ids and the padding mask only (no segment ids)
        model_input_names=["input_ids", "attention_mask"],
        # decoding must give the text back byte for byte, spaces before punctuation included
        clean_up_tokenization_spaces=False,
        **extra,
    )


def save_masked_hf_tokenizer(run_dir: str | Path, cfg, out_dir: str | Path, model_max_length: int) -> Path:
    """Write the vocabulary of a masked-LM run, or of a fine-tuning run of one, with
    ``save_pretrained`` into ``out_dir`` (it loads with ``AutoTokenizer.from_pretrained(out_dir)``
    offline, without headwise), built from the tokenizer the run saved
    (:func:`headwise.train.generate.run_tokenizer`); returns ``out_dir``."""
    from headwise.train.generate import run_tokenizer

    masked_hf_tokenizer(run_tokenizer(Path(run_dir), cfg), model_max_length).save_pretrained(str(out_dir))
    return Path(out_dir)
