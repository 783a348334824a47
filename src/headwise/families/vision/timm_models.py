"""timm image models by name, with Leaner Transformers' changes on top: depth, heads, MLP ratio,
width and head width, per stage where the model has stages.

Five families take the changes, each through timm's own arguments (:data:`FAMILIES`): ViT and DeiT
(``vision_transformer``, ``deit``), XCiT, TNT, VOLO and DaViT. The head width is timm's
``dim // heads`` unless ``head_dim`` holds it: natively for ViT/DeiT (timm's ``attn_head_dim``),
by a held-width XCA for XCiT's cross-covariance blocks (its two class-attention layers keep timm's
width, as the paper's XCiT-M count says); TNT, VOLO and DaViT refuse it. Any other timm model
builds as timm defines it and refuses every change. Whatever a model cannot take is refused in one
line (:class:`~headwise.errors.HeadwiseError`) before timm builds anything, since timm itself
defers most of these mistakes to the first forward pass.

How a model is built: a family's registered names fix their architecture in their bodies (VOLO's
even refuse overrides of it), so the name's arguments are read by calling its entrypoint with the
family's ``_create_*`` builder swapped for one that returns them; the changes then override them
and the family's builder builds. No torch or timm import at module import.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
from dataclasses import dataclass, fields
from functools import cache
from typing import Any
from unittest import mock

from headwise.errors import HeadwiseError

PerStage = int | tuple[int, ...]


@dataclass(frozen=True)
class TimmChanges:
    """Leaner's changes to a timm model; ``None`` keeps timm's. Staged models (VOLO, DaViT) take
    one value per stage; the others one int. ``mlp_ratio`` is one ratio, or one per stage where the
    model takes that (VOLO). ``head_dim`` holds each head's width as heads grow."""

    depth: PerStage | None = None
    heads: PerStage | None = None
    mlp_ratio: float | tuple[float, ...] | None = None
    embed_dim: PerStage | None = None
    head_dim: int | None = None
    #: not one of Leaner's changes: the patch side, for small images (a CPU study's scaled-down model)
    patch_size: int | None = None

    def describe(self) -> str:
        """``depth=7 heads=16 ...``: the changes set, in field order (empty when none is)."""
        return " ".join(f"{f.name}={_show(getattr(self, f.name))}" for f in fields(self)
                        if getattr(self, f.name) is not None)


@dataclass(frozen=True)
class Family:
    """How timm builds one family of models: its module and builder, the names of its arguments,
    whether it has stages, and how it can hold a head's width (``native``, ``xca`` or not at all)."""

    label: str
    module: str
    builder: str
    cls: str
    depth: str
    heads: str
    width: str
    staged: bool = False
    mlp_per_stage: bool = False
    held_width: str | None = None
    #: the image side must be a multiple of ``patch_size`` times this (VOLO halves once more);
    #: ``None``: no ``img_size`` argument, any side (DaViT pads its windows)
    patch_scale: int | None = 1
    #: the patch sides the family's patch embedding can make (None: any)
    patch_sizes: tuple[int, ...] | None = None


_VIT = dict(label="ViT/DeiT", cls="VisionTransformer", depth="depth", heads="num_heads", width="embed_dim",
            held_width="native")
FAMILIES: dict[str, Family] = {f.module: f for f in (
    Family(module="vision_transformer", builder="_create_vision_transformer", **_VIT),
    Family(module="deit", builder="_create_deit", **_VIT),
    # XCiT's convolutional patch embedding has stems for 8 and 16 only
    Family("XCiT", "xcit", "_create_xcit", "Xcit", "depth", "num_heads", "embed_dim", held_width="xca",
           patch_sizes=(8, 16)),
    Family("TNT", "tnt", "_create_tnt", "TNT", "depth", "num_heads_outer", "embed_dim"),
    Family("VOLO", "volo", "_create_volo", "VOLO", "layers", "num_heads", "embed_dims", staged=True,
           mlp_per_stage=True, patch_scale=2),
    Family("DaViT", "davit", "_create_davit", "DaVit", "depths", "num_heads", "embed_dims", staged=True,
           patch_scale=None),
)}


