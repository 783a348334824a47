"""Long Range Arena data: each task's files read into integer token sequences and labels.

This module holds the task tables (``TASKS``, vocabularies, classes, default lengths and sources),
the common types (:class:`SequenceSplit`, :class:`LRAData`) and helpers, the ``read_lra`` /
``load_lra`` dispatch, and the ListOps, Text and Retrieval readers; the pixel-sequence tasks live
in :mod:`headwise.families.lra.pixels` (their public names are importable from here too).

Every task maps to ids with **0 reserved for padding**:

- ``listops``: the 10 digits (1-10), ``[MIN [MAX [MED [SM`` (11-14) and ``]`` (15): vocab 16,
  10 classes. Source ``generate`` (:mod:`headwise.families.lra.listops`, configured by a ``listops`` dict)
  or a folder with the LRA release's ``basic_train.tsv``, ``basic_val.tsv``, ``basic_test.tsv``
  (``lra_release/listops-1000``; parentheses dropped, every line parsed).
- ``text``: IMDb reviews as UTF-8 bytes, id = byte + 1 (vocab 257), truncated to ``max_length``
  bytes, 2 classes. Source the hub's ``stanfordnlp/imdb`` or a local folder in its layout:
  ``train-*`` and ``test-*`` parquet files (``plain_text/train-00000-of-00001.parquet``) or jsonl
  files, with ``text`` and ``label`` (``unsupervised-*`` files are ignored).
- ``retrieval``: AAN citation pairs, each document bytes + 1 truncated to ``max_length``, 2 classes.
  Source a folder with the LRA release's ``new_aan_pairs.train.tsv``, ``.eval.tsv`` (our ``val``)
  and ``.test.tsv`` (``lra_release/tsv_data``): no header, tab-separated ``label id1 id2 text1
  text2`` with the label written ``0``/``1`` or ``0.0``/``1.0`` (a header line whose label is not a
  number is skipped).
- ``image`` (CIFAR-10 in grayscale), ``pathfinder`` and ``fashion-mnist`` (its offline stand-in):
  images as pixel tokens, id = pixel + 1 (vocab 257), read by :mod:`headwise.families.lra.pixels`,
  whose docstring gives their sources and layouts.

A source without a validation split (IMDb, CIFAR-10, Fashion-MNIST, hub images) has one carved
from its training split: a seeded ``val_fraction`` of it (the rest stays train, both in their
original order). Bad input fails with one HeadwiseError line saying what is wrong.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from headwise.families.lra import listops as lo
from headwise.data.sources import _HUB_NAME, _first_line, data_root, find_local
from headwise.errors import HeadwiseError

TASKS = ("listops", "text", "retrieval", "image", "pathfinder", "fashion-mnist")
SPLITS = ("train", "val", "test")
VOCAB_SIZE = {"listops": lo.VOCAB_SIZE, "text": 257, "retrieval": 257, "image": 257, "pathfinder": 257,
              "fashion-mnist": 257}
NUM_CLASSES = {"listops": 10, "text": 2, "retrieval": 2, "image": 10, "pathfinder": 2, "fashion-mnist": 10}
#: the lengths of LRA's standard setting (images: their pixel count)
DEFAULT_MAX_LENGTH = {"listops": 2000, "text": 4000, "retrieval": 4000, "image": 1024, "pathfinder": 1024,
                      "fashion-mnist": 784}
DEFAULT_SOURCES = {"listops": "generate", "text": "stanfordnlp/imdb", "retrieval": "aan", "image": "uoft-cs/cifar10",
                   "pathfinder": "pathfinder32", "fashion-mnist": "fashion-mnist"}
#: tasks whose documents are cut to max_length; the others must fit it
TRUNCATED = frozenset({"text", "retrieval"})
LISTOPS_FILES = {"train": "basic_train.tsv", "val": "basic_val.tsv", "test": "basic_test.tsv"}
AAN_FILES = {"train": "new_aan_pairs.train.tsv", "val": "new_aan_pairs.eval.tsv", "test": "new_aan_pairs.test.tsv"}
PATHFINDER_DIFFICULTY = "curv_baseline"
PATHFINDER_FRACTIONS = (0.8, 0.1)  # train, val; the rest is test
VAL_FRACTION = 0.1

_SPLIT_FILE = re.compile(r"^(train|test|validation|valid|val|unsupervised)(?:[-_.]|$)", re.IGNORECASE)


# --- sequences -------------------------------------------------------------------------------


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


def check_task(task: str) -> str:
    if task not in TASKS:
        raise HeadwiseError(f"unknown LRA task {task!r}: use one of {', '.join(TASKS)}")
    return task


def read_lra(task: str, source: str | Path | None = None, max_length: int | None = None, split: str = "train",
             listops: dict[str, Any] | None = None, val_fraction: float = VAL_FRACTION, seed: int = 0) -> SequenceSplit:
    """One split (``train``, ``val`` or ``test``) of a task's data (see :func:`load_lra`)."""
    if split not in SPLITS:
        raise HeadwiseError(f"unknown split {split!r}: use one of {', '.join(SPLITS)}")
    return load_lra(task, source, max_length, listops, val_fraction, seed).splits[split]


