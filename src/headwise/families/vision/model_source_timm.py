"""``[model.timm]``: a run's model is a timm image model by name, with Leaner Transformers' changes
(registers the ``timm`` model source, :mod:`headwise.model_sources`)::

    [model.timm]
    name = "xcit_nano_12_p16_224"
    depth = 12
    heads = 8
    embed_dim = 64
    patch_size = 8            # small images: a scaled-down model
    drop_path = 0.1

A preset of Tables 4-5 (``[model] preset = "timm-xcit-m-reduced"``) fills the table; the task's data
sets the image side, channels and classes. Resolving reads the model's blocks from timm (which
loads torch); the spec is saved as ``{"timm": fields}``.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from pydantic import Field

from headwise.config import Config
from headwise.errors import HeadwiseError
from headwise.families.vision.timm_models import TimmChanges, block_layout, build_timm_model, count_parameters
from headwise.model_sources import MODEL_SOURCES
from headwise.plans import Plan

#: the fields the task's data sets (the names its ``spec_fields`` use)
_DATA_FIELDS = ("image_size", "channels", "num_classes")


def _tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


class TimmSpec(Config):
    """A timm image model with Leaner's changes (:class:`~headwise.families.vision.timm_models.TimmChanges`;
    None keeps timm's), stochastic depth, and the images it takes (the task's)."""

    name: str
    depth: int | list[int] | None = None
    heads: int | list[int] | None = None
    mlp_ratio: float | list[float] | None = None
    embed_dim: int | list[int] | None = None
    head_dim: int | None = Field(default=None, gt=0)
    patch_size: int | None = Field(default=None, gt=0)
    #: stochastic depth rising over the blocks to this rate (timm's ``drop_path_rate``)
    drop_path: float = Field(default=0.0, ge=0, lt=1)
    image_size: int | None = Field(default=None, gt=0)
    channels: int | None = Field(default=None, gt=0)
    num_classes: int | None = Field(default=None, gt=0)

    def changes(self) -> TimmChanges:
        """The changes to timm's model this spec asks for."""
        return TimmChanges(depth=_tuple(self.depth), heads=_tuple(self.heads), mlp_ratio=_tuple(self.mlp_ratio),
                           embed_dim=_tuple(self.embed_dim), head_dim=self.head_dim, patch_size=self.patch_size)

    @classmethod
    def resolve(cls, fields: dict[str, Any], shape, where: str) -> tuple[TimmSpec, Plan]:
        """The spec of ``[model.timm]`` for a task of ``shape``: the data's image side, channels and
        classes filled in (a different value set here is refused), the changes checked against the
        model, and the plan of its blocks' heads."""
        if shape.inputs != "images":
            raise HeadwiseError(f"{where}: a timm model takes images, and this task's inputs are {shape.inputs!r}")
        spec = cls.parse(fields, source=f"{where} [model.timm]")
        data = {key: shape.spec_fields.get(key) for key in _DATA_FIELDS}
        for key, value in data.items():
            mine = getattr(spec, key)
            if value is not None and mine is not None and mine != value:
                raise HeadwiseError(f"{where}: [model.timm] {key} = {mine}, but the task's data has {value}: "
                                    f"remove {key}, or use data of {mine}" + (" (a paper preset is for 224 px RGB "
                                    "ImageNet images: give the model's name and changes for other images)"
                                    if key != "num_classes" else ""))
        spec = spec.model_copy(update={k: v for k, v in data.items() if v is not None})
        missing = [key for key in _DATA_FIELDS if getattr(spec, key) is None]
        if missing:
            raise HeadwiseError(f"{where}: the model's {', '.join(missing)} are not known: set them in [task] "
                                f"({', '.join(f'task.{k}' for k in missing)})")
        layout = spec.layout
        spec.check_images()
        return spec, Plan.explicit([h for h, _, _ in layout], [d for _, d, _ in layout])

    @cached_property
    def layout(self) -> list[tuple[int, int, int]]:
        """``(heads, head width, width)`` of every block (:func:`~headwise.families.vision.timm_models.block_layout`)."""
        return block_layout(self.name, self.changes())

    def check_images(self) -> None:
        """Refuse images the model cannot take (a meta build: no weights)."""
        import torch

        with torch.device("meta"):
            self.build()

    def build(self):
        """The timm model, with this spec as its ``spec`` (what a checkpoint saves beside it)."""
        model = build_timm_model(self.name, self.changes(), num_classes=self.num_classes, image_size=self.image_size,
                                 in_chans=self.channels, drop_path=self.drop_path)
        model.spec = self
        return model

    def parameter_count(self) -> int:
        """The model's parameters (counted on a meta build)."""
        return count_parameters(self.name, self.changes(), num_classes=self.num_classes, image_size=self.image_size,
                                in_chans=self.channels)

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per image: three times a forward pass's (the backward costs two), counted
        by torch's :class:`~torch.utils.flop_counter.FlopCounterMode` on a meta build. ``seq_len``
        is the task's and does not change an image model's count."""
        import torch
        from torch.utils.flop_counter import FlopCounterMode

        with torch.device("meta"):
            model = self.build().eval()
            image = torch.empty(1, self.channels, self.image_size, self.image_size)
            with FlopCounterMode(display=False) as counter:
                model(image)
        return 3 * counter.get_total_flops()

    def kv_cache_budget(self) -> None:
        """None: an image model decodes nothing."""
        return None

    def analyze(self, model, batches):
        """Condition numbers, entropies and effective ranks of the model's attention on ``batches``
        of images, through timm's attention modules (:mod:`~headwise.families.vision.timm_analysis`)."""
        from headwise.families.vision.timm_analysis import analyze_timm_model

        return analyze_timm_model(model, batches)

    def heads_line(self) -> str:
        """``timm NAME, heads per block [...]``: how a run announces its model."""
        return f"timm {self.name} {self.changes().describe()}".rstrip() + f", heads {[h for h, _, _ in self.layout]}"

    @property
    def d_model(self) -> int:
        """The first block's width (staged models widen stage by stage)."""
        return self.layout[0][2]

    # what a run's commands ask of any spec: the data it reads and answers (no vocabulary)
    causal = property(lambda self: False)
    inputs = property(lambda self: "images")
    output_head = property(lambda self: "classes")
    vocab_size = property(lambda self: None)
    pad_id = property(lambda self: None)

    def to_dict(self) -> dict[str, Any]:
        """``{"timm": fields}``: the spec as a resolved run config's ``[model]`` and a checkpoint's
        ``spec.json`` hold it (:meth:`parse` reads the inner fields)."""
        return {"timm": super().to_dict()}


MODEL_SOURCES.register("timm", TimmSpec)
