"""Long Range Arena data: each task's files read into integer token sequences and labels.

This module holds the ``load_lra`` dispatch and the ListOps, Text and Retrieval
readers; the pixel-sequence tasks live in :mod:`headwise.families.lra.pixels`, the task table in
:mod:`headwise.families.lra.table` and the types both build on in
:mod:`headwise.families.lra.sequences`.

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
original order). With ``splits="lra"`` they are made as LRA's own pipelines make them instead:
IMDb's test split is its validation split too (lra_benchmarks/text_classification/input_pipeline.py),
and image sources validate on the last 10% of training (:func:`~headwise.families.lra.sequences.split_val`).
Bad input fails with one HeadwiseError line saying what is wrong.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from headwise.data.sources import read_parquet, visible_files
from headwise.errors import HeadwiseError
from headwise.families.lra import listops as lo
from headwise.families.lra.pixels import fashion, image, pathfinder
from headwise.families.lra.sequences import (
    GRAYSCALES, SPLIT_RULES, LRAData, ReadOptions, SequenceSplit, check_fits, check_labels, local_source, lra_data, pack,
    split_val, token_dtype,
)
from headwise.families.lra.table import TASKS, VAL_FRACTION, check_task

LISTOPS_FILES = {"train": "basic_train.tsv", "val": "basic_val.tsv", "test": "basic_test.tsv"}
AAN_FILES = {"train": "new_aan_pairs.train.tsv", "val": "new_aan_pairs.eval.tsv", "test": "new_aan_pairs.test.tsv"}

_SPLIT_FILE = re.compile(r"^(train|test|validation|valid|val|unsupervised)(?:[-_.]|$)", re.IGNORECASE)


def load_lra(task: str, source: str | Path | None = None, max_length: int | None = None,
             listops: dict[str, Any] | None = None, val_fraction: float = VAL_FRACTION, seed: int = 0,
             status: Callable[[str], None] | None = None, *, splits: str = "carved",
             grayscale: str = "pillow") -> LRAData:
    """All three splits of ``task`` from ``source`` (default the task's ``source`` in :data:`~headwise.families.lra.table.TASKS`): a path, a
    name under ``HEADWISE_DATA``, a hub name (text, image, pathfinder), or ``generate`` (listops).
    ``max_length`` defaults to the task's ``max_length`` there (generated ListOps: its ``max_length``;
    images: their pixel count); text and retrieval are truncated to it, other tasks must fit it.
    ``val_fraction`` and ``seed`` carve a validation split where the source has none; ``splits``
    ("carved" or "lra") and ``grayscale`` ("pillow" or "tf", for RGB images) choose headwise's or
    LRA's way (see the module docstring)."""
    check_task(task)
    if splits not in SPLIT_RULES:
        raise HeadwiseError(f"splits must be one of {', '.join(SPLIT_RULES)}, not {splits!r}")
    if grayscale not in GRAYSCALES:
        raise HeadwiseError(f"grayscale must be one of {', '.join(GRAYSCALES)}, not {grayscale!r}")
    source = str(TASKS[task].source if source is None else source)
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1):
        raise HeadwiseError(f"max_length must be a positive whole number of tokens, not {max_length!r}")
    if isinstance(val_fraction, bool) or not (isinstance(val_fraction, (int, float)) and 0 < val_fraction < 1):
        raise HeadwiseError(f"val_fraction must be between 0 and 1 (exclusive), not {val_fraction!r}")
    if listops is not None and (task != "listops" or source != "generate"):
        raise HeadwiseError("a listops config applies to task listops with source 'generate' only: drop it")
    say = status or (lambda _: None)
    readers = {"listops": _listops, "text": _text, "retrieval": _retrieval, "image": image,
               "pathfinder": pathfinder, "fashion-mnist": fashion}
    return readers[task](source, max_length, listops, ReadOptions(val_fraction, seed, splits, grayscale), say)


def _bytes_ids(text: str, max_length: int) -> np.ndarray:
    """UTF-8 bytes + 1, cut to ``max_length`` bytes."""
    return np.frombuffer(text.encode("utf-8")[:max_length], dtype=np.uint8).astype(np.uint16) + 1


# --- ListOps -----------------------------------------------------------------------------------


def _listops(source: str, max_length: int | None, cfg: dict[str, Any] | None, _opts: ReadOptions,
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
        folder = local_source(source, "ListOps", "'generate' or a folder with " + ", ".join(LISTOPS_FILES.values()), False)
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
        limit = max_length if max_length is not None else TASKS["listops"].max_length
        desc = f"ListOps from {folder}"
        hint = "raise max_length"
    splits = {}
    for split, samples in rows.items():
        tokens, offsets = pack([lo.to_ids(t) for t, _ in samples], dtype)
        part = SequenceSplit(tokens, offsets, np.array([label for _, label in samples], dtype=np.int64))
        check_fits(part.lengths(), limit, f"{desc} {split}", hint)
        splits[split] = part
    return lra_data("listops", splits, limit, desc, [])


# --- Text (IMDb) -------------------------------------------------------------------------------


def _text(source: str, max_length: int | None, _cfg: Any, opts: ReadOptions, say: Callable[[str], None]) -> LRAData:
    limit = max_length if max_length is not None else TASKS["text"].max_length
    path = local_source(source, "IMDb", "a hub name like stanfordnlp/imdb or a folder of train-*/test-* parquet or jsonl "
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
        check_labels(labels, 2, where)
        splits[split] = SequenceSplit(tokens, offsets, labels)
    if opts.splits == "lra":
        # LRA validates IMDb on its test split (it has no other; text_classification/input_pipeline.py)
        splits["val"] = splits["test"]
        notes.append("val is the test split (LRA's)")
    elif "val" not in splits:
        splits["train"], splits["val"], note = split_val(splits["train"], opts, desc)
        notes.append(note)
    notes.append(f"truncated to {limit:,} bytes")
    return lra_data("text", splits, limit, desc, notes)


def _int_labels(labels: Sequence[Any], where: str) -> np.ndarray:
    out = np.empty(len(labels), dtype=np.int64)
    for i, v in enumerate(labels):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise HeadwiseError(f"{where} row {i}: the label {v!r} is not a whole number")
        out[i] = v
    return out


def _hub_text(name: str) -> dict[str, tuple[list[str], list[Any], str]]:
    import datasets

    from headwise.data.sources import hub_call, hub_offline, hub_reachable

    if hub_offline() or not hub_reachable():
        raise HeadwiseError(
            f"cannot reach the Hugging Face hub to load {name!r} (offline?); give a local folder of "
            "train-*/test-* parquet or jsonl files with text and label, as a path or a name under HEADWISE_DATA"
        )
    dd = hub_call(name, datasets.load_dataset)
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
    shards: dict[str, list[Path]] = {}
    for p in [root] if root.is_file() else visible_files(root):
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

    names = read_parquet(path, pq.read_schema).names
    if "text" not in names or "label" not in names:
        raise HeadwiseError(f"{path} needs columns text and label; it has {', '.join(names)}")
    table = read_parquet(path, pq.read_table, columns=["text", "label"])
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


def _retrieval(source: str, max_length: int | None, _cfg: Any, _opts: ReadOptions,
               say: Callable[[str], None]) -> LRAData:
    limit = max_length if max_length is not None else TASKS["retrieval"].max_length
    expected = "a folder with " + ", ".join(AAN_FILES.values()) + " (the LRA release's tsv_data)"
    folder = local_source(source, "AAN retrieval", expected, False)
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
    return lra_data("retrieval", splits, limit, f"AAN retrieval pairs from {folder}", [f"each document truncated to {limit:,} bytes"])


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
