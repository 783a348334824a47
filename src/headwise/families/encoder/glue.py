"""The GLUE tasks as data, and a reader for their splits in the layout of ``nyu-mll/glue`` on the hub.

The table (:data:`TASKS`) gives each task's text columns (one sentence or a pair), its label
column, its number of outputs (STS-B is a regression with one output), the metrics the GLUE
evaluation reports for it (:mod:`headwise.families.encoder.metrics`) and its splits. WNLI and the
test-only AX are left out, as Crammed BERT's GLUE evaluation leaves them out
(cramming ``config/eval/GLUE_sane.yaml``).

A local GLUE folder holds one parquet file per task and split, as the hub's ``nyu-mll/glue`` does::

    <root>/<task>/<split>-00000-of-00001.parquet        e.g. glue/mnli/validation_matched-00000-of-00001.parquet

(a split written in several shards is ``<split>-00000-of-00003.parquet`` ... ``-00002-of-00003``).
Columns: the task's text columns (strings), ``label`` (int64 class ids; STS-B a float32 similarity
from 0 to 5) and ``idx`` (int32; numbered from 0 where a file lacks it). Test splits hide their
labels as ``-1``. Bad input fails with one HeadwiseError line saying what is wrong and how to fix it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from headwise.data.sources import HUB_NAME, data_root, find_local, first_line, hub_call
from headwise.errors import HeadwiseError

#: the label of every example in a test split: GLUE does not publish test labels
HIDDEN_LABEL = -1
#: the range of STS-B's similarity scores
STSB_RANGE = (0.0, 5.0)
LABEL_COLUMN = "label"
IDX_COLUMN = "idx"
_SPLITS = ("train", "validation", "test")


@dataclass(frozen=True)
class GlueTask:
    """One GLUE task: where its inputs and labels are and how it is scored."""

    name: str
    #: the text columns, one (single sentence) or two (a pair, in the order they are joined)
    text_columns: tuple[str, ...]
    #: the model's outputs: the number of classes, or 1 for a regression (STS-B)
    num_labels: int
    #: the class names by id (empty for a regression)
    label_names: tuple[str, ...]
    #: the metric names of :func:`headwise.families.encoder.metrics.task_metrics` for this task
    metrics: tuple[str, ...]
    splits: tuple[str, ...] = _SPLITS
    label_column: str = LABEL_COLUMN

    @property
    def regression(self) -> bool:
        return self.num_labels == 1


# Columns and class names: the nyu-mll/glue dataset card; metric names as the GLUE metric of
# Hugging Face ``evaluate`` reports them (cramming's eval.py scores with it).
TASKS: dict[str, GlueTask] = {t.name: t for t in (
    GlueTask("cola", ("sentence",), 2, ("unacceptable", "acceptable"), ("matthews_correlation",)),
    GlueTask("sst2", ("sentence",), 2, ("negative", "positive"), ("accuracy",)),
    GlueTask("mrpc", ("sentence1", "sentence2"), 2, ("not_equivalent", "equivalent"), ("accuracy", "f1")),
    GlueTask("qqp", ("question1", "question2"), 2, ("not_duplicate", "duplicate"), ("accuracy", "f1")),
    GlueTask("stsb", ("sentence1", "sentence2"), 1, (), ("pearson", "spearmanr")),
    GlueTask("mnli", ("premise", "hypothesis"), 3, ("entailment", "neutral", "contradiction"), ("accuracy",),
             splits=("train", "validation_matched", "validation_mismatched", "test_matched", "test_mismatched")),
    GlueTask("qnli", ("question", "sentence"), 2, ("entailment", "not_entailment"), ("accuracy",)),
    GlueTask("rte", ("sentence1", "sentence2"), 2, ("entailment", "not_entailment"), ("accuracy",)),
)}


@dataclass(frozen=True)
class Examples:
    """Labelled examples of any source (a GLUE split, an offline stand-in): one list of texts per
    text column (one, or a pair), and their labels."""

    texts: tuple[list[str], ...]
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)


@dataclass(frozen=True)
class GlueSplit:
    """One split of a GLUE task, its columns as read."""

    task: str
    split: str
    #: one list of strings per text column of the task, in the table's order
    texts: tuple[list[str], ...]
    #: int64 class ids (float32 similarities for STS-B); all ``-1`` in a test split
    labels: np.ndarray
    #: int32 example ids (GLUE's ``idx``)
    idx: np.ndarray
    #: the files (or hub name) the split came from
    origin: str

    def __len__(self) -> int:
        return len(self.labels)


def glue_task(name: str) -> GlueTask:
    """The table entry of task ``name``; a one-line error naming the known tasks otherwise."""
    task = TASKS.get(name)
    if task is None:
        raise HeadwiseError(f"unknown GLUE task {name!r}: use one of {', '.join(TASKS)}")
    return task


def read_glue(task: str, source: str | Path, split: str) -> GlueSplit:
    """Split ``split`` of GLUE task ``task`` from ``source``: a folder in ``nyu-mll/glue``'s layout
    (see the module docstring; as a path, or a name under ``HEADWISE_DATA``), or a hub dataset name
    such as ``nyu-mll/glue`` (read through ``datasets``, which needs the network or its cache)."""
    spec = glue_task(task)
    if split not in spec.splits:
        raise HeadwiseError(f"GLUE task {task} has no split {split!r}: use one of {', '.join(spec.splits)}")
    root = find_local(str(source))
    if root is None:
        if HUB_NAME.fullmatch(str(source)):
            return _from_hub(spec, str(source), split)
        where = f" or under HEADWISE_DATA={data_root()}" if data_root() else " (HEADWISE_DATA is not set)"
        raise HeadwiseError(f"GLUE source {str(source)!r} not found as a path{where}: give a folder holding "
                            f"<task>/<split>-00000-of-00001.parquet files, or a hub name like nyu-mll/glue")
    if not root.is_dir():
        raise HeadwiseError(f"GLUE source {root} is a file: give the folder that holds "
                            f"{task}/{split}-00000-of-00001.parquet")
    files = _split_files(root, spec, split)
    table = _read_tables(files)
    return _split_from_table(spec, split, table, ", ".join(str(f) for f in files))


def _split_files(root: Path, spec: GlueTask, split: str) -> list[Path]:
    """The shards of one split in ``root/<task>/``, checked to be complete."""
    folder = root / spec.name
    expected = folder / f"{split}-00000-of-00001.parquet"
    shard = re.compile(rf"^{re.escape(split)}-(\d{{5}})-of-(\d{{5}})\.parquet$")
    found = sorted(p for p in folder.glob(f"{split}-*") if shard.match(p.name)) if folder.is_dir() else []
    if not found:
        others = sorted(p.name for p in folder.glob(f"{split}[-.]*")) if folder.is_dir() else []
        seen = f" (found {', '.join(others)}: write the split as parquet)" if others else ""
        raise HeadwiseError(f"GLUE split file {expected} is missing{seen}; lay the folder out as nyu-mll/glue "
                            f"does: <root>/{spec.name}/{split}-00000-of-00001.parquet")
    counts = {int(shard.match(p.name).group(2)) for p in found}
    indices = [int(shard.match(p.name).group(1)) for p in found]
    if len(counts) != 1 or indices != list(range(counts.pop())):
        raise HeadwiseError(f"GLUE split {spec.name}/{split} in {folder} has incomplete or mismatched shards "
                            f"({', '.join(p.name for p in found)}): copy every <split>-NNNNN-of-MMMMM.parquet file")
    return found


def _read_tables(files: list[Path]):
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = []
    for path in files:
        try:
            tables.append(pq.read_table(path))
        except (pa.ArrowException, OSError) as exc:
            raise HeadwiseError(f"{path} is not a readable parquet file ({first_line(exc)}): "
                                "replace it with the split's parquet file from nyu-mll/glue") from None
    try:
        return pa.concat_tables(tables, promote_options="default")
    except pa.ArrowException as exc:
        raise HeadwiseError(f"the shards {', '.join(map(str, files))} have different columns ({first_line(exc)}): "
                            "write every shard of a split with the same columns") from None


def _from_hub(spec: GlueTask, name: str, split: str) -> GlueSplit:
    import datasets

    ds = hub_call(name, datasets.load_dataset, spec.name, split=split)
    return _split_from_table(spec, split, ds.data.table, f"{name} ({spec.name}, {split})")


def _split_from_table(spec: GlueTask, split: str, table, origin: str) -> GlueSplit:
    """Validate an arrow table against the task's table entry and take its columns."""
    import pyarrow as pa

    where = f"GLUE {spec.name}/{split} ({origin})"
    missing = [c for c in (*spec.text_columns, spec.label_column) if c not in table.column_names]
    if missing:
        raise HeadwiseError(f"{where} lacks column(s) {', '.join(missing)} (it has {', '.join(table.column_names)}): "
                            f"{spec.name} needs {', '.join(spec.text_columns)} and {spec.label_column}")
    if table.num_rows == 0:
        raise HeadwiseError(f"{where} has no rows: replace it with the split's file from nyu-mll/glue")
    texts = []
    for col in spec.text_columns:
        column = table.column(col)
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            raise HeadwiseError(f"{where}: text column {col} holds {column.type}, not strings: write the text as strings")
        if column.null_count:
            raise HeadwiseError(f"{where}: text column {col} has {column.null_count} empty (null) value(s): "
                                "fill them with strings (an empty string is allowed)")
        texts.append(column.to_pylist())
    labels = _labels(spec, split, table.column(spec.label_column), where)
    if IDX_COLUMN in table.column_names:
        idx_column = table.column(IDX_COLUMN)
        if not pa.types.is_integer(idx_column.type) or idx_column.null_count:
            raise HeadwiseError(f"{where}: column {IDX_COLUMN} holds {idx_column.type} with "
                                f"{idx_column.null_count} null(s): write integer example ids, or drop the column")
        idx = idx_column.to_numpy().astype(np.int32)
    else:
        idx = np.arange(table.num_rows, dtype=np.int32)
    return GlueSplit(spec.name, split, tuple(texts), labels, idx, origin)


