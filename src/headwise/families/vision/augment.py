"""Train-time augmentation on image batches, seeded so that a resumed run draws the same.

Every random number comes from the ``torch.Generator`` passed in, in a fixed order (crop rows,
crop columns, flips), so the same generator state gives the same batch. Batches are ``[B, C, H, W]``
and stay on their device; the work is index arithmetic and one gather, with no loop over images.
"""

from __future__ import annotations

from typing import Sequence

import torch


def random_crop_flip(
    images: torch.Tensor, generator: torch.Generator, padding: int = 0, flip: bool = False
) -> torch.Tensor:
    """Zero-pad each image by ``padding`` pixels, crop a random ``H x W`` window (an independent
    offset per image), and with ``flip`` mirror each image left-right with probability 0.5.

    ``images`` is uint8 or float ``[B, C, H, W]``; the result has its dtype, shape and device.
    ``padding=0, flip=False`` returns ``images`` itself.
    """
    if images.dim() != 4:
        raise ValueError(f"random_crop_flip takes [B, C, H, W] images, got shape {tuple(images.shape)}")
    if padding < 0:
        raise ValueError(f"padding must be >= 0, got {padding}")
    if padding == 0 and not flip:
        return images
    b, c, h, w = images.shape
    # Draws happen on the generator's device and are moved after, so a CPU generator drives a
    # GPU batch and the numbers do not depend on where the batch lives.
    gdev = generator.device
    rows = torch.arange(h, device=gdev).expand(b, h)
    cols = torch.arange(w, device=gdev).expand(b, w)
    if padding > 0:
        rows = rows + torch.randint(0, 2 * padding + 1, (b, 1), generator=generator, device=gdev)
        cols = cols + torch.randint(0, 2 * padding + 1, (b, 1), generator=generator, device=gdev)
    if flip:
        # A flipped crop reads its window's columns right to left.
        flipped = torch.rand(b, 1, generator=generator, device=gdev) < 0.5
        cols = torch.where(flipped, cols.flip(1), cols)
    dev = images.device
    rows, cols = rows.to(dev), cols.to(dev)
    source = torch.nn.functional.pad(images, (padding,) * 4) if padding > 0 else images
    batch = torch.arange(b, device=dev).view(b, 1, 1, 1)
    channel = torch.arange(c, device=dev).view(1, c, 1, 1)
    return source[batch, channel, rows.view(b, 1, h, 1), cols.view(b, 1, 1, w)]


def normalize(images: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """float32 ``(images / 255 - mean) / std`` per channel, for uint8 (or 0..255 float)
    ``[B, C, H, W]`` images; ``mean`` and ``std`` are in [0, 1] units, one per channel."""
    c = images.shape[1]
    if len(mean) != c or len(std) != c:
        raise ValueError(f"normalize needs one mean and std per channel ({c}), got {len(mean)} and {len(std)}")
    m = torch.tensor(mean, dtype=torch.float32, device=images.device).view(1, c, 1, 1)
    s = torch.tensor(std, dtype=torch.float32, device=images.device).view(1, c, 1, 1)
    return (images.to(torch.float32) / 255.0 - m) / s
