"""RandAugment as timm draws it (``rand-m9-mstd0.5``: DeiT's and so Leaner Transformers' ViTs),
applied with kornia's image operations.

For each image and each of ``ops`` slots, timm (``timm/data/auto_augment.py``: ``RandAugment``,
``AugmentOp``, ``rand_augment_transform``) picks one of 15 operations uniformly (with
replacement), applies it with probability ``prob`` (0.5), at a magnitude drawn from
``N(magnitude, magnitude_std)`` and clipped to [0, 10]; magnitude 10 is an operation's full
range. The draws here are the same, per image. Each operation's argument is timm's at that
magnitude (its ``LEVEL_TO_ARG`` for the non-"increasing" set): see :data:`OPERATIONS`. The pixel
work is kornia's (``kornia.augmentation.auto.operations``), which for three operations computes
something other than PIL does (docs/data.md lists how); SolarizeAdd is computed here as timm
does (kornia's also inverts pixels above a threshold it draws at random).

kornia is imported when a :class:`RandAugment` is made, so a run without it never loads kornia.
Its operations draw from torch's global generator (a sign for the symmetric ones); those draws
run under a fork of it seeded from the batch's own generator, so they are reproducible, a resumed
run makes the same ones, and the global generator (dropout, drop path) is left as it was.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from headwise.errors import HeadwiseError
from headwise.families.vision.augment_config import LEVEL_DENOM, RandAugmentConfig

# Each operation's kornia argument at magnitude fraction f = magnitude / 10, as a function of f
# [k] and the image's height and width. timm's argument is given beside each one.
MagnitudeFn = Callable[[torch.Tensor, int, int], torch.Tensor]


def _enhance(f: torch.Tensor, h: int, w: int) -> torch.Tensor:
    return 0.1 + 1.8 * f  # timm _enhance_level_to_arg: a PIL ImageEnhance factor in [0.1, 1.9]


def _rotate(f: torch.Tensor, h: int, w: int) -> torch.Tensor:
    return 30.0 * f  # timm _rotate_level_to_arg: degrees in [0, 30], sign random (kornia draws it)


def _shear(f: torch.Tensor, h: int, w: int) -> torch.Tensor:
    # timm _shear_level_to_arg: a shear factor s in [0, 0.3]. kornia's shear is the angle
    # (argument x 180) degrees with the factor its tangent: atan(s) / pi gives the factor s.
    return torch.atan(0.3 * f) / math.pi


def _translate_x(f: torch.Tensor, h: int, w: int) -> torch.Tensor:
    return 0.45 * f * w  # timm _translate_rel_level_to_arg (translate_pct 0.45), in pixels for kornia


def _translate_y(f: torch.Tensor, h: int, w: int) -> torch.Tensor:
    return 0.45 * f * h


def _posterize(f: torch.Tensor, h: int, w: int) -> torch.Tensor:
    return torch.floor(4.0 * f)  # timm _posterize_level_to_arg: int(4 f) bits kept


def _solarize(f: torch.Tensor, h: int, w: int) -> torch.Tensor:
    # timm _solarize_level_to_arg: pixels >= min(256, int(256 f)) of 255 are inverted (kornia: >= too)
    return torch.clamp(torch.floor(256.0 * f), max=256.0) / 255.0


def _solarize_add(f: torch.Tensor, h: int, w: int) -> torch.Tensor:
    return torch.clamp(torch.floor(110.0 * f), max=128.0) / 255.0  # timm _solarize_add_level_to_arg


def solarize_add(x: torch.Tensor, add: torch.Tensor) -> torch.Tensor:
    """timm's ``solarize_add`` on [0, 1] images ``x`` [k, C, H, W]: ``add`` [k] (in [0, 1] units)
    added to the pixels below 128 of 255, capped at 1, the others left alone. Computed here
    because kornia's SolarizeAdd also inverts pixels above a threshold it draws per image."""
    return torch.where(x < 128.0 / 255.0, (x + add.view(-1, 1, 1, 1)).clamp(max=1.0), x)


@dataclass(frozen=True)
class Operation:
    """One RandAugment operation: timm's name, the kornia operation class and its arguments, and
    its magnitude mapping (None: it has no magnitude); ``colour``: it needs 3 channels (on a
    1-channel image it is the identity, as PIL's is on a greyscale image)."""

    name: str
    #: the kornia operation's class, or None where ``direct`` computes it
    kornia: str | None
    args: dict[str, Any]
    magnitude: MagnitudeFn | None = None
    colour: bool = False
    #: the operation computed here (images, magnitude) instead of by kornia
    direct: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None


def _ranged(low: float, high: float, symmetric: bool = False) -> dict[str, Any]:
    """A kornia operation's arguments for a magnitude that is always given (the range only bounds
    kornia's own draw, which is replaced); ``symmetric``: kornia gives it a random sign."""
    return {"initial_magnitude": None, "magnitude_range": (low, high), "symmetric_megnitude": symmetric}


