"""What every LRA reader produces and shares: split sequences (:class:`SequenceSplit`), a task's
three splits (:class:`LRAData`), packing, the validation carve-out and the checks on labels and
lengths. The readers (:mod:`~headwise.families.lra.readers`, :mod:`~headwise.families.lra.pixels`)
build on this module; it imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from headwise.data.sources import HUB_NAME, data_root, find_local
from headwise.errors import HeadwiseError
from headwise.families.lra.table import SPLITS, TASKS


@dataclass(frozen=True)
class SequenceSplit:
    """One split: sequence ``i`` is ``tokens[offsets[i]:offsets[i + 1]]`` (ids, no padding), its
    label ``labels[i]``; pairs (retrieval) hold the second documents in ``tokens2``/``offsets2``."""

    tokens: np.ndarray
    offsets: np.ndarray
    labels: np.ndarray
    tokens2: np.ndarray | None = None
    offsets2: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def pairs(self) -> bool:
        return self.tokens2 is not None

    def sequence(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i]:self.offsets[i + 1]]

    def pair(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        if self.tokens2 is None or self.offsets2 is None:
            raise HeadwiseError("this split holds single sequences, not pairs")
        return self.sequence(i), self.tokens2[self.offsets2[i]:self.offsets2[i + 1]]

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def take(self, index: np.ndarray) -> "SequenceSplit":
        """The examples at ``index`` (in that order)."""
        tokens, offsets = _gather(self.tokens, self.offsets, index)
        second = _gather(self.tokens2, self.offsets2, index) if self.tokens2 is not None else (None, None)
        return SequenceSplit(tokens, offsets, self.labels[index], *second)


def _gather(tokens: np.ndarray, offsets: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.diff(offsets)[index]
    out_offsets = np.zeros(len(index) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out_offsets[1:])
    all_lengths = np.diff(offsets)
    if len(all_lengths) and all_lengths[0] > 0 and np.all(all_lengths == all_lengths[0]):  # images: one gather
        rows = tokens[offsets[0]:offsets[-1]].reshape(len(all_lengths), int(all_lengths[0]))
        return np.ascontiguousarray(rows[index]).ravel(), out_offsets
    parts = [tokens[offsets[i]:offsets[i + 1]] for i in index]
    return (np.concatenate(parts) if parts else tokens[:0].copy()), out_offsets


def pack(sequences: Sequence[np.ndarray], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Flat ``tokens`` and int64 ``offsets`` (``len + 1``) of a list of id arrays."""
    offsets = np.zeros(len(sequences) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in sequences], out=offsets[1:])
    tokens = np.concatenate(sequences).astype(dtype, copy=False) if sequences else np.zeros(0, dtype=dtype)
    return tokens, offsets


def token_dtype(vocab_size: int) -> np.dtype:
    """uint8 when every id fits (vocab <= 256), else uint16."""
    return np.dtype(np.uint8) if vocab_size <= 256 else np.dtype(np.uint16)


#: how a task's splits are made: "carved" (headwise's: a seeded share of training as validation
#: where the source has none) or "lra" (LRA's own pipelines: IMDb validates on its test split, CIFAR-10
#: and MNIST-like sources keep the first 90% of training and validate on the last 10%)
SPLIT_RULES = ("carved", "lra")
#: RGB to grayscale: Pillow's "L" (rounded ITU-R 601-2) or TensorFlow's ``tf.image.rgb_to_grayscale``
#: (LRA's image pipeline; truncated)
GRAYSCALES = ("pillow", "tf")


@dataclass(frozen=True)
class ReadOptions:
    """How a reader makes its splits and grays its images (see :data:`SPLIT_RULES`, :data:`GRAYSCALES`):
    ``val_fraction`` and ``seed`` are the carving's."""

    val_fraction: float
    seed: int
    splits: str = "carved"
    grayscale: str = "pillow"


