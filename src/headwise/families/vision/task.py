"""Image classification's ``[task]`` table (``kind = "images"``, registers the family): where the
images are, the shape they must have, and the training augmentation's settings (crop and flip,
timm's RandAugment, mixup and CutMix, label smoothing). Its task,
:class:`~headwise.families.vision.image_task.ImageTask`, is imported when the table builds it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from headwise.data.cache_files import CacheInvalid
from headwise.errors import HeadwiseError
from headwise.families.vision.augment_config import AugmentConfig, require_kornia
from headwise.families.vision.cache import ImageCache, image_cache_path, prepare_images
from headwise.tasks.classify import TOP5_ABOVE, accuracy_metrics
from headwise.tasks.family import Dims, TaskConfigBase, TaskFamily, register_family

if TYPE_CHECKING:
    from headwise.families.vision.image_task import ImageTask

class ImageTaskConfig(TaskConfigBase):
    """``[task]`` of image classification::

        [task]
        kind = "images"
        source = "fashion-mnist"     # a folder or file, a name under $HEADWISE_DATA, or a hub dataset
        augment = { crop_padding = 2 }
    """

    kind: Literal["images"] = "images"
    #: the data: a path, a name found under ``$HEADWISE_DATA``, or a hub dataset ``owner/name``
    source: str
    format: Literal["auto", "idx", "cifar", "parquet", "folder", "hub"] = "auto"
    #: resize to this side (shorter side, then a centre crop); None: the data's own size, which
    #: must then be square and the same for every image
    image_size: int | None = Field(default=None, gt=0)
    #: what the data must have (checked when it is read), so that a study knows its models'
    #: shapes before any data is prepared
    channels: int | None = Field(default=None, gt=0)
    num_classes: int | None = Field(default=None, gt=0)
    #: train on this many training images (evenly spaced, so classes stay balanced); None: all
    train_examples: int | None = Field(default=None, gt=0)
    #: evaluate on this many test images (evenly spaced); None: all
    eval_examples: int | None = Field(default=None, gt=0)
    #: hold out this many training images (evenly spaced) and evaluate on them instead of the test
    #: split: the selection split for choosing settings (a study's [nuisance]); 0: none
    holdout: int = Field(default=0, ge=0)
    eval_batch_size: int = Field(default=256, gt=0)
    augment: AugmentConfig = AugmentConfig()
    #: the training targets put this much probability evenly on every class (inside mixup's
    #: targets when mixing, as timm does); the eval loss stays the plain cross-entropy. None (or
    #: 0): none
    label_smoothing: float | None = Field(default=None, ge=0, lt=1)
    #: where decoded images are cached; None: ``$HEADWISE_CACHE`` or ``~/.cache/headwise``
    cache_dir: str | None = None

    def dims(self) -> Dims:
        """No vocabulary, one image per example, no vector inputs."""
        return Dims(None, 1)

    def spec_fields(self) -> dict[str, Any]:
        """The image side, channels and classes this table states (the data is checked against them)."""
        fields = {"image_size": self.image_size, "channels": self.channels, "num_classes": self.num_classes}
        return {k: v for k, v in fields.items() if v is not None}

    def reported_metrics(self) -> tuple[str, ...]:
        """Accuracy, and top-5 accuracy above 10 classes: both when the table does not state its
        class count (the data may have more or fewer)."""
        return accuracy_metrics(self.num_classes or TOP5_ABOVE + 1)

    def setup_line(self, facts: dict[str, Any]) -> str:
        return (f"image classification on {facts.get('data') or self.source}, {facts.get('classes', '?')} classes at "
                f"{facts.get('image_size', '?')} px, {facts.get('train_images', '?')} training images, "
                f"{facts.get('eval_images', '?')} eval images")

    def data_description(self) -> str:
        return f"{self.source} images" + (f" at {self.image_size} px" if self.image_size else "")

    def prepare(self, progress: bool = False) -> None:
        """Decode the images into the image cache (or check the cache already there)."""
        self._check_requirements()
        self.cache(progress=progress)

    def _check_requirements(self) -> None:
        """What the table asks for that this machine must have, refused before any data is read."""
        if self.augment.randaugment is not None:
            require_kornia()

    def cache(self, cache_dir: str | Path | None = None, rebuild: bool = False, progress: bool = False) -> ImageCache:
        """The image cache of this table's data, built or reused (``rebuild``: built again), and
        checked against the shape the table states."""
        cache = prepare_images(self.source, format=self.format, image_size=self.image_size,
                               cache_dir=cache_dir or self.cache_dir, rebuild=rebuild, progress=progress)
        data = cache.spec_fields()
        for key, value in self.spec_fields().items():
            have = data[key]
            if have != value:
                raise HeadwiseError(
                    f"[task] {key} = {value}, but {self.source} has {have} ({cache.description}): "
                    f"set task.{key} = {have} or remove it"
                )
        return cache

    def cache_info(self, cache_dir: str | Path | None = None) -> dict[str, Any]:
        """Where this table's image cache is and whether it is ready (opened cheaply, not built)."""
        folder = image_cache_path(self.source, self.format, self.image_size, cache_dir or self.cache_dir)
        summary: dict[str, Any] = {"data": self.data_description(), "cache": str(folder), "ready": False}
        if folder.exists():
            try:
                summary.update(ImageCache.open(folder).summary())
                summary["ready"] = True
            except CacheInvalid as exc:
                summary["problem"] = str(exc)
        return summary

    def build(self, cache_dir: str | Path | None = None, progress: bool = False) -> ImageTask:
        """The task on the image cache, which is prepared (or reused) first."""
        from headwise.families.vision.image_task import ImageTask

        self._check_requirements()
        cache = self.cache(cache_dir, progress=progress)
        return ImageTask(cache, train_examples=self.train_examples, eval_examples=self.eval_examples,
                         eval_batch_size=self.eval_batch_size, crop_padding=self.augment.crop_padding,
                         flip=self.augment.flip, holdout=self.holdout, randaugment=self.augment.randaugment,
                         mix=self.augment.mix, label_smoothing=self.label_smoothing or 0.0)


IMAGE_FAMILY = register_family(TaskFamily(kind="images", config=ImageTaskConfig, inputs="images",
                                          outputs="classes", report_layout="vision", caches=(ImageCache,)))