#: timm's ``_RAND_TRANSFORMS`` in its order, each with the kornia operation that performs it
OPERATIONS: tuple[Operation, ...] = (
    Operation("AutoContrast", "AutoContrast", {}),
    Operation("Equalize", "Equalize", {}),
    Operation("Invert", "Invert", {}),
    Operation("Rotate", "Rotate", _ranged(0.0, 30.0, symmetric=True), _rotate),
    Operation("Posterize", "Posterize", _ranged(0.0, 8.0), _posterize),
    Operation("Solarize", "Solarize", _ranged(0.0, 1.0), _solarize),
    Operation("SolarizeAdd", None, {}, _solarize_add, direct=solarize_add),
    Operation("Color", "Saturate", _ranged(0.1, 1.9), _enhance, colour=True),
    Operation("Contrast", "Contrast", _ranged(0.1, 1.9), _enhance),
    Operation("Brightness", "Brightness", _ranged(0.1, 1.9), _enhance),
    Operation("Sharpness", "Sharpness", _ranged(0.1, 1.9), _enhance),
    Operation("ShearX", "ShearX", _ranged(0.0, 0.3, symmetric=True), _shear),
    Operation("ShearY", "ShearY", _ranged(0.0, 0.3, symmetric=True), _shear),
    Operation("TranslateXRel", "TranslateX", _ranged(0.0, 0.45, symmetric=True), _translate_x),
    Operation("TranslateYRel", "TranslateY", _ranged(0.0, 0.45, symmetric=True), _translate_y),
)


@dataclass(frozen=True)
class Plan:
    """One batch's draws, ``[ops, B]`` each: the operation (an index into :data:`OPERATIONS`),
    whether it is applied, and its magnitude fraction (the clipped magnitude / 10); ``seed``
    seeds kornia's own draws."""

    choice: torch.Tensor
    applied: torch.Tensor
    level: torch.Tensor
    seed: int


class RandAugment:
    """timm's RandAugment on uint8 ``[B, C, H, W]`` batches with kornia's operations (see the
    module docstring); a missing kornia is a :class:`HeadwiseError` here."""

    def __init__(self, cfg: RandAugmentConfig) -> None:
        try:
            from kornia.augmentation.auto.operations import ops as kornia_ops
        except ImportError:
            raise HeadwiseError("task.augment.randaugment needs kornia, which is not installed: "
                                "pip install 'headwise[vision]' (or remove randaugment)") from None
        self.cfg = cfg
        # probability 1 inside kornia: whether an operation applies is drawn here, per image
        self.modules = [None if op.kornia is None else getattr(kornia_ops, op.kornia)(initial_probability=1.0, **op.args)
                        for op in OPERATIONS]

    def plan(self, batch: int, generator: torch.Generator) -> Plan:
        """The draws for a batch of ``batch`` images, from ``generator`` in a fixed order."""
        shape = (self.cfg.ops, batch)
        choice = torch.randint(len(OPERATIONS), shape, generator=generator)
        applied = torch.rand(shape, generator=generator) < self.cfg.prob
        noise = torch.randn(shape, generator=generator)
        level = (self.cfg.magnitude + self.cfg.magnitude_std * noise).clamp(0.0, LEVEL_DENOM) / LEVEL_DENOM
        seed = int(torch.randint(2**62, (), generator=generator))
        return Plan(choice, applied, level, seed)

    def __call__(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """``images`` (uint8 ``[B, C, H, W]``) augmented, as uint8; ``generator`` is stepped."""
        return self.apply(images, self.plan(images.shape[0], generator))

    def apply(self, images: torch.Tensor, plan: Plan) -> torch.Tensor:
        """``images`` (uint8 ``[B, C, H, W]``) with ``plan``'s operations applied in slot order,
        computed in [0, 1] floats and rounded back to uint8 (as PIL works on 8-bit images)."""
        _, c, h, w = images.shape
        x = images.to(torch.float32) / 255.0
        with torch.random.fork_rng(devices=[]):
            torch.random.default_generator.manual_seed(plan.seed)
            for slot in range(plan.choice.shape[0]):
                for k, (op, module) in enumerate(zip(OPERATIONS, self.modules)):
                    rows = torch.nonzero((plan.choice[slot] == k) & plan.applied[slot]).flatten()
                    if rows.numel() == 0 or (op.colour and c != 3):
                        continue
                    part = x[rows]
                    mag = None if op.magnitude is None else op.magnitude(plan.level[slot, rows], h, w)
                    if op.direct is not None:
                        x[rows] = op.direct(part, mag)
                    else:
                        x[rows] = module(part, module.forward_parameters(part.shape, mag=mag))
        return (x * 255.0).round_().clamp_(0, 255).to(torch.uint8)
