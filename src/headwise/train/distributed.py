"""Data parallelism under ``torchrun``: process-group set-up and the few collectives the trainer uses.

Without torchrun's environment (``WORLD_SIZE`` unset or 1) everything here is a no-op, so the
trainer has one code path. Backends: NCCL on CUDA, gloo on CPU.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from headwise.errors import HeadwiseError


@dataclass
class DistContext:
    """This process's place in the job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    #: whether this context created the process group (and so destroys it)
    owns_group: bool = False

    @property
    def is_main(self) -> bool:
        """Rank 0 writes every file of the run."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Reduce ``tensor`` over all processes, in place (sum, min or max)."""
        if self.enabled:
            dist.all_reduce(tensor, op={"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN,
                                        "max": dist.ReduceOp.MAX}[op])
        return tensor

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every process's ``obj`` (which may hold tensors), in rank order."""
        if not self.enabled:
            return [obj]
        # Objects travel as torch.save bytes: all_gather_object's own pickling of tensors fails
        # to unpickle them in torch 2.13 ("UntypedStorage has no attribute dtype").
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, buffer.getvalue())
        return [torch.load(io.BytesIO(blob), map_location="cpu", weights_only=False) for blob in out]

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def close(self) -> None:
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()


def init_distributed(device: str) -> DistContext:
    """Join the process group torchrun describes in the environment (if any).

    ``device`` is the config's ``train.device``: CUDA ranks use NCCL and one GPU each
    (``LOCAL_RANK``); CPU ranks use gloo.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext()
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if dist.is_initialized():
        return DistContext(rank, world, local, owns_group=False)
    cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if cuda:
        if not torch.cuda.is_available():
            raise HeadwiseError("train.device = 'cuda' but no CUDA device is available")
        torch.cuda.set_device(local)
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    return DistContext(rank, world, local, owns_group=True)


def resolve_device(device: str, ctx: DistContext) -> torch.device:
    """The torch device of ``train.device`` for this process ("auto": CUDA when available)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise HeadwiseError("train.device = 'cuda' but no CUDA device is available (use 'auto' or 'cpu')")
        return torch.device("cuda", ctx.local_rank)
    return torch.device("cpu")
