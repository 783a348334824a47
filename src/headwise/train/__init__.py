"""Training: ``run_training(cfg, out_dir)`` runs one training run (one process, or many under
torchrun) from a :class:`RunConfig`.

- :mod:`~headwise.train.config`: ``RunConfig``, the run's TOML tables, resolved against its task;
- :mod:`~headwise.train.trainer`: the training loop every task shares;
- :mod:`~headwise.train.run_folder`, :mod:`~headwise.train.checkpoint`,
  :mod:`~headwise.train.resume`: the run folder, crash-safe checkpoints and exact resume;
- :mod:`~headwise.train.init_from`: fine-tuning from a pretrained run;
- :mod:`~headwise.train.distill`: a teacher run's logits mixed into the loss (healing a pruned model);
- :mod:`~headwise.train.optim`: AdamW and the learning-rate schedule;
- :mod:`~headwise.train.distributed`: data parallelism under ``torchrun``;
- :mod:`~headwise.train.metrics`, :mod:`~headwise.train.peak`, :mod:`~headwise.train.trackers`:
  what a run records (``metrics.jsonl``, MFU against the device's peak, experiment trackers);
- :mod:`~headwise.train.allocator`: the CPU allocator setting of training processes;
- :mod:`~headwise.train.generate`: sampling from a run's model, with a KV cache.
"""

from headwise.lazy import lazy_exports

# Each name is loaded from its module on first use (PEP 562): a run config is read (a study's dry
# run, the [task] tables) without the trainer, and so without torch.
_EXPORTS = {"RunConfig": "config", "run_training": "trainer"}

__all__ = ["RunConfig", "run_training"]

__getattr__ = lazy_exports(__name__, {name: f"{__name__}.{module}" for name, module in _EXPORTS.items()})
