"""GLUE metrics over a whole evaluation set, and the columns (task and metric) of Leaner Transformers' Table 1.

Every metric is computed once over all predictions of a split (never averaged over batches, which
would change F1, Matthews correlation and the correlations), by scikit-learn (accuracy, F1,
Matthews correlation) and scipy (Pearson, Spearman), and returned as a fraction, as Hugging Face
``evaluate``'s GLUE metric returns it (cramming's eval.py scores with that metric, under the
same names).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from headwise.errors import HeadwiseError
from headwise.families.encoder.glue import HIDDEN_LABEL, glue_task


def accuracy(predictions: np.ndarray, labels: np.ndarray) -> float:
    """The fraction of predicted class ids equal to the labels."""
    from sklearn.metrics import accuracy_score

    return float(accuracy_score(labels, predictions))


def f1(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Binary F1 of class 1 (MRPC's ``equivalent``, QQP's ``duplicate``); 0 where it has no
    predicted or true positives (instead of scikit-learn's warning)."""
    from sklearn.metrics import f1_score

    return float(f1_score(labels, predictions, pos_label=1, average="binary", zero_division=0.0))


def matthews_correlation(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Matthews correlation coefficient (CoLA); 0 where it is undefined (one class predicted)."""
    from sklearn.metrics import matthews_corrcoef

    return float(matthews_corrcoef(labels, predictions))


def pearson(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Pearson correlation (STS-B); NaN where a side is constant (it is undefined there)."""
    from scipy.stats import pearsonr

    return float(pearsonr(predictions, labels)[0])


def spearmanr(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Spearman rank correlation (STS-B); NaN where a side is constant."""
    from scipy.stats import spearmanr as scipy_spearmanr

    return float(scipy_spearmanr(predictions, labels)[0])


#: metric name (as :data:`headwise.families.encoder.glue.TASKS` lists them) -> function
METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "accuracy": accuracy, "f1": f1, "matthews_correlation": matthews_correlation,
    "pearson": pearson, "spearmanr": spearmanr,
}

#: Leaner Transformers' Table 1 columns in its order: (column, task, metric). The paper does not
#: name the metric of each column; these are cramming's target metrics (``config/eval/tasks/*.yaml``),
#: MNLI being its matched validation set.
TABLE1_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("MNLI", "mnli", "accuracy"), ("SST-2", "sst2", "accuracy"), ("STSB", "stsb", "pearson"),
    ("RTE", "rte", "accuracy"), ("QNLI", "qnli", "accuracy"), ("QQP", "qqp", "f1"),
    ("MRPC", "mrpc", "f1"), ("CoLA", "cola", "matthews_correlation"),
)


def task_metrics(task: str, predictions, labels) -> dict[str, float]:
    """The metrics dict of GLUE task ``task`` over a whole evaluation split: ``predictions`` are
    class ids (the argmax of the logits; STS-B: the predicted scores) and ``labels`` the split's
    labels, one per example. The names are those :data:`~headwise.families.encoder.glue.TASKS`
    lists: CoLA ``matthews_correlation``; SST-2, MNLI, QNLI, RTE ``accuracy``; MRPC, QQP
    ``accuracy`` and ``f1``; STS-B ``pearson`` and ``spearmanr``."""
    spec = glue_task(task)
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    hint = "pass the predicted scores as one flat array" if spec.regression else "pass class ids, the argmax of the logits"
    if predictions.ndim != 1 or labels.ndim != 1 or len(predictions) != len(labels):
        raise HeadwiseError(f"{task} metrics need one prediction per label: got predictions of shape "
                            f"{predictions.shape} and labels of shape {labels.shape} ({hint})")
    if len(labels) == 0:
        raise HeadwiseError(f"{task} metrics need at least one example: evaluate on a non-empty split")
    if np.any(labels == HIDDEN_LABEL):
        raise HeadwiseError(f"{task} labels include {HIDDEN_LABEL}, GLUE's hidden test labels: score a validation split")
    if not spec.regression:
        if not (np.issubdtype(predictions.dtype, np.integer) and np.issubdtype(labels.dtype, np.integer)):
            raise HeadwiseError(f"{task} metrics need integer class ids: got {predictions.dtype} predictions and "
                                f"{labels.dtype} labels ({hint})")
        outside = predictions[(predictions < 0) | (predictions >= spec.num_labels)]
        if len(outside):
            raise HeadwiseError(f"{task} prediction {int(outside[0])} is not a class id 0..{spec.num_labels - 1}")
    return {name: METRICS[name](predictions, labels) for name in spec.metrics}
