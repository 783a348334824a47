"""Mixup, CutMix and label smoothing on a training batch, as timm's ``Mixup`` in its "batch" mode
(what DeiT trains with, and so Leaner Transformers' ViTs: its Table 6).

One draw per batch: with probability ``prob`` the batch is mixed; when both mixup and CutMix are
on, CutMix is chosen with probability ``switch_prob``; the mixing weight ``lam`` is drawn from
``Beta(alpha, alpha)`` of the one chosen. Each image is mixed with its mirror in the batch (image
``i`` with image ``B - 1 - i``). Mixup blends whole images, ``lam * x + (1 - lam) * partner``;
CutMix pastes the partner's pixels into a box of side ``sqrt(1 - lam)`` times the image's, centred
at a uniformly drawn pixel and clipped to the image, and then sets ``lam`` to the share of the
image left unpasted. The targets are ``lam * smooth(y) + (1 - lam) * smooth(partner's y)``, where
``smooth`` puts ``1 - s + s / C`` on the class and ``s / C`` on every other one (label smoothing
``s`` over ``C`` classes): a soft target whose cross-entropy, unmixed, is
``F.cross_entropy(logits, y, label_smoothing=s)``.
(Facts from timm's ``timm/data/mixup.py``: ``Mixup._params_per_batch``, ``rand_bbox``,
``cutmix_bbox_and_lam`` with ``correct_lam=True``, ``mixup_target``.)

Every number is drawn from the numpy generator passed in, in a fixed order, so a generator seeded
from the batch's own generator gives a resumed run the same mixing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from headwise.families.vision.augment_config import MixConfig


@dataclass(frozen=True)
class MixDraw:
    """What one batch's mixing drew: ``lam`` (1: unmixed), whether it is CutMix and, for CutMix,
    the pasted box ``(top, bottom, left, right)`` (end exclusive) with ``lam`` already set to the
    share of the image outside it; ``beta`` is the Beta draw before that correction."""

    lam: float
    cutmix: bool = False
    box: tuple[int, int, int, int] | None = None
    beta: float = 1.0


def draw_mix(cfg: MixConfig, height: int, width: int, rng: np.random.Generator) -> MixDraw:
    """One batch's mixing for images of ``height x width``, drawn from ``rng`` (see the module
    docstring for the order and the distributions)."""
    if rng.random() >= cfg.prob:
        return MixDraw(1.0)
    if cfg.mixup > 0 and cfg.cutmix > 0:
        cutmix = bool(rng.random() < cfg.switch_prob)
    else:
        cutmix = cfg.cutmix > 0
    alpha = cfg.cutmix if cutmix else cfg.mixup
    beta = float(rng.beta(alpha, alpha))
    if not cutmix:
        return MixDraw(beta, beta=beta)
    ratio = np.sqrt(1.0 - beta)
    cut_h, cut_w = int(height * ratio), int(width * ratio)
    cy, cx = int(rng.integers(0, height)), int(rng.integers(0, width))
    top, bottom = int(np.clip(cy - cut_h // 2, 0, height)), int(np.clip(cy + cut_h // 2, 0, height))
    left, right = int(np.clip(cx - cut_w // 2, 0, width)), int(np.clip(cx + cut_w // 2, 0, width))
    lam = 1.0 - (bottom - top) * (right - left) / (height * width)
    return MixDraw(lam, True, (top, bottom, left, right), beta)


def smooth_targets(labels: torch.Tensor, num_classes: int, smoothing: float = 0.0) -> torch.Tensor:
    """float32 ``[B, num_classes]``: ``1 - smoothing + smoothing / num_classes`` at each label and
    ``smoothing / num_classes`` elsewhere (one-hot for ``smoothing = 0``)."""
    off = smoothing / num_classes
    targets = torch.full((labels.shape[0], num_classes), off, dtype=torch.float32, device=labels.device)
    return targets.scatter_(1, labels.view(-1, 1), 1.0 - smoothing + off)


def apply_mix(images: torch.Tensor, labels: torch.Tensor, draw: MixDraw, num_classes: int,
              smoothing: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``images`` [B, C, H, W] (float, e.g. normalised: mixing is linear, so it commutes with the
    per-channel normalisation) mixed with their mirror in the batch as ``draw`` says, and the soft
    targets [B, num_classes] of the class ids ``labels`` [B]. ``images`` is not modified."""
    targets = smooth_targets(labels, num_classes, smoothing)
    if draw.lam == 1.0:
        return images, targets
    partner = images.flip(0)
    if draw.cutmix:
        top, bottom, left, right = draw.box
        mixed = images.clone()
        mixed[:, :, top:bottom, left:right] = partner[:, :, top:bottom, left:right]
    else:
        mixed = images * draw.lam + partner * (1.0 - draw.lam)
    return mixed, targets * draw.lam + targets.flip(0) * (1.0 - draw.lam)
