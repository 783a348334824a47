"""Image classification's train-time augmentation settings, ``[task.augment]`` (crop and flip,
timm's RandAugment, mixup and CutMix): read by the ``[task]`` table and by the code that applies
them (:mod:`~headwise.families.vision.randaugment`, :mod:`~headwise.families.vision.mixing`), so
they sit apart from both (no torch)."""

from __future__ import annotations

import importlib.util

from pydantic import Field, model_validator

from headwise.config import Config
from headwise.errors import HeadwiseError

#: timm's ``_LEVEL_DENOM``: the magnitude at which an operation reaches its full range
LEVEL_DENOM = 10.0


class RandAugmentConfig(Config):
    """``[task.augment.randaugment]``: timm's RandAugment (``rand-m9-mstd0.5`` is
    ``{ ops = 2, magnitude = 9, magnitude_std = 0.5 }``)."""

    #: operations drawn per image (timm's ``n``)
    ops: int = Field(default=2, ge=1)
    #: the magnitude on timm's scale, 0 to 10 (timm's ``m``)
    magnitude: float = Field(ge=0, le=LEVEL_DENOM, allow_inf_nan=False)
    #: the standard deviation of each operation's magnitude (timm's ``mstd``); 0: fixed
    magnitude_std: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    #: the probability that a drawn operation is applied (timm's ``p``)
    prob: float = Field(default=0.5, ge=0, le=1)


def require_kornia() -> None:
    """Refuse, in one line, a RandAugment where kornia is not installed: checked before any data
    is prepared, so a run (or a whole study) does not decode its images first and fail after."""
    if importlib.util.find_spec("kornia") is None:
        raise HeadwiseError("task.augment.randaugment needs kornia, which is not installed: "
                            "pip install 'headwise[vision]' (or remove randaugment)")


class MixConfig(Config):
    """``[task.augment.mix]``: mixup and CutMix on training batches (timm's ``Mixup``, batch mode)."""

    #: mixup's Beta(alpha, alpha); 0: no mixup (DeiT: 0.8)
    mixup: float = Field(default=0.0, ge=0)
    #: CutMix's Beta(alpha, alpha); 0: no CutMix (DeiT: 1.0)
    cutmix: float = Field(default=0.0, ge=0)
    #: the probability that a batch is mixed at all
    prob: float = Field(default=1.0, ge=0, le=1)
    #: with both on, the probability that a mixed batch uses CutMix rather than mixup
    switch_prob: float = Field(default=0.5, ge=0, le=1)

    @model_validator(mode="after")
    def _something_mixes(self) -> "MixConfig":
        if self.mixup == 0 and self.cutmix == 0:
            raise ValueError("mix needs mixup > 0 or cutmix > 0 (each is a Beta alpha): set one, or remove the table")
        return self


class AugmentConfig(Config):
    """``[task.augment]``: train-time augmentation (evaluation images are never augmented). The
    recipe of DeiT (and Leaner Transformers' ViTs) adds
    ``randaugment = { ops = 2, magnitude = 9, magnitude_std = 0.5 }`` and
    ``mix = { mixup = 0.8, cutmix = 1.0 }``."""

    #: zero padding before a random crop back to the image size (CIFAR's usual 4); 0: no crop
    crop_padding: int = Field(default=0, ge=0)
    #: a random horizontal flip (not for digits or text)
    flip: bool = False
    #: timm's RandAugment after the crop and flip (needs kornia); None: none
    randaugment: RandAugmentConfig | None = None
    #: mixup and CutMix of each training batch (timm's ``Mixup``, batch mode); None: none
    mix: MixConfig | None = None