def load_lra(task: str, source: str | Path | None = None, max_length: int | None = None,
             listops: dict[str, Any] | None = None, val_fraction: float = VAL_FRACTION, seed: int = 0,
             status: Callable[[str], None] | None = None) -> LRAData:
    """All three splits of ``task`` from ``source`` (default ``DEFAULT_SOURCES[task]``): a path, a
    name under ``HEADWISE_DATA``, a hub name (text, image, pathfinder), or ``generate`` (listops).
    ``max_length`` defaults to ``DEFAULT_MAX_LENGTH`` (generated ListOps: its ``max_length``;
    images: their pixel count); text and retrieval are truncated to it, other tasks must fit it.
    ``val_fraction`` and ``seed`` carve a validation split where the source has none."""
    check_task(task)
    source = str(DEFAULT_SOURCES[task] if source is None else source)
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1):
        raise HeadwiseError(f"max_length must be a positive whole number of tokens, not {max_length!r}")
    if not (isinstance(val_fraction, (int, float)) and 0 < val_fraction < 1):
        raise HeadwiseError(f"val_fraction must be between 0 and 1 (exclusive), not {val_fraction!r}")
    if listops is not None and (task != "listops" or source != "generate"):
        raise HeadwiseError("a listops config applies to task listops with source 'generate' only: drop it")
    say = status or (lambda _: None)
    from headwise.families.lra.pixels import _fashion, _image, _pathfinder

    readers = {"listops": _listops, "text": _text, "retrieval": _retrieval, "image": _image,
               "pathfinder": _pathfinder, "fashion-mnist": _fashion}
    return readers[task](source, max_length, listops, val_fraction, seed, say)


# --- helpers -----------------------------------------------------------------------------------


def _local(source: str, what: str, expected: str, hub_ok: bool) -> Path | None:
    """The source as a local path; None for a hub name (when ``hub_ok``); else a one-line error."""
    path = find_local(source)
    if path is not None:
        return path
    if hub_ok and _HUB_NAME.fullmatch(source):
        return None
    where = f" or under HEADWISE_DATA={data_root()}" if data_root() else " (HEADWISE_DATA is not set)"
    raise HeadwiseError(f"{what} source {source!r} not found as a path{where}; expected {expected}")


def _check_labels(labels: np.ndarray, classes: int, where: str) -> None:
    if len(labels) and (labels.min() < 0 or labels.max() >= classes):
        bad = int(labels.max() if labels.max() >= classes else labels.min())
        raise HeadwiseError(f"{where}: label {bad} is outside the {classes} classes (0..{classes - 1})")


def _check_fits(lengths: np.ndarray, max_length: int, where: str, hint: str) -> None:
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


def _carve_note(fraction: float, seed: int, n_val: int) -> str:
    return f"val carved from train: {n_val:,} examples ({fraction:g} of it, seed {seed})"


