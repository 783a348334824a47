"""The masked LM's vocabulary: a text tokenizer's ordinary tokens behind four special tokens.

The ids are a text tokenizer's (:mod:`headwise.text.tokenizer`: a ``bpe:N`` trained with
``tokenizers``, or GPT-Neo's) with ``[PAD]`` 0, ``[CLS]`` 1, ``[SEP]`` 2, ``[MASK]`` 3 put in front:
ordinary token ``i`` becomes ``i + 4`` and the cache's end-of-text (a document boundary) becomes
``[SEP]``, as cramming's corpus rows end each text with ``<sep>``. A byte-level BPE encodes every
text, so there is no ``[UNK]``. ``N`` cache tokens (end-of-text included) give ``N + 3`` ids.

Masked-LM pretraining and GLUE fine-tuning (the encoder family) and the exported tokenizer
(:mod:`headwise.hf.masked_tokenizer`) read this one layout; how rows are masked is the encoder
family's (:mod:`headwise.families.encoder.masking`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from headwise.errors import HeadwiseError
from headwise.text.tokenizer import Tokenizer

if TYPE_CHECKING:
    from torch import Tensor

PAD_ID, CLS_ID, SEP_ID, MASK_ID = 0, 1, 2, 3
SPECIAL_TOKENS = ("[PAD]", "[CLS]", "[SEP]", "[MASK]")
NUM_SPECIAL = len(SPECIAL_TOKENS)


class MaskedVocab:
    """The masked LM's ids: the four specials, then a cache tokenizer's ordinary tokens."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        # ordinary ids are shifted by 4 and end-of-text dropped: it must be the last id (both text tokenizers')
        if tokenizer.eot_id != tokenizer.vocab_size - 1:
            raise HeadwiseError(f"tokenizer {tokenizer.spec}: end-of-text is not its last id")
        self.vocab_size = tokenizer.vocab_size + NUM_SPECIAL - 1

    def from_cache(self, ids: np.ndarray) -> np.ndarray:
        """Cache ids (any integer array) as masked-LM ids (int64): shifted past the specials,
        end-of-text as ``[SEP]``."""
        ids = np.asarray(ids, dtype=np.int64)
        return np.where(ids == self.tokenizer.eot_id, SEP_ID, ids + NUM_SPECIAL)

    def encode(self, text: str) -> list[int]:
        """``[CLS] text [SEP]`` as ids."""
        return [CLS_ID, *self.from_cache(np.array(self.tokenizer.encode(text))).tolist(), SEP_ID]

    def decode(self, ids: list[int] | Tensor) -> str:
        """Text of masked-LM ids, specials shown by name."""
        out, run = [], []
        for i in (int(i) for i in ids):
            if i < NUM_SPECIAL:
                out.append(self.tokenizer.decode(run))
                out.append(SPECIAL_TOKENS[i])
                run = []
            else:
                run.append(i - NUM_SPECIAL)
        out.append(self.tokenizer.decode(run))
        return "".join(out)
