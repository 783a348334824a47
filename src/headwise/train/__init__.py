"""Training: ``run_training(cfg, out_dir)`` runs one training run (one process, or many under
torchrun) from a :class:`RunConfig`; :mod:`headwise.train.generate` samples from a run's model."""

from headwise.train.config import RunConfig
from headwise.train.trainer import run_training

__all__ = ["RunConfig", "run_training"]
