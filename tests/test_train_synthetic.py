"""A small synthetic language task for the trainer's tests, and the config that goes with it.

Example ``i`` of seed ``s`` is an arithmetic sequence ``a + b t (mod V)`` drawn from
``Generator(s * 1_000_003 + i)``; the model learns to continue it. A stream hands out examples by
global index: micro-batch ``k`` of rank ``r`` of ``W`` holds examples ``k B W + r B ... + B - 1``,
so any split of one global batch over processes or micro-batches sees the same examples, which
is what the accumulation and DDP tests need. Hooks: ``delay`` (seconds per micro-batch, to kill
a run mid-way), ``poison_after`` (the loss turns NaN after that many micro-batches) and
``on_batch`` (called with the stream's position).

Other test modules import it (pytest puts ``tests/`` on ``sys.path``).
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch
import torch.nn.functional as F

from headwise.tasks.base import Batch, BatchStream, Task
from headwise.train import RunConfig

VOCAB = 32
SEQ = 16


class SyntheticStream(BatchStream):
    def __init__(self, task: "SyntheticLM", micro_batch: int, seed: int, rank: int, world_size: int) -> None:
        self.task, self.micro_batch, self.seed = task, micro_batch, seed
        self.rank, self.world_size = rank, world_size
        self.position = 0

    @property
    def epoch(self) -> float:
        return 0.0

    def __next__(self) -> Batch:
        task = self.task
        if task.delay:
            time.sleep(task.delay)
        if task.on_batch is not None:
            task.on_batch(self.position)
        if task.poison_after is not None and self.position >= task.poison_after:
            task.poisoned = True
        first = (self.position * self.world_size + self.rank) * self.micro_batch
        self.position += 1
        return task.examples(range(first, first + self.micro_batch), self.seed)

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = state["position"]


class SyntheticLM(Task):
    """Continue an arithmetic sequence mod ``VOCAB`` (see the module docstring)."""

    inputs, outputs = "tokens", "lm"

    def __init__(self, delay: float = 0.0, poison_after: int | None = None,
                 on_batch: Callable[[int], None] | None = None, eval_size: int = 8) -> None:
        self.delay, self.poison_after, self.on_batch = delay, poison_after, on_batch
        self.poisoned = False
        self._eval = [self.examples(range(10**6 + k * 4, 10**6 + k * 4 + 4), seed=99) for k in range(eval_size // 4)]

    @property
    def vocab_size(self) -> int:
        return VOCAB

    @property
    def seq_len(self) -> int:
        return SEQ

    @staticmethod
    def examples(indices: range, seed: int) -> Batch:
        rows = []
        for i in indices:
            g = torch.Generator().manual_seed(seed * 1_000_003 + i)
            a, b = torch.randint(0, VOCAB, (2,), generator=g).tolist()
            rows.append((a + (b % 5 + 1) * torch.arange(SEQ + 1)) % VOCAB)
        data = torch.stack(rows)
        return Batch(inputs=data[:, :-1].contiguous(), targets=data[:, 1:].contiguous())

    def train_stream(self, micro_batch: int, seed: int, rank: int = 0, world_size: int = 1) -> BatchStream:
        return SyntheticStream(self, micro_batch, seed, rank, world_size)

    def eval_batches(self) -> list[Batch]:
        return list(self._eval)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(outputs.reshape(-1, outputs.shape[-1]).float(), targets.reshape(-1))
        return loss * float("nan") if self.poisoned else loss

    def tokens_per_epoch(self) -> None:
        return None


def tiny_config(**train: Any) -> RunConfig:
    """A run of a 2-layer, d=32 model on :class:`SyntheticLM`; ``train`` overrides ``[train]``
    keys, and ``eval_every``, ``ckpt_every``, ``keep``, ``lr``, ``warmup``, ``dropout`` the rest."""
    extra = {k: train.pop(k) for k in ("eval_every", "ckpt_every", "keep", "lr", "warmup", "dropout") if k in train}
    return RunConfig.parse({
        "model": {"d_model": 32, "n_layers": 2, "heads": [4, 2], "max_seq_len": SEQ, "score_scale": "inv_sqrt",
                  "dropout": extra.get("dropout", 0.0)},
        "task": {"kind": "lm", "source": "synthetic (an in-test task)", "tokenizer": "bpe:512"},
        "optim": {"lr": extra.get("lr", 3e-3), "weight_decay": 0.1},
        "schedule": {"warmup_steps": extra.get("warmup", 2)},
        "train": {"micro_batch": 4, "steps": 12, "log_every": 1, "device": "cpu", **train},
        "eval": {"every": extra.get("eval_every", 4)},
        "checkpoint": {"every": extra.get("ckpt_every", 4), "keep": extra.get("keep", 2)},
    }, source="test config")


def test_examples_depend_only_on_their_global_index():
    task = SyntheticLM()
    whole = next(task.train_stream(4, seed=3))
    halves = [next(task.train_stream(2, seed=3, rank=r, world_size=2)) for r in range(2)]
    assert torch.equal(whole.inputs, torch.cat([h.inputs for h in halves]))
    stream = task.train_stream(2, seed=3)
    assert torch.equal(torch.cat([next(stream).inputs, next(stream).inputs]), whole.inputs)
    # targets continue the sequence: x[t+1] - x[t] is a constant step, mod VOCAB
    step = (whole.targets - whole.inputs) % VOCAB
    assert bool((step == step[:, :1]).all())
