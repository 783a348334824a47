"""Masked-LM rows and masking: packed ``[CLS] ... [SEP]`` rows of a token cache, masked 80/10/10.

The vocabulary is a text tokenizer's (:mod:`headwise.text.tokenizer`: a ``bpe:N`` trained with
``tokenizers``, or GPT-Neo's) with four special tokens put in front of it: ``[PAD]`` 0, ``[CLS]`` 1, ``[SEP]`` 2,
``[MASK]`` 3; ordinary token ``i`` becomes ``i + 4`` and the cache's end-of-text (a document
boundary) becomes ``[SEP]``, as cramming's corpus rows end each text with ``<sep>``. A byte-level
BPE encodes every text, so there is no ``[UNK]``. ``N`` cache tokens (end-of-text included) give
``N + 3`` ids.

Masking follows cramming (``backend/utils.py`` PatchedDataCollatorForLanguageModeling): an EXACT
count per row, ``k = round(rate * maskable)`` positions (not Bernoulli draws), of which the first
``round(0.8 k)`` become ``[MASK]``, the next ``round(0.9 k) - round(0.8 k)`` a random token and the
rest stay; labels are the original ids there and -100 elsewhere. Unlike cramming, special tokens
are never chosen (``maskable`` counts the ordinary tokens of the row), the positions are a uniform
random choice, and random replacements are ordinary tokens (cramming draws any id).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from headwise.data.batch import Batch, BatchStream
from headwise.errors import HeadwiseError
from headwise.model.loss import IGNORE_INDEX
from headwise.text.packing import PackedStream
from headwise.text.tokenizer import Tokenizer

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


def rows_of(tokens: np.ndarray, blocks: np.ndarray, block_size: int, vocab: MaskedVocab) -> Tensor:
    """Rows ``[CLS] chunk [SEP]`` (int64 ``[len(blocks), block_size]``): chunk ``i`` is the
    ``block_size - 2`` cache tokens from ``i * (block_size - 2)``, so chunks never overlap."""
    width = block_size - 2
    index = np.asarray(blocks, dtype=np.int64)[:, None] * width + np.arange(width)
    body = vocab.from_cache(tokens[index])
    n = len(body)
    return torch.from_numpy(np.concatenate([np.full((n, 1), CLS_ID), body, np.full((n, 1), SEP_ID)], axis=1))


def mask_tokens(rows: Tensor, rate: float, vocab_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """``(inputs, labels)`` of rows ``[B, T]`` masked at ``rate`` by the 80/10/10 rule (see the
    module docstring), every draw from ``generator``."""
    special = rows < NUM_SPECIAL
    keys = torch.rand(rows.shape, generator=generator)
    keys[special] = 2.0  # after every ordinary position
    rank = keys.argsort(dim=1).argsort(dim=1)  # each position's place in the row's random order
    k = torch.round(rate * (~special).sum(1, keepdim=True).double()).long()
    n_mask, n_random = torch.round(0.8 * k.double()).long(), torch.round(0.9 * k.double()).long()
    chosen = rank < k
    labels = torch.where(chosen, rows, IGNORE_INDEX)
    random_ids = torch.randint(NUM_SPECIAL, vocab_size, rows.shape, generator=generator)
    inputs = torch.where(rank < n_mask, MASK_ID, rows)
    inputs = torch.where((rank >= n_mask) & (rank < n_random), random_ids, inputs)
    return inputs, labels


def batch_generator(seed: int, position: int, rank: int) -> torch.Generator:
    """The masking generator of one batch: seeded by the run's seed and the batch's place in
    the stream, so a resumed run masks exactly as an uninterrupted one."""
    state = np.random.SeedSequence([seed, position, rank, 0x6D6C6D]).generate_state(2, dtype=np.uint64)
    return torch.Generator().manual_seed(int(state[0] >> np.uint64(1)))


class MaskedStream(BatchStream):
    """Endless seeded masked-LM batches for one data-parallel rank: the order of a
    :class:`~headwise.text.packing.PackedStream` over non-overlapping chunks, each batch
    masked by its own :func:`batch_generator`. Batches are ``Batch(inputs, labels)``."""

    def __init__(self, tokens: np.ndarray, vocab: MaskedVocab, block_size: int, rate: float, micro_batch: int,
                 seed: int, rank: int = 0, world_size: int = 1) -> None:
        # A PackedStream of blocks of block_size - 2 reads blocks i*w .. i*w + w (w + 1 tokens);
        # only the first w of each are used, so rows never share a token.
        self.order = PackedStream(tokens, block_size - 2, micro_batch, seed, rank, world_size)
        self.tokens, self.vocab, self.block_size, self.rate = tokens, vocab, block_size, rate

    @property
    def epoch(self) -> float:
        return self.order.epoch

    def __next__(self) -> Batch:
        o = self.order
        position = o.take_step()
        rows = rows_of(self.tokens, o.indices(position), self.block_size, self.vocab)
        generator = batch_generator(o.seed, position, o.rank)
        inputs, labels = mask_tokens(rows, self.rate, self.vocab.vocab_size, generator)
        return Batch(inputs=inputs, targets=labels)

    def state_dict(self) -> dict[str, Any]:
        return {**self.order.state_dict(), "mask_rate": self.rate}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("mask_rate") != self.rate:
            raise HeadwiseError(
                f"the saved data position was masked at rate {state.get('mask_rate')}, this task masks at "
                f"{self.rate}: resume with the same mask_rate"
            )
        self.order.load_state_dict(state)
