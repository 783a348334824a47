"""Sequence caches: a Long Range Arena task's token sequences read once, reused while the request
is the same.

A cache is a folder ``<cache_dir>/lra-<task>-<source>-<key>/`` holding, per split (``train``,
``val``, ``test``):

- ``<split>-tokens.u8`` or ``.u16``: every sequence's ids back to back (uint8 when the vocabulary
  fits 256 ids, else uint16; 0 is padding and never stored)
- ``<split>-offsets.i64``: int64, ``count + 1`` entries: sequence ``i`` is
  ``tokens[offsets[i]:offsets[i + 1]]``
- ``<split>-labels.i64``: int64 labels
- for pairs (retrieval) also ``<split>-tokens2.u16`` and ``<split>-offsets2.i64``, the second documents

and ``meta.json``: the request (task, source identity, max_length, ListOps config, validation
carving), counts, vocab_size, num_classes, max_length, the pairs flag, a description and each
file's size and sha256. ``key`` is a hash of the request. A cache is built, opened and refused as
every cache is (:mod:`headwise.data.cache_files`); opening it checks the format, the request, every
file's size and (``verify``) sha256, the offsets and the label and id ranges.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from headwise.data.cache_files import (
    META, CacheFolder, Invalid, Status, build_in_temporary, cache_root, check_file, listing_identity, meta_field,
    request_key, slug,
)
from headwise.data.cache_files import write_array as _write
from headwise.data.sources import HUB_NAME, find_local, visible_files
from headwise.errors import HeadwiseError
from headwise.families.lra import listops as lo
from headwise.families.lra.readers import load_lra
from headwise.families.lra.sequences import LRAData, token_dtype
from headwise.families.lra.table import SPLITS, TASKS, VAL_FRACTION, check_task

_INDEX_DTYPE = np.dtype("<i8")
_PARTS = ("tokens", "offsets", "labels", "tokens2", "offsets2")


@dataclass
class SequenceCache(CacheFolder):
    """An opened, checked sequence cache."""

    KIND = "sequences"
    WHAT = "sequence cache"
    BUILT_FROM = "task, source files, max_length or settings"

    task = meta_field(str, "task")
    vocab_size = meta_field(int, "vocab_size", "Ids are ``1..vocab_size - 1``; 0 is padding.")
    num_classes = meta_field(int, "num_classes")
    max_length = meta_field(int, "max_length", "No sequence (nor second document) is longer.")
    pairs = meta_field(bool, "pairs", "Whether examples are pairs of documents (retrieval).")
    dtype = meta_field(np.dtype, "dtype")
    description = meta_field(str, "description")

    def num_examples(self, split: str) -> int:
        return int(self._split(split)["count"])

    def _split(self, split: str) -> dict[str, Any]:
        if split not in SPLITS:
            raise HeadwiseError(f"unknown split {split!r}: use one of {', '.join(SPLITS)}")
        return self.meta["splits"][split]

    def _array(self, split: str, part: str) -> np.ndarray:
        info = self._split(split)[part]
        dtype = _INDEX_DTYPE if part.startswith(("offsets", "labels")) else self.dtype
        size = int(info["bytes"]) // dtype.itemsize
        if size == 0:
            return np.zeros(0, dtype=dtype)
        return np.memmap(self.path / info["file"], dtype=dtype, mode="r", shape=(size,))

    def tokens(self, split: str, second: bool = False) -> np.ndarray:
        """All ids of ``split`` back to back (a read-only memory map); ``second``: the second documents."""
        return self._array(split, "tokens2" if second else "tokens")

    def offsets(self, split: str, second: bool = False) -> np.ndarray:
        """int64 ``count + 1`` offsets into :meth:`tokens`."""
        return self._array(split, "offsets2" if second else "offsets")

    def labels(self, split: str) -> np.ndarray:
        return np.asarray(self._array(split, "labels"))

    def lengths(self, split: str, second: bool = False) -> np.ndarray:
        """Each sequence's length (int64)."""
        return np.diff(np.asarray(self.offsets(split, second)))

    def sequence(self, split: str, i: int) -> np.ndarray:
        """Sequence ``i`` of ``split`` (the first document of a pair)."""
        off = self.offsets(split)
        return np.asarray(self.tokens(split)[off[i]:off[i + 1]])

    def pair(self, split: str, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Both documents of pair ``i`` (retrieval caches only)."""
        if not self.pairs:
            raise HeadwiseError(f"the {self.task} cache holds single sequences, not pairs: use sequence()")
        off2 = self.offsets(split, second=True)
        return self.sequence(split, i), np.asarray(self.tokens(split, second=True)[off2[i]:off2[i + 1]])

    def summary(self) -> dict[str, Any]:
        """What ``headwise data info`` and ``list`` show of the cache."""
        return {
            "cache": str(self.path),
            "data": self.description,
            "classes": self.num_classes,
            "vocab_size": self.vocab_size,
            "max_length": self.max_length,
            "pairs": self.pairs,
            "train_examples": self.num_examples("train"),
            "test_examples": self.num_examples("test"),
        }

    def headline(self) -> str:
        """The cache in one line (``headwise data list``)."""
        return (f"{self.num_examples('train'):,} train sequences of up to {self.max_length:,} tokens, "
                f"{self.num_classes} classes")

    @classmethod
    def checked(cls, path: Path, meta: dict[str, Any], verify: bool, invalid: Invalid) -> "SequenceCache":
        """The cache once its dtype, files, offsets, ids and labels pass the checks."""
        if meta["dtype"] not in ("uint8", "uint16") or meta["dtype"] != token_dtype(int(meta["vocab_size"])).name:
            raise invalid(f"{META} records dtype {meta['dtype']!r} for vocab_size {meta['vocab_size']} (damaged)")
        cache = cls(path=path, meta=meta)
        for split in SPLITS:
            cache._check_split(split, verify, invalid)
        return cache

    def _check_split(self, split: str, verify: bool, invalid: Invalid) -> None:
        info = self.meta["splits"][split]
        n = int(info["count"])
        entries = {"offsets": n + 1, "offsets2": n + 1, "labels": n}  # int64 each; tokens: as recorded
        for part in _PARTS if self.pairs else _PARTS[:3]:
            expected = entries.get(part)
            check_file(self.path, info[part], None if expected is None else expected * _INDEX_DTYPE.itemsize,
                       verify, invalid)
        for second in ((False, True) if self.pairs else (False,)):
            off = np.asarray(self.offsets(split, second))
            tokens = self.tokens(split, second)
            lengths = np.diff(off)
            if off[0] != 0 or off[-1] != len(tokens) or (lengths < 0).any():
                raise invalid(f"{split} offsets do not index its {len(tokens):,} tokens (damaged)")
            if len(lengths) and lengths.max() > self.max_length:
                raise invalid(f"{split} holds a sequence of {int(lengths.max()):,} tokens, over max_length {self.max_length:,}")
            if verify and len(tokens) and (int(tokens.min()) == 0 or int(tokens.max()) >= self.vocab_size):
                raise invalid(f"{split} holds ids outside 1..{self.vocab_size - 1} (damaged)")
        labels = self.labels(split)
        if len(labels) and (labels.min() < 0 or labels.max() >= self.num_classes):
            raise invalid(f"{split} labels reach {int(labels.max())} with {self.num_classes} classes (damaged)")


def source_identity(task: str, source: str) -> dict[str, Any]:
    """What identifies a source for cache keys: ``generate``; a hub name; or a local path with each
    file's size and mtime (a digest of them past 64 files)."""
    if task == "listops" and source == "generate":
        return {"format": "generate"}
    local = find_local(source)
    if local is None:
        if HUB_NAME.fullmatch(source):
            return {"format": "hub", "name": source}
        return {"format": "missing", "name": source}  # load_lra refuses it with the right words
    return listing_identity("local", local, [local] if local.is_file() else visible_files(local))


def sequence_request(task: str, source: str | None = None, max_length: int | None = None,
                     listops: dict[str, Any] | None = None, val_fraction: float = VAL_FRACTION,
                     seed: int = 0, splits: str = "carved", grayscale: str = "pillow") -> dict[str, Any]:
    """The request that keys a cache (a generated ListOps request holds its full config; ``splits``
    and ``grayscale`` appear only when they are not the defaults, so older caches keep their keys)."""
    check_task(task)
    source = str(TASKS[task].source if source is None else source)
    cfg = lo.listops_config(**listops) if task == "listops" and source == "generate" else None
    if listops is not None and cfg is None:
        raise HeadwiseError("a listops config applies to task listops with source 'generate' only: drop it")
    request = {
        "kind": SequenceCache.KIND, "format": SequenceCache.FORMAT, "task": task,
        "source": source_identity(task, source), "max_length": max_length, "listops": cfg,
        "val_fraction": val_fraction, "seed": seed,
    }
    for key, value, default in (("splits", splits, "carved"), ("grayscale", grayscale, "pillow")):
        if value != default:
            request[key] = value
    return request


def cache_name(request: dict[str, Any]) -> str:
    """The folder name of a request's cache: readable prefix plus the request's key."""
    source = request["source"]
    if source["format"] == "local":
        base = Path(source["path"]).name
    else:
        base = source.get("name", source["format"]).replace("/", "--")
    if request["listops"] is not None:
        base += f"-{request['listops']['min_length']}-{request['listops']['max_length']}"
    return f"lra-{request['task']}-{slug(base)}-{request_key(request)}"


def prepare_sequences(
    task: str,
    source: str | Path | None = None,
    max_length: int | None = None,
    listops: dict[str, Any] | None = None,
    cache_dir: str | Path | None = None,
    rebuild: bool = False,
    progress: bool = False,
    val_fraction: float = VAL_FRACTION,
    seed: int = 0,
    splits: str = "carved",
    grayscale: str = "pillow",
) -> SequenceCache:
    """Read ``task``'s data (see :func:`headwise.families.lra.readers.load_lra`) into a cache, or reuse the
    cache of the same request. ``listops`` configures the generator (``variant`` "standard" or
    "short" plus overrides, see :func:`headwise.families.lra.listops.listops_config`); ``splits`` and
    ``grayscale`` choose headwise's or LRA's way of making the splits and the gray pixels; ``cache_dir``
    defaults to ``default_cache_dir()``. A valid cache is reused unless ``rebuild``; an unusable
    one is refused with its reason unless ``rebuild``."""
    source = str(TASKS[check_task(task)].source if source is None else source)
    request = sequence_request(task, source, max_length, listops, val_fraction, seed, splits, grayscale)
    final = cache_root(cache_dir) / cache_name(request)
    if (cache := SequenceCache.existing(final, request, rebuild)) is not None:
        return cache
    started = time.perf_counter()
    with Status(progress, f"reading LRA {task} ({source})") as status:
        data = load_lra(task, source, max_length, listops, val_fraction, seed, status=status.update, splits=splits,
                        grayscale=grayscale)
    build_in_temporary(final, lambda tmp: _build(data, request, tmp, time.perf_counter() - started), rebuild)
    return SequenceCache.open(final, request)


def _build(data: LRAData, request: dict[str, Any], tmp: Path, seconds: float) -> None:
    dtype = token_dtype(data.vocab_size)
    suffix = f"u{dtype.itemsize * 8}"
    splits: dict[str, Any] = {}
    for split in SPLITS:
        part = data.splits[split]
        info: dict[str, Any] = {
            "count": len(part),
            "tokens_total": int(part.offsets[-1]),
            "tokens": _write(tmp / f"{split}-tokens.{suffix}", part.tokens.astype(dtype, copy=False)),
            "offsets": _write(tmp / f"{split}-offsets.i64", part.offsets.astype(_INDEX_DTYPE, copy=False)),
            "labels": _write(tmp / f"{split}-labels.i64", part.labels.astype(_INDEX_DTYPE, copy=False)),
            "class_counts": np.bincount(part.labels, minlength=data.num_classes).tolist(),
            "max_length_found": int(part.lengths().max()) if len(part) else 0,
        }
        if data.pairs:
            assert part.tokens2 is not None and part.offsets2 is not None
            info["tokens2"] = _write(tmp / f"{split}-tokens2.{suffix}", part.tokens2.astype(dtype, copy=False))
            info["offsets2"] = _write(tmp / f"{split}-offsets2.i64", part.offsets2.astype(_INDEX_DTYPE, copy=False))
        splits[split] = info
    SequenceCache.write_meta(tmp, request, {
        "task": data.task, "description": data.description, "vocab_size": data.vocab_size,
        "num_classes": data.num_classes, "max_length": data.max_length, "pairs": data.pairs, "dtype": dtype.name,
        "splits": splits,
    }, seconds)

