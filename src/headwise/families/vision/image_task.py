"""Image classification: decoded images from the image cache in, class logits out (the task
:class:`~headwise.families.vision.task.ImageTaskConfig` builds).

Inputs are float32 ``[B, C, H, W]`` images normalised with the training split's per-channel mean
and standard deviation; targets are int64 class ids ``[B]``; the model returns logits
``[B, classes]`` (a ViT: ``inputs = "images"``, ``outputs = "classes"``). The trainer counts
images (the task's unit), so ``train.epochs`` is passes over the training images.

Training order: a :class:`~headwise.data.shuffled.ShuffledStream` over the training images
(reshuffled every epoch, shared out among data-parallel ranks); augmentation draws from the
generator it seeds by ``(seed, rank, position)``, so a resumed stream gives the same pixels. In
order: random crop after zero padding and horizontal flip; RandAugment
(:mod:`~headwise.families.vision.randaugment`); normalisation; mixup or CutMix
(:mod:`~headwise.families.vision.mixing`). With mixing or label smoothing the training targets
are class distributions ``[B, classes]`` (float32) instead of ids, which the cross-entropy takes
as they are; evaluation batches keep class ids, so the eval loss is the plain cross-entropy and
accuracy is against the true class. Evaluation reads the test split (or evenly spaced images of
it), unaugmented; with ``holdout = N`` it reads N training images held out of training instead (a
selection split).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from headwise.data.shuffled import ShuffledStream, evenly_spaced
from headwise.errors import HeadwiseError
from headwise.families.vision.augment import normalize, random_crop_flip
from headwise.families.vision.cache import ImageCache
from headwise.families.vision.mixing import apply_mix, draw_mix, smooth_targets
from headwise.families.vision.randaugment import RandAugment
from headwise.families.vision.augment_config import MixConfig, RandAugmentConfig
from headwise.tasks.base import Batch, BatchStream
from headwise.tasks.classify import ClassificationTask, accuracy_metrics


class EvalImages(Sequence[Batch]):
    """The fixed evaluation batches, normalised when read (a large test split stays uint8 on disk)."""

    def __init__(self, task: "ImageTask", index: np.ndarray, batch_size: int) -> None:
        self.task = task
        self.chunks = [index[i:i + batch_size] for i in range(0, len(index), batch_size)]

    def __len__(self) -> int:
        return len(self.chunks)

    def __getitem__(self, item: int | slice) -> Any:
        if isinstance(item, slice):
            return [self.task.batch(self.task.eval_split, c) for c in self.chunks[item]]
        return self.task.batch(self.task.eval_split, self.chunks[item])


class ImageTask(ClassificationTask):
    """Classification of cached images (see the module docstring)."""

    inputs = "images"
    unit = "images"
    # images have no vocabulary to pad, and a timm model's forward takes the images alone
    forward_options: dict[str, Any] = {}

    def __init__(self, cache: ImageCache, *, train_examples: int | None = None, eval_examples: int | None = None,
                 eval_batch_size: int = 256, crop_padding: int = 0, flip: bool = False, holdout: int = 0,
                 randaugment: RandAugmentConfig | None = None, mix: MixConfig | None = None,
                 label_smoothing: float = 0.0) -> None:
        self.cache = cache
        n_train = cache.num_examples("train")
        if holdout >= n_train:
            raise HeadwiseError(f"task.holdout = {holdout} leaves no training images of {n_train}: hold out fewer")
        # a hold-out of the training split replaces the test split for evaluation (choosing settings)
        held = evenly_spaced(n_train, holdout) if holdout else np.empty(0, dtype=np.int64)
        rest = np.setdiff1d(np.arange(n_train, dtype=np.int64), held)
        self.train_index = rest[evenly_spaced(len(rest), train_examples)]
        self.eval_split = "train" if holdout else "test"
        self.eval_index = (held[evenly_spaced(len(held), eval_examples)] if holdout
                           else evenly_spaced(cache.num_examples("test"), eval_examples))
        self.eval_batch_size, self.crop_padding, self.flip = eval_batch_size, crop_padding, flip
        # kornia is imported here, and only for a task that uses RandAugment
        self.randaugment = RandAugment(randaugment) if randaugment is not None else None
        self.mix, self.label_smoothing = mix, label_smoothing
        self.metric_names = accuracy_metrics(cache.num_classes)

    @property
    def vocab_size(self) -> None:
        return None

    @property
    def seq_len(self) -> int:
        """One image per example: the trainer's "tokens" are images."""
        return 1

    @property
    def num_classes(self) -> int:
        """Classes of the data."""
        return self.cache.num_classes

    def spec_fields(self) -> dict[str, Any]:
        """The image's side and channels and the class count, which a model must match."""
        return self.cache.spec_fields()

    def batch(self, split: str, index: np.ndarray, generator: torch.Generator | None = None) -> Batch:
        """Images ``index`` of ``split`` as a normalised batch, augmented when a generator is given."""
        # Sorted reads are sequential in the memory-mapped file; the order is restored after.
        order = np.argsort(index, kind="stable")
        images = np.empty((len(index), *self.cache.images(split).shape[1:]), dtype=np.uint8)
        images[order] = self.cache.images(split)[index[order]]
        pixels = torch.from_numpy(images).permute(0, 3, 1, 2)
        if generator is not None:
            pixels = random_crop_flip(pixels, generator, padding=self.crop_padding, flip=self.flip)
            if self.randaugment is not None:
                pixels = self.randaugment(pixels, generator)
        labels = torch.from_numpy(np.asarray(self.cache.labels(split)[index], dtype=np.int64))
        inputs = normalize(pixels, self.cache.mean, self.cache.std)
        if generator is None or (self.mix is None and not self.label_smoothing):
            return Batch(inputs=inputs, targets=labels)
        if self.mix is None:
            return Batch(inputs=inputs, targets=smooth_targets(labels, self.num_classes, self.label_smoothing))
        # numpy draws the Beta (torch draws none from a given generator), seeded from the batch's generator
        rng = np.random.default_rng(int(torch.randint(2**62, (), generator=generator)))
        draw = draw_mix(self.mix, inputs.shape[2], inputs.shape[3], rng)
        inputs, targets = apply_mix(inputs, labels, draw, self.num_classes, self.label_smoothing)
        return Batch(inputs=inputs, targets=targets)

    def train_stream(self, micro_batch: int, seed: int, rank: int = 0, world_size: int = 1) -> BatchStream:
        return ShuffledStream(len(self.train_index), self._train_batch, micro_batch, seed, rank, world_size,
                              kind="images")

    def _train_batch(self, picked: np.ndarray, generator: torch.Generator) -> Batch:
        return self.batch("train", self.train_index[picked], generator)

    def eval_batches(self) -> Sequence[Batch]:
        return EvalImages(self, self.eval_index, self.eval_batch_size)

    def tokens_per_epoch(self) -> int:
        """Training images in one pass."""
        return len(self.train_index)

    def describe(self) -> dict[str, Any]:
        c = self.cache
        return {
            "task": "images",
            "data": c.description,
            "cache": str(c.path),
            "classes": c.num_classes,
            "image_size": c.image_size,
            "channels": c.channels,
            "train_images": len(self.train_index),
            "eval_images": len(self.eval_index),
            "eval_split": self.eval_split,
            "augment": self._augment_facts(),
            # the loss and accuracy of guessing uniformly, for scale
            "chance_loss": math.log(c.num_classes),
            "chance_accuracy": 1 / c.num_classes,
        }

    def _augment_facts(self) -> dict[str, Any]:
        """The training augmentation for the summary: the recipe's parts only where they are on."""
        facts: dict[str, Any] = {"crop_padding": self.crop_padding, "flip": self.flip}
        if self.randaugment is not None:
            facts["randaugment"] = self.randaugment.cfg.to_dict()
        if self.mix is not None:
            facts["mix"] = self.mix.to_dict()
        if self.label_smoothing:
            facts["label_smoothing"] = self.label_smoothing
        return facts
