"""The torch modules of block features (:mod:`headwise.model.features`) that torch lacks:
:class:`UnitNorm` (a ``norm``) and :class:`ScaledSinusoid` (``positions``); RoPE's is
:mod:`headwise.model.rotary`. Leaves: they import torch alone, so the features' builders import
them without a loop back into the model."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class UnitNorm(nn.Module):
    """``scale * x / ||x||`` with one learnable scalar (Amsel et al.'s replacement for LayerNorm)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * F.normalize(x, dim=-1)


class ScaledSinusoid(nn.Module):
    """Fixed sinusoidal positions times one learned scalar (cramming's ``ScaledSinosoidal``,
    ``cramming/architectures/embeddings.py``): row p holds ``sin(p w_i)`` at channel 2i and
    ``cos(p w_i)`` at 2i + 1, ``w_i = 10000^(-2i / d)``; the scalar starts at 1 / sqrt(d). Called
    with positions [T] like an ``nn.Embedding``. The table is a non-persistent buffer: saved
    models hold only the scalar."""

    def __init__(self, max_seq_len: int, d_model: int) -> None:
        super().__init__()
        position = torch.arange(max_seq_len, dtype=torch.float32)[:, None]
        freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
        table = torch.zeros(max_seq_len, d_model)
        table[:, 0::2] = torch.sin(position * freq)
        table[:, 1::2] = torch.cos(position * freq)
        self.register_buffer("table", table, persistent=False)
        self.scale = nn.Parameter(torch.tensor(d_model**-0.5))

    def forward(self, positions: Tensor) -> Tensor:
        return self.scale * self.table[positions]
