"""Attention analysis: condition numbers of the attention block, head entropies and effective
ranks, during training (:mod:`~headwise.analysis.conditioning`, which the trainer logs), over a
run's checkpoints and across a study (:mod:`~headwise.analysis.runs`, ``headwise analyze``), their
figures (:mod:`~headwise.analysis.plots`), and Theorem 3.2's Gaussian check
(:mod:`~headwise.analysis.theory`)."""

from headwise.analysis.conditioning import (
    ModelAnalysis,
    analyze_model,
    attention_probabilities,
    capture_attention,
    condition_number,
    effective_rank,
)
from headwise.analysis.runs import analyze_run, condition_vs_heads

__all__ = [
    "ModelAnalysis",
    "analyze_model",
    "analyze_run",
    "attention_probabilities",
    "capture_attention",
    "condition_number",
    "condition_vs_heads",
    "effective_rank",
]