def _labels(spec: GlueTask, split: str, column, where: str) -> np.ndarray:
    """The label column as int64 class ids (float32 for a regression), each checked: a test split
    may hide every label as -1."""
    import pyarrow as pa

    if column.null_count:
        raise HeadwiseError(f"{where}: column {spec.label_column} has {column.null_count} null(s): "
                            f"give every example a label ({HIDDEN_LABEL} in a test split)")
    test = split.startswith("test")
    if spec.regression:
        if not (pa.types.is_floating(column.type) or pa.types.is_integer(column.type)):
            raise HeadwiseError(f"{where}: column {spec.label_column} holds {column.type}: "
                                f"{spec.name} labels are similarity scores (numbers from {STSB_RANGE[0]:g} to {STSB_RANGE[1]:g})")
        labels = column.to_numpy().astype(np.float32)
        lo, hi = STSB_RANGE
        bad = ~np.isfinite(labels) | (labels < lo) | (labels > hi)
        if test:
            bad &= labels != HIDDEN_LABEL
        if bad.any():
            i = int(np.argmax(bad))
            raise HeadwiseError(f"{where}: label {float(labels[i]):g} of row {i} is outside {lo:g}..{hi:g}: "
                                f"{spec.name} similarity scores lie in that range{' (or -1 hidden)' if test else ''}")
        return labels
    if not pa.types.is_integer(column.type):
        raise HeadwiseError(f"{where}: column {spec.label_column} holds {column.type}, not integers: write the class "
                            f"ids 0..{spec.num_labels - 1} ({', '.join(spec.label_names)}) as integers")
    labels = column.to_numpy().astype(np.int64)
    bad = (labels < 0) | (labels >= spec.num_labels)
    if test:
        bad &= labels != HIDDEN_LABEL
    if bad.any():
        i = int(np.argmax(bad))
        hidden = f" or {HIDDEN_LABEL} (hidden)" if test else ""
        raise HeadwiseError(f"{where}: label {int(labels[i])} of row {i} is not a class of {spec.name}: "
                            f"use 0..{spec.num_labels - 1} ({', '.join(spec.label_names)}){hidden}")
    return labels