@dataclass(frozen=True)
class LRAData:
    """A task's three splits and what a model needs to know about them."""

    task: str
    splits: dict[str, SequenceSplit]
    vocab_size: int
    num_classes: int
    max_length: int
    description: str
    pairs: bool = False
    notes: list[str] = field(default_factory=list)


def local_source(source: str, what: str, expected: str, hub_ok: bool) -> Path | None:
    """The source as a local path; None for a hub name (when ``hub_ok``); else a one-line error."""
    path = find_local(source)
    if path is not None:
        return path
    if hub_ok and HUB_NAME.fullmatch(source):
        return None
    where = f" or under HEADWISE_DATA={data_root()}" if data_root() else " (HEADWISE_DATA is not set)"
    raise HeadwiseError(f"{what} source {source!r} not found as a path{where}; expected {expected}")


def check_labels(labels: np.ndarray, classes: int, where: str) -> None:
    if len(labels) and (labels.min() < 0 or labels.max() >= classes):
        bad = int(labels.max() if labels.max() >= classes else labels.min())
        raise HeadwiseError(f"{where}: label {bad} is outside the {classes} classes (0..{classes - 1})")


def check_fits(lengths: np.ndarray, max_length: int, where: str, hint: str) -> None:
    if len(lengths) and lengths.max() > max_length:
        i = int(lengths.argmax())
        raise HeadwiseError(f"{where}: example {i} has {int(lengths[i]):,} tokens, over max_length {max_length:,}; {hint}")


def carve_val(train: SequenceSplit, fraction: float, seed: int, where: str) -> tuple[SequenceSplit, SequenceSplit]:
    """``(train, val)``: a seeded ``fraction`` of ``train`` (at least one example) as validation."""
    n = len(train)
    if n < 2:
        raise HeadwiseError(f"{where}: the training split has {n} example(s), too few to carve a validation split from")
    n_val = min(n - 1, max(1, int(round(n * fraction))))
    perm = np.random.default_rng(seed).permutation(n)
    return train.take(np.sort(perm[n_val:])), train.take(np.sort(perm[:n_val]))


#: LRA's CIFAR-10 and MNIST validation: ``train[90%:]`` (lra_benchmarks/image/input_pipeline.py)
LRA_TRAIN_SHARE = 0.9


def split_val(train: SequenceSplit, opts: ReadOptions, where: str) -> tuple[SequenceSplit, SequenceSplit, str]:
    """``(train, val, note)`` for a source without a validation split: :func:`carve_val` (``carved``),
    or LRA's cut of the training split in its order, the first 90% kept (``lra``; tfds rounds the
    boundary to the closest example)."""
    if opts.splits == "carved":
        train, val = carve_val(train, opts.val_fraction, opts.seed, where)
        return train, val, f"val carved from train: {len(val):,} examples ({opts.val_fraction:g} of it, seed {opts.seed})"
    n = len(train)
    cut = round(n * LRA_TRAIN_SHARE)
    if cut < 1 or cut >= n:
        raise HeadwiseError(f"{where}: the training split has {n} example(s), too few for LRA's 90% / 10% "
                            "train / validation cut; use more data or task.splits = 'carved'")
    note = f"val is the last {n - cut:,} training examples (LRA's train[90%:])"
    return train.take(np.arange(cut)), train.take(np.arange(cut, n)), note


def lra_data(task: str, splits: dict[str, SequenceSplit], max_length: int, description: str, notes: list[str]) -> LRAData:
    for split in SPLITS:
        part = splits[split]
        if len(part) == 0:
            raise HeadwiseError(f"{description}: the {split} split is empty; check the source")
        check_labels(part.labels, TASKS[task].num_classes, f"{description} {split}")
    counts = " / ".join(f"{len(splits[s]):,}" for s in SPLITS)
    desc = f"{description}: {counts} train / val / test"
    if notes:
        desc += "; " + "; ".join(notes)
    return LRAData(task=task, splits=splits, vocab_size=TASKS[task].vocab_size, num_classes=TASKS[task].num_classes,
                   max_length=max_length, description=desc, pairs=splits["train"].pairs, notes=notes)
