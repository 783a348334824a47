"""The nearest-neighbour target of Amsel, Yehudai & Bruna (ICLR 2025), as a task (the one
:class:`~headwise.families.nearest.task.NearestTaskConfig` builds).

``farthest`` (the main experiments): a sample is N points uniform on the unit sphere in d
dimensions; the target for token i is the point farthest from x_i, ``x_j`` with
``j = argmin_j <x_i, x_j>`` (the nearest neighbour of -x_i, never x_i itself). Inputs and targets
are float32 ``[B, N, d]``.

``query-nearest``: Q separate query points y_k and the N points x_j; the target for query k is
``x_j`` with ``j = argmax_j <y_k, x_j>``. Points and queries form one sequence of ``N + Q`` tokens
of ``d + 1`` coordinates: ``(x_j, 0)`` for the points first, then ``(y_k, 1)`` for the queries
(the last coordinate tells them apart, since the encoder has no positions). Targets are
``[B, Q, d]``: the loss scores the first d coordinates of the outputs at the query tokens.

Loss: mean over scored tokens of ``||output - target||^2`` summed over coordinates. A fresh
batch is drawn every step from ``default_rng([seed, 0, rank, step])``, so a stream resumes
exactly from its step; evaluation batches come from ``default_rng([eval_seed, 1, i])``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from headwise.errors import HeadwiseError
from headwise.families.nearest.baseline import VARIANTS, baseline_loss
from headwise.tasks.base import Batch, BatchStream, Task


def sample_sphere(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Points uniform on the unit sphere: normalised Gaussians of shape ``(..., d)`` (float32)."""
    x = rng.standard_normal(shape, dtype=np.float32)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def farthest_targets(points: Tensor) -> Tensor:
    """For points ``[B, N, d]``, each token's farthest point ``x_argmin_j <x_i, x_j>`` ``[B, N, d]``."""
    gram = points.double() @ points.double().transpose(1, 2)
    index = gram.argmin(dim=2)
    return torch.gather(points, 1, index[..., None].expand(-1, -1, points.shape[2]))


def nearest_targets(queries: Tensor, points: Tensor) -> Tensor:
    """For queries ``[B, Q, d]`` and points ``[B, N, d]``, each query's nearest point ``[B, Q, d]``."""
    index = (queries.double() @ points.double().transpose(1, 2)).argmax(dim=2)
    return torch.gather(points, 1, index[..., None].expand(-1, -1, points.shape[2]))


class NearestStream(BatchStream):
    """Fresh seeded samples every step; the position is the step count."""

    def __init__(self, task: "NearestNeighbourTask", micro_batch: int, seed: int, rank: int) -> None:
        self.task = task
        self.micro_batch = micro_batch
        self.seed = seed
        self.rank = rank
        self.step = 0

    @property
    def epoch(self) -> float:
        return 0.0

    def __next__(self) -> Batch:
        rng = np.random.default_rng([self.seed, 0, self.rank, self.step])
        self.step += 1
        return self.task.sample(rng, self.micro_batch)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "nearest", "seed": self.seed, "step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != "nearest":
            raise HeadwiseError(
                f"the saved data position is for a {state.get('kind')!r} stream, not a nearest-neighbour one"
            )
        self.seed = int(state["seed"])
        self.step = int(state["step"])