def _data(task: str, splits: dict[str, SequenceSplit], max_length: int, description: str, notes: list[str]) -> LRAData:
    for split in SPLITS:
        part = splits[split]
        if len(part) == 0:
            raise HeadwiseError(f"{description}: the {split} split is empty; check the source")
        _check_labels(part.labels, NUM_CLASSES[task], f"{description} {split}")
    counts = " / ".join(f"{len(splits[s]):,}" for s in SPLITS)
    desc = f"{description}: {counts} train / val / test"
    if notes:
        desc += "; " + "; ".join(notes)
    return LRAData(task=task, splits=splits, vocab_size=VOCAB_SIZE[task], num_classes=NUM_CLASSES[task],
                   max_length=max_length, description=desc, pairs=splits["train"].pairs, notes=notes)


def _bytes_ids(text: str, max_length: int) -> np.ndarray:
    """UTF-8 bytes + 1, cut to ``max_length`` bytes."""
    return np.frombuffer(text.encode("utf-8")[:max_length], dtype=np.uint8).astype(np.uint16) + 1


# --- ListOps -----------------------------------------------------------------------------------


def _listops(source: str, max_length: int | None, cfg: dict[str, Any] | None, val_fraction: float, seed: int,
             say: Callable[[str], None]) -> LRAData:
    dtype = token_dtype(lo.VOCAB_SIZE)
    if source == "generate":
        cfg = lo.listops_config(**(cfg or {}))
        say("generating ListOps")
        gen = lo.generate_splits(cfg)
        rows = {"train": gen.train, "val": gen.val, "test": gen.test}
        limit = max_length if max_length is not None else cfg["max_length"]
        desc = (f"ListOps generated (seed {cfg['seed']}, {cfg['min_length']} < length < {cfg['max_length']}, "
                f"max_depth {cfg['max_depth']}, 2-{cfg['max_args']} arguments)")
        hint = "raise max_length to the generator's max_length"
    else:
        folder = _local(source, "ListOps", "'generate' or a folder with " + ", ".join(LISTOPS_FILES.values()), False)
        assert folder is not None
        if not folder.is_dir():
            raise HeadwiseError(f"ListOps source {folder} is a file: give the folder holding {', '.join(LISTOPS_FILES.values())}")
        if not (folder / LISTOPS_FILES["train"]).exists() and (folder / "listops-1000").is_dir():
            folder = folder / "listops-1000"
        rows = {}
        for split, name in LISTOPS_FILES.items():
            if not (folder / name).is_file():
                raise HeadwiseError(
                    f"ListOps folder {folder} lacks {name}: expected {', '.join(LISTOPS_FILES.values())} "
                    "(the LRA release's listops-1000)"
                )
            say(f"reading {name}")
            rows[split] = lo.read_tsv(folder / name)
        limit = max_length if max_length is not None else DEFAULT_MAX_LENGTH["listops"]
        desc = f"ListOps from {folder}"
        hint = "raise max_length"
    splits = {}
    for split, samples in rows.items():
        tokens, offsets = pack([lo.to_ids(t) for t, _ in samples], dtype)
        part = SequenceSplit(tokens, offsets, np.array([label for _, label in samples], dtype=np.int64))
        _check_fits(part.lengths(), limit, f"{desc} {split}", hint)
        splits[split] = part
    return _data("listops", splits, limit, desc, [])


# --- Text (IMDb) -------------------------------------------------------------------------------


