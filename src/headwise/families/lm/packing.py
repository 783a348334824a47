"""Packed language-modelling batches with an exact, resumable position.

The training tokens are cut into ``n = (len - 1) // block_size`` contiguous blocks; block ``i``
is tokens ``[i*bs, i*bs + bs]`` (``bs + 1`` tokens: inputs are the first ``bs``, targets the last
``bs``), so consecutive blocks share one token and every training token is a target exactly once
per epoch.

Blocks are visited in one endless sequence: epoch ``e`` is ``default_rng([seed, e]).permutation(n)``,
and the epochs follow each other (a batch may straddle two). The stream's position is the
number of blocks all ranks together have consumed; step ``k`` of rank ``r`` of ``W`` takes
positions ``k*B*W + r*B ... k*B*W + r*B + B - 1``, so ranks never share a block within an epoch
and a run can resume from the position with any number of ranks.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from headwise.data.batch import Batch, BatchStream
from headwise.errors import HeadwiseError


def num_blocks(num_tokens: int, block_size: int) -> int:
    """How many packed blocks of ``block_size + 1`` tokens ``num_tokens`` tokens give."""
    return max(0, (num_tokens - 1) // block_size)


def gather_blocks(tokens: np.ndarray, blocks: np.ndarray, block_size: int) -> Batch:
    """The batch made of the given block indices: int64 inputs and targets ``[len(blocks), bs]``."""
    index = np.asarray(blocks, dtype=np.int64)[:, None] * block_size + np.arange(block_size + 1)
    rows = torch.from_numpy(np.asarray(tokens[index], dtype=np.int64))
    return Batch(inputs=rows[:, :-1].contiguous(), targets=rows[:, 1:].contiguous())


class PackedStream(BatchStream):
    """Endless seeded batches of packed blocks for one data-parallel rank."""

    def __init__(
        self, tokens: np.ndarray, block_size: int, micro_batch: int, seed: int, rank: int = 0, world_size: int = 1
    ) -> None:
        if block_size < 1 or micro_batch < 1:
            raise HeadwiseError(f"block_size ({block_size}) and micro_batch ({micro_batch}) must be at least 1")
        if not 0 <= rank < world_size:
            raise HeadwiseError(f"rank {rank} is outside 0..{world_size - 1} (world_size {world_size})")
        self.n_blocks = num_blocks(len(tokens), block_size)
        if self.n_blocks == 0:
            raise HeadwiseError(
                f"the training data has {len(tokens)} tokens, fewer than one block of block_size + 1 = {block_size + 1}"
            )
        self.tokens = tokens
        self.block_size = block_size
        self.micro_batch = micro_batch
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.position = 0
        self._orders: dict[int, np.ndarray] = {}

    @property
    def epoch(self) -> float:
        return self.position / self.n_blocks

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            # Keep at most the two epochs a batch can touch.
            self._orders = {e: o for e, o in self._orders.items() if e >= epoch - 1}
            self._orders[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.n_blocks)
        return self._orders[epoch]

    def block_indices(self, position: int) -> np.ndarray:
        """The block indices this rank reads for the step starting at global ``position``."""
        positions = position + self.rank * self.micro_batch + np.arange(self.micro_batch)
        epochs, offsets = np.divmod(positions, self.n_blocks)
        return np.array([self._order(int(e))[o] for e, o in zip(epochs, offsets)], dtype=np.int64)

    def __next__(self) -> Batch:
        batch = gather_blocks(self.tokens, self.block_indices(self.position), self.block_size)
        self.position += self.micro_batch * self.world_size
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": "packed",
            "position": self.position,
            "seed": self.seed,
            "n_blocks": self.n_blocks,
            "block_size": self.block_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != "packed":
            raise HeadwiseError(f"the saved data position is for a {state.get('kind')!r} stream, not a packed one")
        if (state["n_blocks"], state["block_size"]) != (self.n_blocks, self.block_size):
            raise HeadwiseError(
                f"the saved data position is for {state['n_blocks']} blocks of {state['block_size']} tokens, "
                f"but this data has {self.n_blocks} blocks of {self.block_size}: "
                "resume with the same data and block_size"
            )
        self.seed = int(state["seed"])
        self.position = int(state["position"])
        self._orders = {}