def pick(outputs: Tensor, inputs: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """For each scored token, the index of the candidate point its output is closest to (largest
    inner product) and the index of its target's point. The scored tokens are the last
    ``targets.shape[1]`` (as in the loss) and the candidates the inputs' points: every token, or
    the ones before the queries."""
    d, n_scored = targets.shape[-1], targets.shape[1]
    n_cand = inputs.shape[1] if n_scored == inputs.shape[1] else inputs.shape[1] - n_scored
    points = inputs[:, :n_cand, :d].float()
    pred = outputs[:, -n_scored:, :d].float()
    return (pred @ points.transpose(1, 2)).argmax(-1), (targets.float() @ points.transpose(1, 2)).argmax(-1)


class NearestNeighbourTask(Task):
    """Amsel et al.'s nearest-neighbour target on the unit sphere (see the module docstring)."""

    inputs = "vectors"
    outputs = "vectors"
    metric_names = ("pick_accuracy",)

    def __init__(
        self,
        dim: int = 16,
        n_points: int = 8,
        variant: str = "farthest",
        n_queries: int | None = None,
        eval_batches: int = 4,
        eval_batch_size: int = 256,
        eval_seed: int = 1234,
    ) -> None:
        if variant not in VARIANTS:
            raise HeadwiseError(f"unknown nearest-neighbour variant {variant!r}: use {' or '.join(VARIANTS)}")
        if dim < 2 or n_points < 2:
            raise HeadwiseError(f"the nearest-neighbour task needs dim >= 2 and n_points >= 2 (got {dim}, {n_points})")
        if eval_batches < 1 or eval_batch_size < 1:
            raise HeadwiseError("eval_batches and eval_batch_size must be at least 1")
        self.dim = dim
        self.n_points = n_points
        self.variant = variant
        if n_queries is not None and (variant != "query-nearest" or n_queries < 1):
            raise HeadwiseError(f"n_queries = {n_queries}: it must be >= 1 and applies only to variant 'query-nearest'")
        self.n_queries = (n_queries or n_points) if variant == "query-nearest" else 0
        self._input_dim = dim + (1 if variant == "query-nearest" else 0)
        self._eval = [
            self.sample(np.random.default_rng([eval_seed, 1, i]), eval_batch_size) for i in range(eval_batches)
        ]

    @property
    def vocab_size(self) -> None:
        return None

    @property
    def seq_len(self) -> int:
        return self.n_points + self.n_queries

    @property
    def input_dim(self) -> int:
        """Width of the model's input and output vectors (d_model of a vector model)."""
        return self._input_dim

    def sample(self, rng: np.random.Generator, batch: int) -> Batch:
        """One batch drawn from ``rng``."""
        points = torch.from_numpy(sample_sphere(rng, (batch, self.n_points, self.dim)))
        if self.variant == "farthest":
            return Batch(inputs=points, targets=farthest_targets(points))
        queries = torch.from_numpy(sample_sphere(rng, (batch, self.n_queries, self.dim)))
        flags = torch.cat([torch.zeros(batch, self.n_points, 1), torch.ones(batch, self.n_queries, 1)], dim=1)
        inputs = torch.cat([torch.cat([points, queries], dim=1), flags], dim=2)
        return Batch(inputs=inputs, targets=nearest_targets(queries, points))

    def train_stream(self, micro_batch: int, seed: int, rank: int = 0, world_size: int = 1) -> BatchStream:
        if micro_batch < 1 or not 0 <= rank < world_size:
            raise HeadwiseError(f"micro_batch must be >= 1 and rank in 0..{world_size - 1} (got {micro_batch}, {rank})")
        return NearestStream(self, micro_batch, seed, rank)

    def eval_batches(self) -> list[Batch]:
        return list(self._eval)

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """Mean over scored tokens of the squared error summed over coordinates. The scored tokens
        are the last ``targets.shape[1]`` (all of them, or the queries), their first d coordinates."""
        scored = outputs[:, -targets.shape[1]:, : targets.shape[2]].float()
        return (scored - targets.float()).pow(2).sum(dim=-1).mean()

    def metrics(self, outputs: Tensor, batch: Batch) -> dict[str, Tensor]:
        """``pick_accuracy``: the share of scored tokens whose output is closest (largest inner
        product) to the right candidate point (see :func:`pick`)."""
        chosen, truth = pick(outputs, batch.inputs, batch.targets)
        return {"pick_accuracy": (chosen == truth).float().mean()}

    def tokens_per_epoch(self) -> None:
        return None

    def predictions(self, outputs: Tensor, batch: Batch) -> tuple[str, list, list]:
        """For the batch's first sample, the point each scored token's output is closest to, and
        its target point (see :func:`pick`)."""
        chosen, truth = pick(outputs, batch.inputs, batch.targets)
        return "first sample, the point each token's output is closest to", chosen[0].tolist(), truth[0].tolist()

    def describe(self) -> dict[str, Any]:
        return {
            "task": "nearest",
            "variant": self.variant,
            "dim": self.dim,
            "n_points": self.n_points,
            "n_queries": self.n_queries,
            "input_dim": self.input_dim,
            "baseline_loss": baseline_loss(self.dim, self.n_points, self.variant),
            "zero_loss": 1.0,
        }
