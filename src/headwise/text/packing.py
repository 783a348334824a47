"""Packed text batches with an exact, resumable position.

The training tokens are cut into ``n = (len - 1) // block_size`` contiguous blocks; block ``i``
is tokens ``[i*bs, i*bs + bs]`` (``bs + 1`` tokens: inputs are the first ``bs``, targets the last
``bs``), so consecutive blocks share one token and every training token is a target exactly once
per epoch.

Blocks are read in the epoch order of :class:`headwise.data.shuffled.EpochStream`: epoch ``e`` is
``default_rng([seed, e]).permutation(n)``, the epochs follow each other (a batch may straddle two),
and the stream's position is the number of blocks all ranks together have consumed; step ``k`` of
rank ``r`` of ``W`` takes positions ``k*B*W + r*B ... k*B*W + r*B + B - 1``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from headwise.data.batch import Batch
from headwise.data.shuffled import EpochStream
from headwise.errors import HeadwiseError


def num_blocks(num_tokens: int, block_size: int) -> int:
    """How many packed blocks of ``block_size + 1`` tokens ``num_tokens`` tokens give."""
    return max(0, (num_tokens - 1) // block_size)


def gather_blocks(tokens: np.ndarray, blocks: np.ndarray, block_size: int) -> Batch:
    """The batch made of the given block indices: int64 inputs and targets ``[len(blocks), bs]``."""
    index = np.asarray(blocks, dtype=np.int64)[:, None] * block_size + np.arange(block_size + 1)
    rows = torch.from_numpy(np.asarray(tokens[index], dtype=np.int64))
    return Batch(inputs=rows[:, :-1].contiguous(), targets=rows[:, 1:].contiguous())


class PackedStream(EpochStream):
    """Endless seeded batches of packed blocks for one data-parallel rank. Its saved position
    keeps the packed format (``kind`` "packed", ``n_blocks``, ``block_size``) that checkpoints hold."""

    def __init__(
        self, tokens: np.ndarray, block_size: int, micro_batch: int, seed: int, rank: int = 0, world_size: int = 1
    ) -> None:
        if block_size < 1 or micro_batch < 1:
            raise HeadwiseError(f"block_size ({block_size}) and micro_batch ({micro_batch}) must be at least 1")
        if not 0 <= rank < world_size:
            raise HeadwiseError(f"rank {rank} is outside 0..{world_size - 1} (world_size {world_size})")
        n_blocks = num_blocks(len(tokens), block_size)
        if n_blocks == 0:
            raise HeadwiseError(
                f"the training data has {len(tokens)} tokens, fewer than one block of block_size + 1 = {block_size + 1}"
            )
        super().__init__(n_blocks, n_blocks, micro_batch, seed, rank, world_size)
        self.tokens = tokens
        self.block_size = block_size

    def __next__(self) -> Batch:
        return gather_blocks(self.tokens, self.indices(self.take_step()), self.block_size)

    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": "packed",
            "position": self.position,
            "seed": self.seed,
            "n_blocks": self.n,
            "block_size": self.block_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != "packed":
            raise HeadwiseError(f"the saved data position is for a {state.get('kind')!r} stream, not a packed one")
        if (state["n_blocks"], state["block_size"]) != (self.n, self.block_size):
            raise HeadwiseError(
                f"the saved data position is for {state['n_blocks']} blocks of {state['block_size']} tokens, "
                f"but this data has {self.n} blocks of {self.block_size}: "
                "resume with the same data and block_size"
            )
        self.restore(state["seed"], state["position"])