def _show(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def timm_unavailable() -> str | None:
    """Why timm cannot be used here (``None``: it can): not installed, or not importable."""
    if importlib.util.find_spec("timm") is None:
        return "timm is not installed (pip install 'headwise[vision]')"
    try:
        importlib.import_module("timm")
    except Exception as exc:  # timm installed beside a torch it cannot load with
        return f"timm cannot be imported: {exc}"
    return None


def timm_family(name: str) -> Family | None:
    """The family of timm model ``name`` (``None``: a model that takes no changes); refuses an
    unknown name with the closest known ones."""
    import timm

    if not timm.is_model(name):
        close = _closest(name, timm.list_models())
        hint = f" (closest: {', '.join(close)})" if close else ""
        raise HeadwiseError(f"unknown timm model {name!r}{hint}")
    module = timm.models.model_entrypoint(name).__module__.rpartition(".")[2]
    return FAMILIES.get(module)


def _closest(name: str, names: list[str], n: int = 3) -> list[str]:
    """The ``n`` names closest to ``name``: first by their beginning (timm's names grow by suffixes:
    ``deit_tiny`` means ``deit_tiny_patch16_224``), then whole; none that is not close at all."""
    def score(other: str) -> tuple[float, float]:
        return (difflib.SequenceMatcher(None, name, other[:len(name)]).ratio(),
                difflib.SequenceMatcher(None, name, other).ratio())

    return [m for m in sorted(names, key=score, reverse=True)[:n] if score(m)[0] >= 0.6]


def entry_arguments(name: str, family: Family, kwargs: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """The variant and the arguments ``name``'s entrypoint, called with ``kwargs`` as
    ``timm.create_model`` calls it, hands its family's builder (swapped for one that records them:
    nothing is built)."""
    import timm

    module = importlib.import_module(f"timm.models.{family.module}")
    seen: list[tuple[str, dict[str, Any]]] = []

    def capture(variant, pretrained=False, **arguments):
        seen.append((variant, arguments))

    with mock.patch.object(module, family.builder, capture):
        timm.models.model_entrypoint(name)(**(kwargs or {}))
    if not seen:
        raise HeadwiseError(f"timm model {name!r} is not built by {family.module}.{family.builder}: "
                            f"headwise cannot read its arguments")
    return seen[0]


@cache
def _registered(name: str, family: Family) -> tuple[str, tuple[tuple[str, Any], ...]]:
    """:func:`entry_arguments` of ``name`` as registered (no arguments given), frozen."""
    variant, arguments = entry_arguments(name, family)
    return variant, tuple(arguments.items())


def base_arguments(name: str, family: Family) -> dict[str, Any]:
    """Every architecture argument of ``name`` as timm builds it: the class's defaults, then its
    registered ones."""
    module = importlib.import_module(f"timm.models.{family.module}")
    defaults = {k: p.default for k, p in inspect.signature(getattr(module, family.cls)).parameters.items()
                if p.default is not inspect.Parameter.empty}
    return {**defaults, **dict(_registered(name, family)[1])}


def _values(what: str, value: Any, count: int, family: Family, name: str, kind: type = int) -> tuple:
    """``value`` as ``count`` entries (one per stage, or one for all), refusing a wrong length or a
    value that is not a positive number of ``kind``."""
    values = tuple(value) if isinstance(value, tuple | list) else (value,)
    if len(values) != count:
        where = f"has {count} stages" if count > 1 else \
            f"takes one {what} value for all its {'stages' if family.staged else 'layers'}"
        raise HeadwiseError(f"{family.label} {name!r} {where}: {what} has {len(values)} values ({_show(values)})")
    if not all(isinstance(v, kind | int) and not isinstance(v, bool) and v > 0 for v in values):
        raise HeadwiseError(f"{family.label} {name!r}: {what} must be positive {kind.__name__}s, got {_show(values)}")
    return values


def _per_stage(base: Any) -> tuple:
    return tuple(base) if isinstance(base, tuple | list) else (base,)


def timm_arguments(name: str, family: Family, changes: TimmChanges) -> dict[str, Any]:
    """The arguments that apply ``changes`` to ``name``'s family builder (``head_dim`` is applied
    by :func:`build_timm_model`); refuses what the family cannot take, in one line."""
    base = base_arguments(name, family)
    stages = len(_per_stage(base[family.depth]))
    out: dict[str, Any] = {}
    for what, arg in (("depth", family.depth), ("heads", family.heads), ("embed_dim", family.width)):
        value = getattr(changes, what)
        if value is not None:
            values = _values(what, value, stages, family, name)
            out[arg] = values if family.staged else values[0]
    if changes.mlp_ratio is not None:
        several = isinstance(changes.mlp_ratio, tuple | list) and len(changes.mlp_ratio) > 1
        ratios = _values("mlp_ratio", changes.mlp_ratio, stages if several and family.mlp_per_stage else 1,
                         family, name, float)
        out["mlp_ratio"] = tuple(map(float, ratios)) if several else float(ratios[0])
    if changes.patch_size is not None:
        if "patch_size" not in base:
            raise HeadwiseError(f"{family.label} {name!r} has no patch size to change (timm's {family.cls} "
                                "takes no patch_size)")
        out["patch_size"] = _values("patch_size", changes.patch_size, 1, family, name)[0]
        if family.patch_sizes is not None and out["patch_size"] not in family.patch_sizes:
            raise HeadwiseError(f"{family.label} {name!r} takes patch_size {' or '.join(map(str, family.patch_sizes))}, "
                                f"got {out['patch_size']}")
    widths = _per_stage(out.get(family.width, base[family.width]))
    heads = _per_stage(out.get(family.heads, base[family.heads]))
    _check_head_width(name, family, widths, heads, changes.head_dim)
    return out


def block_layout(name: str, changes: TimmChanges = TimmChanges()) -> list[tuple[int, int, int]]:
    """``(heads, head width, model width)`` of each block of ``name`` with ``changes``, stage after
    stage (a model of no family above has none: it takes no changes and headwise does not read its
    blocks). Refuses what :func:`timm_arguments` refuses."""
    family = timm_family(name)
    if family is None:
        return []
    merged = {**base_arguments(name, family), **timm_arguments(name, family, changes)}
    depths, heads, widths = (_per_stage(merged[arg]) for arg in (family.depth, family.heads, family.width))
    if len(widths) == 1:  # an unstaged model: one width and head count for every block
        heads, widths = heads * len(depths), widths * len(depths)
    held = changes.head_dim if family.held_width is not None else None
    return [(h, held or w // h, w) for d, h, w in zip(depths, heads, widths) for _ in range(d)]


def _check_head_width(name: str, family: Family, widths: tuple, heads: tuple, head_dim: int | None) -> None:
    """Refuse head counts that do not divide a width that is split over them, and a held head
    width the family cannot hold."""
    if head_dim is not None and (not isinstance(head_dim, int) or head_dim <= 0):
        raise HeadwiseError(f"{family.label} {name!r}: head_dim must be a positive int, got {head_dim!r}")
    held = head_dim is not None and any(w != h * head_dim for w, h in zip(widths, heads))
    if held and family.held_width is None:
        raise HeadwiseError(f"{family.label} {name!r} cannot hold head_dim={head_dim}: timm's {family.cls} has no "
                            f"head-width setting (its heads are {family.width}/{family.heads} wide)")
    if held and family.held_width == "native":
        return  # timm's attn_head_dim: the width need not split over the heads
    for w, h in zip(widths, heads):
        if w % h:
            why = " (its class-attention layers split it over the same heads)" if held else ""
            raise HeadwiseError(f"{family.label} {name!r}: {family.heads}={h} does not divide "
                                f"{family.width}={w}{why}")


def check_image(name: str, family: Family, base: dict[str, Any], image_size: int, in_chans: int) -> None:
    """Refuse images the model cannot take: a side that is not a whole number of its patches."""
    if in_chans < 1 or image_size < 1:
        raise HeadwiseError(f"{name!r}: images need a positive size and channel count, got "
                            f"{image_size} px and {in_chans} channels")
    if family.patch_scale is not None:
        step = base["patch_size"] * family.patch_scale
        if image_size % step:
            raise HeadwiseError(f"{family.label} {name!r} takes images whose side is a multiple of {step}; "
                                f"got {image_size}")


def build_timm_model(name: str, changes: TimmChanges = TimmChanges(), *, num_classes: int = 1000,
                     image_size: int = 224, in_chans: int = 3, drop_path: float = 0.0):
    """timm model ``name`` with ``changes``, for ``num_classes`` classes of ``image_size`` px
    images with ``in_chans`` channels, stochastic depth rising to ``drop_path`` (timm's
    ``drop_path_rate``), on torch's default device (``with torch.device("meta")`` builds it
    without weights). Refuses, in one line, what the model cannot take."""
    family = timm_family(name)
    if family is None:
        return _build_unchanged(name, changes, num_classes, image_size, in_chans, drop_path)
    arguments = timm_arguments(name, family, changes)
    base = {**base_arguments(name, family), **arguments}
    check_image(name, family, base, image_size, in_chans)
    if changes.head_dim is not None and family.held_width == "native":
        from headwise.families.vision.timm_attention import held_width_attention

        arguments["attn_layer"] = held_width_attention(changes.head_dim)
    if family.patch_scale is not None:
        arguments["img_size"] = image_size
    variant, registered = _registered(name, family)
    builder = getattr(importlib.import_module(f"timm.models.{family.module}"), family.builder)
    model = builder(variant, pretrained=False,
                    **{**dict(registered), **arguments, "num_classes": num_classes, "in_chans": in_chans,
                       "drop_path_rate": drop_path})
    if changes.head_dim is not None and family.held_width == "xca":
        _hold_xca_width(model, changes.head_dim)
    return model


def _hold_xca_width(model, head_dim: int) -> None:
    """Replace every XCiT block's XCA by a held-width one unless it already has that width,
    initialised as timm initialises the model's linear layers."""
    from headwise.families.vision.timm_attention import HeldWidthXCA

    for block in model.blocks:
        xca = block.attn
        if xca.qkv.in_features != xca.num_heads * head_dim:
            block.attn = HeldWidthXCA.replacing(xca, head_dim)
            block.attn.apply(model._init_weights)


def unchanged_arguments(name: str, changes: TimmChanges, num_classes: int, image_size: int,
                        in_chans: int) -> dict[str, Any]:
    """The ``create_model`` arguments of a model of no family above: timm's, refusing every change;
    ``img_size`` only where it differs from the model's own input size (convolutional models take none)."""
    import timm

    if changes != TimmChanges():
        raise HeadwiseError(f"timm model {name!r} takes no changes ({changes.describe()}): headwise changes "
                            f"ViT, DeiT, XCiT, TNT, VOLO and DaViT only")
    own = timm.models.get_pretrained_cfg_value(name, "input_size")
    size = {} if own is None or own[-1] == image_size else {"img_size": image_size}
    return dict(num_classes=num_classes, in_chans=in_chans, **size)


def _build_unchanged(name: str, changes: TimmChanges, num_classes: int, image_size: int, in_chans: int,
                     drop_path: float):
    """A model of no family above, as :func:`unchanged_arguments` gives it."""
    import timm

    arguments = unchanged_arguments(name, changes, num_classes, image_size, in_chans)
    try:
        # only when asked: not every timm model takes drop_path_rate
        return timm.create_model(name, pretrained=False, **arguments,
                                 **({"drop_path_rate": drop_path} if drop_path else {}))
    except TypeError as exc:
        raise HeadwiseError(f"timm model {name!r} cannot take {image_size} px images: {exc}") from None


def count_parameters(name: str, changes: TimmChanges = TimmChanges(), *, num_classes: int = 1000,
                     image_size: int = 224, in_chans: int = 3) -> int:
    """The parameter count of :func:`build_timm_model`'s model, built on the meta device (no weights)."""
    import torch

    with torch.device("meta"):
        model = build_timm_model(name, changes, num_classes=num_classes, image_size=image_size, in_chans=in_chans)
    return sum(p.numel() for p in model.parameters())
