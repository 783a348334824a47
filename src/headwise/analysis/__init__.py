"""Attention analysis: condition numbers of the attention block, head entropies and effective
ranks, during training, over a run's checkpoints, across a study, and Theorem 3.2's Gaussian check."""

from headwise.analysis.conditioning import (
    ModelAnalysis,
    analyze_model,
    attention_probabilities,
    capture_attention,
    condition_number,
    effective_rank,
    training_metrics,
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
    "training_metrics",
]