def _text(source: str, max_length: int | None, _cfg: Any, val_fraction: float, seed: int,
          say: Callable[[str], None]) -> LRAData:
    limit = max_length if max_length is not None else DEFAULT_MAX_LENGTH["text"]
    path = _local(source, "IMDb", "a hub name like stanfordnlp/imdb or a folder of train-*/test-* parquet or jsonl "
                  "files with text and label", True)
    if path is None:
        say(f"loading {source} from the hub")
        rows = _hub_text(source)
        desc = f"IMDb bytes from {source}"
    else:
        rows = _local_text(path, say)
        desc = f"IMDb bytes from {path}"
    splits, notes = {}, []
    for split, (texts, labels, where) in rows.items():
        for i, t in enumerate(texts):
            if not isinstance(t, str) or not t:
                raise HeadwiseError(f"{where} row {i}: the text is {'empty' if t == '' else repr(t)[:30]}; every review needs text")
        tokens, offsets = pack([_bytes_ids(t, limit) for t in texts], np.dtype(np.uint16))
        labels = _int_labels(labels, where)
        _check_labels(labels, 2, where)
        splits[split] = SequenceSplit(tokens, offsets, labels)
    if "val" not in splits:
        splits["train"], splits["val"] = carve_val(splits["train"], val_fraction, seed, desc)
        notes.append(_carve_note(val_fraction, seed, len(splits["val"])))
    notes.append(f"truncated to {limit:,} bytes")
    return _data("text", splits, limit, desc, notes)


def _int_labels(labels: Sequence[Any], where: str) -> np.ndarray:
    out = np.empty(len(labels), dtype=np.int64)
    for i, v in enumerate(labels):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise HeadwiseError(f"{where} row {i}: the label {v!r} is not a whole number")
        out[i] = v
    return out


def _hub_text(name: str) -> dict[str, tuple[list[str], list[Any], str]]:
    import datasets

    from headwise.data.sources import _hub_call, _hub_offline, hub_reachable

    if _hub_offline() or not hub_reachable():
        raise HeadwiseError(
            f"cannot reach the Hugging Face hub to load {name!r} (offline?); give a local folder of "
            "train-*/test-* parquet or jsonl files with text and label, as a path or a name under HEADWISE_DATA"
        )
    dd = _hub_call(name, datasets.load_dataset)
    if "train" not in dd or "test" not in dd:
        raise HeadwiseError(f"dataset {name!r} needs train and test splits; it has {', '.join(dd)}")
    out = {}
    for split in ("train", "test") + (("validation",) if "validation" in dd else ()):
        cols = dd[split].column_names
        if "text" not in cols or "label" not in cols:
            raise HeadwiseError(f"dataset {name!r} {split} needs columns text and label; it has {', '.join(cols)}")
        out["val" if split == "validation" else split] = (dd[split]["text"], dd[split]["label"], f"dataset {name!r} {split}")
    return out


def _local_text(root: Path, say: Callable[[str], None]) -> dict[str, tuple[list[str], list[Any], str]]:
    files = [root] if root.is_file() else sorted(
        p for p in root.rglob("*") if p.is_file() and p.suffix in (".parquet", ".jsonl")
        and not any(part.startswith(".") for part in p.relative_to(root).parts)
    )
    shards: dict[str, list[Path]] = {}
    for p in files:
        m = _SPLIT_FILE.match(p.name)
        if m is None or p.suffix not in (".parquet", ".jsonl"):
            continue
        split = {"validation": "val", "valid": "val"}.get(m[1].lower(), m[1].lower())
        if split != "unsupervised":
            shards.setdefault(split, []).append(p)
    if "train" not in shards or "test" not in shards:
        found = ", ".join(sorted(shards)) or "none"
        raise HeadwiseError(
            f"IMDb folder {root} needs train-*.parquet and test-*.parquet (or .jsonl) files with text and label; "
            f"found splits: {found}"
        )
    out = {}
    for split, paths in shards.items():
        texts: list[str] = []
        labels: list[Any] = []
        for p in paths:
            say(f"reading {p.name}")
            t, lab = _read_parquet_text(p) if p.suffix == ".parquet" else _read_jsonl_text(p)
            texts += t
            labels += lab
        out[split] = (texts, labels, f"IMDb {split} ({', '.join(p.name for p in paths)})")
    return out


def _read_parquet_text(path: Path) -> tuple[list[str], list[Any]]:
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
    except Exception as exc:
        raise HeadwiseError(f"{path} is not a readable parquet file: {_first_line(exc)}") from None
    if "text" not in names or "label" not in names:
        raise HeadwiseError(f"{path} needs columns text and label; it has {', '.join(names)}")
    try:
        table = pq.read_table(path, columns=["text", "label"])
    except Exception as exc:
        raise HeadwiseError(f"{path} is not a readable parquet file: {_first_line(exc)}") from None
    return table.column("text").to_pylist(), table.column("label").to_pylist()


