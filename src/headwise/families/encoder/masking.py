"""Masked-LM rows and masking: packed ``[CLS] ... [SEP]`` rows of a token cache, masked 80/10/10.

The ids are those of the masked vocabulary (:mod:`headwise.text.masked_vocab`: ``[PAD] [CLS] [SEP]
[MASK]``, then a text tokenizer's ordinary tokens).

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
from headwise.text.masked_vocab import CLS_ID, MASK_ID, NUM_SPECIAL, SEP_ID, MaskedVocab
from headwise.text.packing import PackedStream


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
