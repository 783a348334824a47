"""The GLUE task table, its reader on folders in nyu-mll/glue's parquet layout, and the GLUE metrics
checked against hand-worked values; Leaner Transformers' Table 1 columns."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import one_line_error

from headwise.families.encoder.glue import TASKS, read_glue
from headwise.families.encoder.metrics import TABLE1_COLUMNS, task_metrics


def write_split(root: Path, task: str, split: str, columns: dict, schema: dict | None = None,
                name: str | None = None) -> Path:
    """One split as nyu-mll/glue stores it: ``<root>/<task>/<split>-00000-of-00001.parquet``."""
    schema = schema or {}
    arrays = {k: pa.array(v, type=schema.get(k)) for k, v in columns.items()}
    path = root / task / (name or f"{split}-00000-of-00001.parquet")
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(arrays), path)
    return path


# the hub's column types: idx int32, label int64 (a ClassLabel), STS-B's label float32
HUB_TYPES = {"idx": pa.int32(), "label": pa.int64()}


def test_the_table_follows_nyu_mll_glue():
    assert list(TASKS) == ["cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte"]
    assert {n: t.text_columns for n, t in TASKS.items()} == {
        "cola": ("sentence",), "sst2": ("sentence",), "mrpc": ("sentence1", "sentence2"),
        "qqp": ("question1", "question2"), "stsb": ("sentence1", "sentence2"), "mnli": ("premise", "hypothesis"),
        "qnli": ("question", "sentence"), "rte": ("sentence1", "sentence2")}
    assert {n: t.num_labels for n, t in TASKS.items()} == {
        "cola": 2, "sst2": 2, "mrpc": 2, "qqp": 2, "stsb": 1, "mnli": 3, "qnli": 2, "rte": 2}
    assert all(len(t.label_names) == (0 if t.regression else t.num_labels) for t in TASKS.values())
    assert TASKS["mnli"].splits == ("train", "validation_matched", "validation_mismatched", "test_matched",
                                    "test_mismatched")
    assert TASKS["cola"].splits == ("train", "validation", "test")
    # every Table 1 column is a metric its task reports, in the paper's column order
    assert all(metric in TASKS[task].metrics for _, task, metric in TABLE1_COLUMNS)
    assert [c for c, _, _ in TABLE1_COLUMNS] == ["MNLI", "SST-2", "STSB", "RTE", "QNLI", "QQP", "MRPC", "CoLA"]


def test_reads_single_sentence_pair_regression_and_mnli_splits(tmp_path):
    write_split(tmp_path, "cola", "train", {"sentence": ["Our friends won't buy this.", "The more we study."],
                                            "label": [1, 0], "idx": [0, 1]}, HUB_TYPES)
    write_split(tmp_path, "mrpc", "validation", {"sentence1": ["A a.", "B b."], "sentence2": ["A.", "C c."],
                                                 "label": [1, 0], "idx": [7, 9]}, HUB_TYPES)
    write_split(tmp_path, "stsb", "validation", {"sentence1": ["x", "y", "z"], "sentence2": ["x!", "q", "z."],
                                                 "label": [5.0, 0.0, 3.8], "idx": [0, 1, 2]},
                {"idx": pa.int32(), "label": pa.float32()})
    write_split(tmp_path, "mnli", "validation_mismatched", {"premise": ["p0", "p1", "p2"], "hypothesis": ["h0", "h1", "h2"],
                                                            "label": [2, 0, 1], "idx": [0, 1, 2]}, HUB_TYPES)
    write_split(tmp_path, "mnli", "test_matched", {"premise": ["p"], "hypothesis": ["h"], "label": [-1], "idx": [0]},
                HUB_TYPES)

    cola = read_glue("cola", tmp_path, "train")
    assert cola.texts == (["Our friends won't buy this.", "The more we study."],)
    assert cola.labels.dtype == np.int64 and cola.labels.tolist() == [1, 0]
    assert cola.idx.dtype == np.int32 and cola.idx.tolist() == [0, 1] and len(cola) == 2
    assert (cola.task, cola.split) == ("cola", "train")

    mrpc = read_glue("mrpc", str(tmp_path), "validation")
    assert mrpc.texts == (["A a.", "B b."], ["A.", "C c."]) and mrpc.labels.tolist() == [1, 0]
    assert mrpc.idx.tolist() == [7, 9]

    stsb = read_glue("stsb", tmp_path, "validation")
    assert stsb.labels.dtype == np.float32
    np.testing.assert_array_equal(stsb.labels, np.array([5.0, 0.0, 3.8], dtype=np.float32))
    assert stsb.texts[1] == ["x!", "q", "z."]

    mm = read_glue("mnli", tmp_path, "validation_mismatched")
    assert mm.texts == (["p0", "p1", "p2"], ["h0", "h1", "h2"]) and mm.labels.tolist() == [2, 0, 1]
    # test splits hide their labels as -1
    assert read_glue("mnli", tmp_path, "test_matched").labels.tolist() == [-1]


def test_reads_by_name_under_headwise_data_shards_and_files_without_idx(tmp_path, monkeypatch):
    root = tmp_path / "glue"
    write_split(root, "rte", "train", {"sentence1": ["a", "b"], "sentence2": ["c", "d"], "label": [0, 1]},
                HUB_TYPES, name="train-00000-of-00002.parquet")
    write_split(root, "rte", "train", {"sentence1": ["e"], "sentence2": ["f"], "label": [1]},
                HUB_TYPES, name="train-00001-of-00002.parquet")
    monkeypatch.setenv("HEADWISE_DATA", str(tmp_path))
    rte = read_glue("rte", "glue", "train")
    assert rte.texts == (["a", "b", "e"], ["c", "d", "f"]) and rte.labels.tolist() == [0, 1, 1]
    assert rte.idx.dtype == np.int32 and rte.idx.tolist() == [0, 1, 2]  # numbered where idx is absent


def _good_cola(root: Path, **overrides) -> None:
    columns = {"sentence": ["a", "b"], "label": [0, 1], "idx": [0, 1], **overrides}
    write_split(root, "cola", "validation", {k: v for k, v in columns.items() if v is not None}, HUB_TYPES)


@pytest.mark.parametrize("case, match", [
    ("unknown task", r"unknown GLUE task 'wnli': use one of cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte"),
    ("unknown split", r"mnli has no split 'validation': use one of train, validation_matched"),
    ("missing split", r"cola/validation-00000-of-00001.parquet is missing; lay the folder out"),
    ("jsonl instead", r"found validation.jsonl: write the split as parquet"),
    ("missing shard", r"incomplete or mismatched shards"),
    ("not parquet", r"is not a readable parquet file .*: replace it"),
    ("empty split", r"has no rows"),
    ("missing text", r"lacks column\(s\) sentence \(it has label, idx\): cola needs sentence and label"),
    ("missing label", r"lacks column\(s\) label"),
    ("label outside", r"label 2 of row 1 is not a class of cola: use 0..1 \(unacceptable, acceptable\)$"),
    ("hidden label outside test", r"label -1 of row 0 is not a class of cola"),
    ("float label", r"holds double, not integers: write the class ids 0..1"),
    ("string label", r"holds string, not integers"),
    ("null text", r"text column sentence has 1 empty \(null\) value"),
    ("stsb out of range", r"label 5.5 of row 0 is outside 0..5"),
    ("not a folder", r"is a file: give the folder"),
    ("not found", r"GLUE source 'nowhere' not found as a path"),
])
def test_bad_inputs_fail_with_one_line(tmp_path, monkeypatch, case, match):
    monkeypatch.delenv("HEADWISE_DATA", raising=False)
    task, split, source = "cola", "validation", tmp_path
    if case == "unknown task":
        task = "wnli"
    elif case == "unknown split":
        task = "mnli"
    elif case == "jsonl instead":
        (tmp_path / "cola").mkdir()
        (tmp_path / "cola" / "validation.jsonl").write_text('{"sentence": "a", "label": 0}\n')
    elif case == "missing shard":
        write_split(tmp_path, "cola", split, {"sentence": ["a"], "label": [0]}, HUB_TYPES,
                    name="validation-00001-of-00002.parquet")
    elif case == "not parquet":
        (tmp_path / "cola").mkdir()
        (tmp_path / "cola" / "validation-00000-of-00001.parquet").write_text("sentence,label\na,0\n")
    elif case == "empty split":
        write_split(tmp_path, "cola", split, {"sentence": [], "label": [], "idx": []},
                    {"sentence": pa.string(), **HUB_TYPES})
    elif case == "missing text":
        _good_cola(tmp_path, sentence=None)
    elif case == "missing label":
        _good_cola(tmp_path, label=None)
    elif case == "label outside":
        _good_cola(tmp_path, label=[1, 2])
    elif case == "hidden label outside test":
        _good_cola(tmp_path, label=[-1, 0])
    elif case == "float label":
        write_split(tmp_path, "cola", split, {"sentence": ["a"], "label": [1.0]})
    elif case == "string label":
        write_split(tmp_path, "cola", split, {"sentence": ["a"], "label": ["acceptable"]})
    elif case == "null text":
        _good_cola(tmp_path, sentence=["a", None])
    elif case == "stsb out of range":
        task = "stsb"
        write_split(tmp_path, "stsb", split, {"sentence1": ["a"], "sentence2": ["b"], "label": [5.5]},
                    {"label": pa.float32()})
    elif case == "not a folder":
        source = tmp_path / "file.parquet"
        source.write_text("x")
    elif case == "not found":
        source = "nowhere"
    one_line_error(read_glue, task, source, split, match=match)


def test_a_test_split_may_hide_labels_but_not_hold_wrong_ones(tmp_path):
    write_split(tmp_path, "stsb", "test", {"sentence1": ["a", "b"], "sentence2": ["c", "d"], "label": [-1.0, -1.0]},
                {"label": pa.float32()})
    assert read_glue("stsb", tmp_path, "test").labels.tolist() == [-1.0, -1.0]
    write_split(tmp_path, "qnli", "test", {"question": ["q"], "sentence": ["s"], "label": [3]}, HUB_TYPES)
    one_line_error(read_glue, "qnli", tmp_path, "test", match=r"label 3 of row 0 .* or -1 \(hidden\)")


# --- metrics --------------------------------------------------------------------------------------


def test_binary_metrics_match_a_confusion_matrix_worked_by_hand():
    # TP = 3, FP = 1, FN = 2, TN = 4
    labels = np.array([1, 1, 1, 0, 1, 1, 0, 0, 0, 0])
    preds = np.array([1, 1, 1, 1, 0, 0, 0, 0, 0, 0])
    tp, fp, fn, tn = 3, 1, 2, 4
    f1 = 2 * tp / (2 * tp + fp + fn)  # 6/9
    mcc = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))  # 10/sqrt(600)
    assert task_metrics("mrpc", preds, labels) == pytest.approx({"accuracy": 0.7, "f1": f1}, abs=1e-12)
    assert task_metrics("qqp", preds, labels)["f1"] == pytest.approx(2 / 3)
    assert task_metrics("cola", preds, labels) == pytest.approx({"matthews_correlation": mcc}, abs=1e-12)
    assert mcc == pytest.approx(0.408248290463863)
    # F1 is that of class 1: swapping the classes gives class 0's F1, 2*4/(2*4+2+1) = 8/11
    assert task_metrics("mrpc", 1 - preds, 1 - labels)["f1"] == pytest.approx(8 / 11)
    # no positive predictions and no positive labels: F1 0, MCC 0 (undefined), without a warning
    assert task_metrics("mrpc", np.zeros(3, int), np.zeros(3, int)) == {"accuracy": 1.0, "f1": 0.0}


def test_accuracy_counts_the_whole_set_and_three_classes():
    assert task_metrics("mnli", [0, 1, 2, 2, 1], [0, 1, 1, 2, 0]) == {"accuracy": 3 / 5}
    assert task_metrics("sst2", [1], [1]) == {"accuracy": 1.0}
    # the whole-set accuracy of uneven halves is not the mean of the halves' accuracies
    assert task_metrics("rte", [1, 1, 1, 0], [1, 1, 1, 1])["accuracy"] == 0.75


def test_correlations_of_known_relations():
    x = np.array([0.0, 0.5, 1.0, 2.0, 4.5])
    linear = task_metrics("stsb", x, 2 * x + 1)
    assert linear == pytest.approx({"pearson": 1.0, "spearmanr": 1.0})
    monotone = task_metrics("stsb", x, np.exp(x))
    assert monotone["spearmanr"] == pytest.approx(1.0) and monotone["pearson"] < 0.95
    # x = 1,2,3 against y = 1,3,2: cov 1, var 2 and 2, so r = 1/2; the ranks are the values, rho = 1/2
    assert task_metrics("stsb", [1.0, 2.0, 3.0], [1.0, 3.0, 2.0]) == pytest.approx({"pearson": 0.5, "spearmanr": 0.5})
    assert task_metrics("stsb", [3.0, 2.0, 1.0], [1.0, 2.0, 3.0]) == pytest.approx({"pearson": -1.0, "spearmanr": -1.0})


@pytest.mark.parametrize("task, preds, labels, match", [
    ("cola", [0, 1], [0], r"one prediction per label"),
    ("mnli", [[0.1, 0.2, 0.7]], [2], r"pass class ids, the argmax of the logits"),
    ("cola", [], [], r"at least one example"),
    ("mnli", [0, 1], [-1, -1], r"hidden test labels: score a validation split"),
    ("cola", [0.0, 1.0], [0, 1], r"need integer class ids"),
    ("cola", [0, 2], [0, 1], r"prediction 2 is not a class id 0..1"),
    ("stsb", [[1.0], [2.0]], [1.0, 2.0], r"pass the predicted scores as one flat array"),
    ("ax", [0], [0], r"unknown GLUE task 'ax'"),
])
def test_bad_metric_inputs_fail_with_one_line(task, preds, labels, match):
    one_line_error(task_metrics, task, preds, labels, match=match)