def _read_jsonl_text(path: Path) -> tuple[list[str], list[Any]]:
    texts, labels = [], []
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise HeadwiseError(f"{path} line {lineno} is not valid JSON") from None
            if not isinstance(obj, dict) or "text" not in obj or "label" not in obj:
                raise HeadwiseError(f"{path} line {lineno} needs an object with text and label")
            texts.append(obj["text"])
            labels.append(obj["label"])
    return texts, labels


# --- Retrieval (AAN) ---------------------------------------------------------------------------


def _retrieval(source: str, max_length: int | None, _cfg: Any, val_fraction: float, seed: int,
               say: Callable[[str], None]) -> LRAData:
    limit = max_length if max_length is not None else DEFAULT_MAX_LENGTH["retrieval"]
    expected = "a folder with " + ", ".join(AAN_FILES.values()) + " (the LRA release's tsv_data)"
    folder = _local(source, "AAN retrieval", expected, False)
    assert folder is not None
    if not folder.is_dir():
        raise HeadwiseError(f"AAN retrieval source {folder} is a file: give {expected}")
    if not (folder / AAN_FILES["train"]).exists() and (folder / "tsv_data").is_dir():
        folder = folder / "tsv_data"
    splits = {}
    for split, name in AAN_FILES.items():
        path = folder / name
        if not path.is_file():
            raise HeadwiseError(f"AAN retrieval folder {folder} lacks {name}: expected {', '.join(AAN_FILES.values())}")
        say(f"reading {name}")
        splits[split] = read_aan(path, limit)
    return _data("retrieval", splits, limit, f"AAN retrieval pairs from {folder}", [f"each document truncated to {limit:,} bytes"])


def read_aan(path: Path, max_length: int) -> SequenceSplit:
    """One AAN TSV (``label id1 id2 text1 text2`` a line) as byte-id pairs cut to ``max_length``."""
    first, second, labels = [], [], []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            line = raw.rstrip(b"\r\n")
            if not line.strip():
                continue
            where = f"AAN file {path} line {lineno}"
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError:
                raise HeadwiseError(f"{where} is not UTF-8 text") from None
            fields = text.split("\t")
            if len(fields) != 5:
                raise HeadwiseError(f"{where}: {len(fields)} tab-separated fields, expected 5 (label, id1, id2, text1, text2)")
            try:
                value = float(fields[0])
            except ValueError:
                if lineno == 1:  # a header line
                    continue
                raise HeadwiseError(f"{where}: the label {fields[0][:20]!r} is not a number") from None
            if value not in (0.0, 1.0):
                raise HeadwiseError(f"{where}: label {fields[0][:20]} is outside the 2 classes (0, 1)")
            first.append(_bytes_ids(fields[3], max_length))
            second.append(_bytes_ids(fields[4], max_length))
            labels.append(int(value))
    for docs, which in ((first, "text1"), (second, "text2")):
        empty = next((i for i, d in enumerate(docs) if len(d) == 0), None)
        if empty is not None:
            raise HeadwiseError(f"AAN file {path}: pair {empty} has an empty {which}; every pair needs two documents")
    tokens, offsets = pack(first, np.dtype(np.uint16))
    tokens2, offsets2 = pack(second, np.dtype(np.uint16))
    return SequenceSplit(tokens, offsets, np.array(labels, dtype=np.int64), tokens2, offsets2)


# --- pixel tasks (headwise.families.lra.pixels) ----------------------------------------------------

_PIXEL_NAMES = frozenset({"grayscale", "pixel_split", "read_pathfinder_metadata"})


def __getattr__(name: str) -> Any:
    """The pixel tasks' public names, from :mod:`headwise.families.lra.pixels` (imported on first use,
    since that module builds on this one)."""
    if name in _PIXEL_NAMES:
        from headwise.families.lra import pixels as lra_pixels

        return getattr(lra_pixels, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
