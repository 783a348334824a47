"""Rotary positions (RoPE) on each layer's queries and keys, as ``transformers``' Llama computes
them: frequencies ``theta^(-2i / dim)`` over the ``dim`` rotated channels of a head, angles
``position x frequency`` in float32, and the two halves of the rotated channels paired up
(``rotate_half``, not interleaved pairs). With a partial rotary factor only a head's first ``dim``
channels rotate and the rest pass unchanged (GPT-NeoX's and Laguna's ``q_rot`` / ``q_pass``).

Only torch is imported: an exported model carries this module (:mod:`headwise.hf.export`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def inverse_frequencies(dim: int, theta: float) -> Tensor:
    """The ``dim / 2`` rotary frequencies, float32 on the CPU, computed exactly as Llama's default
    RoPE computes them (``compute_default_rope_parameters``), so the angles agree to the bit."""
    # on the CPU by name: a model built under a meta-device context (transformers' from_pretrained)
    # gets real frequencies here too
    steps = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").to(dtype=torch.float)
    return 1.0 / (theta ** (steps / dim))


def rotate_half(x: Tensor) -> Tensor:
    """``x`` [..., 2n] with its halves (a, b) turned into (-b, a): the rotation by 90 degrees of
    every channel pair (i, i + n)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Rotary(nn.Module):
    """Rotary positions for heads of a layer: :meth:`forward` rotates q and k [B, T, heads,
    head_dim] at positions ``past .. past + T - 1``. No parameters; the frequencies are a
    non-persistent buffer (nothing in a state dict), kept in float32 whatever dtype the model
    is cast to, since bf16 frequencies would put positions a few hundred apart at the same angle."""

    def __init__(self, dim: int, theta: float) -> None:
        super().__init__()
        self.dim, self.theta = dim, theta
        self.register_buffer("inv_freq", inverse_frequencies(dim, theta), persistent=False)

    def _apply(self, fn, recurse=True):  # noqa: ANN001, ANN202 (nn.Module's signature)
        # `.to(device)` moves the frequencies; `.to(dtype)` must not round them: recompute them in
        # float32 on whatever device the cast put them
        super()._apply(fn, recurse)
        self.inv_freq = inverse_frequencies(self.dim, self.theta).to(self.inv_freq.device)
        return self

    @torch.no_grad()
    def recompute_buffers(self) -> None:
        """Compute the frequencies again in place: ``transformers``' ``from_pretrained`` builds a
        model without computing its buffers and loads only what a checkpoint holds."""
        self.inv_freq.copy_(inverse_frequencies(self.dim, self.theta))

    def cos_sin(self, past: int, t: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos and sin [t, 1, dim] of the angles at positions ``past .. past + t - 1`` (broadcast
        over the heads), in ``dtype`` (Llama rounds them to the activations' dtype too)."""
        positions = torch.arange(past, past + t, device=self.inv_freq.device, dtype=torch.float32)
        freqs = positions[:, None] * self.inv_freq[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)[:, None, :]
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def forward(self, q: Tensor, k: Tensor, past: int) -> tuple[Tensor, Tensor]:
        """q and k [B, T, heads, head_dim] rotated to their positions ``past ..``."""
        cos, sin = self.cos_sin(past, q.shape[1], q.dtype)
        return rotate(q, cos, sin), rotate(k, cos, sin)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, theta={self.theta}"


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``x`` [..., head_dim] with its first ``cos.shape[-1]`` channels rotated (Llama's
    ``x * cos + rotate_half(x) * sin``, in that order of operations) and the rest passed."""
    dim = cos.shape[-1]
    if dim == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    rotated, passed = x[..., :dim], x[..., dim:]
    return torch.cat((rotated * cos + rotate_half(rotated) * sin, passed), dim=-1)
