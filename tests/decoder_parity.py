"""Random weights for the parity tests (tests/test_parity.py, tests/test_convert.py): a model
compared with its reference must not pass on the ones and zeros of a fresh initialisation."""

from __future__ import annotations

import torch


def perturbed(model: torch.nn.Module, seed: int, scale: float = 0.3) -> None:
    """Move every parameter (the norms' ones too, so a comparison cannot pass on ones and zeros);
    the large default scale spreads the logits, so greedy tokens are decided well above float noise."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
