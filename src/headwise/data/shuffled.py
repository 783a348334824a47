"""Choosing and ordering stored examples: evenly spaced subsets, and streams of training batches
over a finite set of examples, reshuffled every epoch.

:class:`EpochStream` is the order every such stream reads in: example order is a permutation of
``0..n-1`` per epoch from ``default_rng([seed, epoch])``, the epochs follow each other (a batch
may straddle two), and each data-parallel rank reads its own share of every global batch (rank r
takes positions ``r * micro_batch`` onwards of the step's ``micro_batch * world_size``), so ranks
never share an example within an epoch and a run can resume from the position with any number of
ranks. :class:`ShuffledStream` reads stored examples in it (images, LRA sequences, GLUE pairs):
the task turns indices into a batch, given a generator seeded by ``(seed, rank, position)`` for
any randomness of its own (augmentation), so a restored stream continues with the same batches.
Packed text blocks are read in the same order (:class:`headwise.text.packing.PackedStream`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from headwise.data.batch import Batch, BatchStream
from headwise.errors import HeadwiseError

#: builds the batch of the given example indices, drawing from the generator
MakeBatch = Callable[[np.ndarray, torch.Generator], Batch]


def evenly_spaced(available: int, wanted: int | None) -> np.ndarray:
    """``wanted`` indices spread evenly over ``0..available-1`` (all of them for None or more):
    a subset that covers the whole split and keeps the balance of data stored class by class."""
    if wanted is None or wanted >= available:
        return np.arange(available, dtype=np.int64)
    return np.linspace(0, available - 1, wanted).round().astype(np.int64)


def hash_seed(*parts: int) -> int:
    """One generator seed from several non-negative integers (numpy's seed sequence mixes them)."""
    return int(np.random.default_rng(list(parts)).integers(2**63))


class EpochStream(BatchStream):
    """The seeded epoch order of ``n`` examples for one data-parallel rank (see the module doc);
    ``span`` positions make an epoch (``n``, or fewer when an epoch ends at its last whole global
    batch). Subclasses make the batches and save the position."""

    def __init__(self, n: int, span: int, micro_batch: int, seed: int, rank: int, world_size: int) -> None:
        self.n, self.span = n, span
        self.micro_batch, self.seed, self.rank, self.world_size = micro_batch, seed, rank, world_size
        self.position = 0
        self._orders: dict[int, np.ndarray] = {}

    @property
    def epoch(self) -> float:
        return self.position / self.span

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            # Keep at most the two epochs a batch can touch.
            self._orders = {e: o for e, o in self._orders.items() if e >= epoch - 1}
            self._orders[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.n)
        return self._orders[epoch]

    def indices(self, position: int) -> np.ndarray:
        """The examples this rank reads for the step starting at global ``position``."""
        positions = position + self.rank * self.micro_batch + np.arange(self.micro_batch)
        epochs, offsets = np.divmod(positions, self.span)
        return np.array([self._order(int(e))[o] for e, o in zip(epochs, offsets)], dtype=np.int64)

    def take_step(self) -> int:
        """The global position of the next step, the stream moved past it (all ranks' batches)."""
        position = self.position
        self.position += self.micro_batch * self.world_size
        return position

    def restore(self, seed: int, position: int) -> None:
        """Continue from a saved seed and position (after the subclass checked the state is its own)."""
        self.seed, self.position, self._orders = int(seed), int(position), {}


class ShuffledStream(EpochStream):
    """Endless seeded batches of ``n`` examples for one data-parallel rank; ``kind`` names the
    task's examples in its saved position (a position is refused by a stream of another kind or
    size). With ``drop_last`` every epoch ends at its last whole global batch (a ``DataLoader``'s
    ``drop_last=True``); without it, a batch that reaches the end of an epoch goes on into the next."""

    def __init__(self, n: int, make_batch: MakeBatch, micro_batch: int, seed: int, rank: int = 0,
                 world_size: int = 1, kind: str = "examples", drop_last: bool = False) -> None:
        if n < 1:
            raise HeadwiseError(f"the training split holds no {kind}")
        if micro_batch < 1 or not 0 <= rank < world_size:
            raise HeadwiseError(f"micro_batch must be >= 1 and rank in 0..{world_size - 1} (got {micro_batch}, {rank})")
        step = micro_batch * world_size
        if drop_last and n < step:
            raise HeadwiseError(f"the training split has {n} {kind}, fewer than one batch of {step}: "
                                "lower train.micro_batch")
        super().__init__(n, n // step * step if drop_last else n, micro_batch, seed, rank, world_size)
        self.make_batch, self.kind = make_batch, kind

    def __next__(self) -> Batch:
        position = self.take_step()
        generator = torch.Generator().manual_seed(hash_seed(self.seed, self.rank, position))
        return self.make_batch(self.indices(position), generator)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "position": self.position, "seed": self.seed, "n": self.n}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != self.kind:
            raise HeadwiseError(f"the saved data position is for a {state.get('kind')!r} stream, not a {self.kind!r} one")
        n = state.get("n", state.get("n_images"))
        if n != self.n:
            raise HeadwiseError(
                f"the saved data position is for {n} training {self.kind}, but this data has {self.n}: "
                "resume with the same data and the same number of training examples"
            )
        self.restore(state["seed"], state["position"])
