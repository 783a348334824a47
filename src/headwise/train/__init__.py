"""Training: ``run_training(cfg, out_dir)`` runs one training run (one process, or many under
torchrun) from a :class:`RunConfig`.

- :mod:`~headwise.train.config`: ``RunConfig``, the run's TOML tables, resolved against its task;
- :mod:`~headwise.train.trainer`: the training loop every task shares;
- :mod:`~headwise.train.run_folder`, :mod:`~headwise.train.checkpoint`,
  :mod:`~headwise.train.resume`: the run folder, crash-safe checkpoints and exact resume;
- :mod:`~headwise.train.init_from`: fine-tuning from a pretrained run;
- :mod:`~headwise.train.optim`: AdamW and the learning-rate schedule;
- :mod:`~headwise.train.distributed`: data parallelism under ``torchrun``;
- :mod:`~headwise.train.metrics`, :mod:`~headwise.train.peak`, :mod:`~headwise.train.trackers`:
  what a run records (``metrics.jsonl``, MFU against the device's peak, experiment trackers);
- :mod:`~headwise.train.allocator`: the CPU allocator setting of training processes;
- :mod:`~headwise.train.generate`: sampling from a run's model, with a KV cache.
"""

from headwise.train.config import RunConfig
from headwise.train.trainer import run_training

__all__ = ["RunConfig", "run_training"]
