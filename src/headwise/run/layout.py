"""The files of a run directory, named once.

    RUN_DIR/
      config.toml          the fully resolved run config (training it again reproduces the run)
      summary.json         :class:`~headwise.run.summary.RunSummary`
      metrics.jsonl        one JSON row per logged step
      tokenizer.json       the BPE a text run encodes with, saved when it starts (summary.json
                           records its sha256; :mod:`~headwise.run.tokenizer`)
      checkpoints/         step_XXXXXXXX/ folders (each with a ``manifest.json`` of its files'
                           sizes and sha256) and a ``latest`` pointer; ``damaged_step_*`` are
                           checkpoints a resume found damaged and set aside
      model/               the final model (``model.safetensors`` + ``spec.json`` + ``manifest.json``)
      tb/                  TensorBoard events
      wandb/, mlruns/      Weights & Biases files and the default MLflow store, when [log] names them
      trackers.json        the W&B run id and MLflow run a resume continues
      eval/                headwise eval's lm-eval tasks and scores
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CONFIG_FILE = "config.toml"
SUMMARY_FILE = "summary.json"
METRICS_FILE = "metrics.jsonl"
TOKENIZER_FILE = "tokenizer.json"
CHECKPOINTS_DIR = "checkpoints"
MODEL_DIR = "model"
TENSORBOARD_DIR = "tb"


@dataclass(frozen=True)
class RunDir:
    """Paths inside one run directory."""

    path: Path

    def __init__(self, path: str | Path) -> None:
        object.__setattr__(self, "path", Path(path))

    @property
    def config(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def summary(self) -> Path:
        return self.path / SUMMARY_FILE

    @property
    def metrics(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def tokenizer(self) -> Path:
        return self.path / TOKENIZER_FILE

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS_DIR

    @property
    def model(self) -> Path:
        return self.path / MODEL_DIR

    def has_run(self) -> bool:
        """True when the directory holds a headwise run (its resolved config)."""
        return self.config.is_file()
