"""A timm model trained by headwise, exported in timm's own convention: a folder that timm loads,
with ``timm.create_model``, to the same logits.

The folder holds ``model.safetensors`` (the model's own state dict: it is a timm model, so its keys
are timm's), ``config.json`` as timm's :func:`timm.models.save_for_hf` writes it (architecture,
classes, reconstruction arguments, and the preprocessing: the input size and the mean and std the
model was trained with) and ``headwise.json`` (the name, the changes and the ``create_model``
arguments, for a reader). Two calls load it::

    timm.create_model(name, pretrained=True, pretrained_cfg_overlay=pretrained_overlay(folder),
                      **create_model_arguments(name, changes, ...))
    timm.create_model(f"local-dir:{folder}", pretrained=True)  # + attn_layer=... for a held-width ViT

The overlay must carry the class count with the file: with ``dict(file=...)`` alone, timm compares
the model's classes with the name's registered weights' (1,000 mostly) and, if they differ, drops
the trained classifier for a fresh one.

What ``create_model`` can express, its entrypoint passing our arguments through to the family's
builder: every change of ViT, DeiT, XCiT, TNT and DaViT, and the image size, channels and classes;
a held head width of ViT/DeiT as ``attn_layer`` (a class of headwise's, so the Python call needs
headwise; ``local-dir:`` needs it passed). Refused, in one line: XCiT's held head width (timm's XCA
has no setting for it; headwise swaps in its own module after timm builds) and VOLO's depth, heads
and width (its entrypoints fix them: timm raises on an override; its MLP ratios pass).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Sequence

from headwise.errors import HeadwiseError
from headwise.families.vision.timm_models import (Family, TimmChanges, base_arguments, check_image, entry_arguments,
                                                  timm_arguments, timm_family, unchanged_arguments)
from headwise.paths import staged_folder

WEIGHTS = "model.safetensors"
#: what the name's registered weights say of themselves, untrue of headwise's
_PROVENANCE = ("tag", "license", "origin_url", "description", "notes")


def create_model_arguments(name: str, changes: TimmChanges = TimmChanges(), *, num_classes: int = 1000,
                           image_size: int = 224, in_chans: int = 3) -> dict[str, Any]:
    """The keyword arguments with which ``timm.create_model(name, **them)`` builds the model
    :func:`~headwise.families.vision.timm_models.build_timm_model` builds (the same arguments reach
    the family's builder: checked by running the entrypoint), but for stochastic depth, a training
    setting that timm's exports leave out too. Refuses, in one line, what headwise refuses and what
    ``create_model`` cannot express (see the module's docstring)."""
    family = timm_family(name)
    if family is None:
        return unchanged_arguments(name, changes, num_classes, image_size, in_chans)
    arguments = timm_arguments(name, family, changes)
    merged = {**base_arguments(name, family), **arguments}
    check_image(name, family, merged, image_size, in_chans)
    if _holds_width(family, merged, changes.head_dim):
        if family.held_width == "xca":
            raise HeadwiseError(f"{family.label} {name!r} with head_dim={changes.head_dim}: timm.create_model cannot "
                                f"hold XCiT's head width (timm's XCA has no setting for it; headwise swaps in its own)")
        from headwise.families.vision.timm_attention import held_width_attention

        # only where held: at timm's own width it is timm's Attention, and the arguments stay JSON
        arguments["attn_layer"] = held_width_attention(changes.head_dim)
    if family.patch_scale is not None:
        arguments["img_size"] = image_size
    arguments.update(num_classes=num_classes, in_chans=in_chans)
    _check_passed_through(name, family, arguments, changes)
    return arguments


def _holds_width(family: Family, merged: dict[str, Any], head_dim: int | None) -> bool:
    """Whether ``head_dim`` departs from timm's ``width // heads`` in the model of ``merged``
    arguments (only unstaged families hold it)."""
    if head_dim is None or family.held_width is None:
        return False
    return merged[family.width] != merged[family.heads] * head_dim


def _check_passed_through(name: str, family: Family, arguments: dict[str, Any], changes: TimmChanges) -> None:
    """Refuse arguments that ``name``'s entrypoint rejects or does not hand on unchanged."""
    registered = entry_arguments(name, family)[1]
    try:
        passed = entry_arguments(name, family, arguments)[1]
    except TypeError as exc:  # an entrypoint that fixes an argument: "got multiple values for keyword ..."
        raise HeadwiseError(f"{family.label} {name!r}: timm.create_model cannot express {changes.describe()} "
                            f"(its entrypoint fixes the architecture: {exc})") from None
    expected = {**registered, **arguments}
    differing = sorted(k for k in expected.keys() | passed.keys() if passed.get(k) != expected.get(k))
    if differing:
        raise HeadwiseError(f"{family.label} {name!r}: timm.create_model would not build {changes.describe()} as "
                            f"headwise does (its entrypoint changes {', '.join(differing)})")


def export_timm(model, name: str, changes: TimmChanges = TimmChanges(), *, num_classes: int = 1000,
                image_size: int = 224, in_chans: int = 3, out_dir: str | os.PathLike,
                mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                label_names: Sequence[str] | None = None, overwrite: bool = False) -> Path:
    """Write ``model``, headwise's build of ``name`` with ``changes`` for these images and classes,
    into ``out_dir`` in timm's convention (see the module's docstring); ``mean`` and ``std`` are the
    normalisation it was trained with ([0, 1] units, one per channel), ``label_names`` its classes.
    Written in a :func:`~headwise.paths.staged_folder`; refuses a non-empty ``out_dir`` unless
    ``overwrite``, and a model whose tensors are not those of timm's build. Returns the folder."""
    from timm.models import save_for_hf

    out = Path(out_dir)
    _check_target(out, overwrite)
    arguments = create_model_arguments(name, changes, num_classes=num_classes, image_size=image_size,
                                       in_chans=in_chans)
    _check_tensors(model, name, arguments)
    data = {k: tuple(map(float, v)) for k, v in (("mean", mean), ("std", std)) if v is not None}
    if any(len(v) != in_chans for v in data.values()):
        raise HeadwiseError(f"mean and std need one value per channel ({in_chans}), got {mean} and {std}")
    model_config = {"pretrained_cfg": {k: None for k in _PROVENANCE if model.pretrained_cfg.get(k) is not None}}
    if label_names is not None:
        model_config["label_names"] = list(label_names)
    with staged_folder(out, replace=overwrite) as staging:
        save_for_hf(model, staging, model_config=model_config, model_args=_json_arguments(arguments),
                    safe_serialization=True, data_config=data)
        record = dict(timm_model=name, changes={k: v for k, v in dataclasses.asdict(changes).items() if v is not None},
                      num_classes=num_classes, image_size=image_size, in_chans=in_chans,
                      create_model=_json_arguments(arguments, changes.head_dim),
                      pretrained_cfg_overlay=dict(file=WEIGHTS, num_classes=num_classes))
        (staging / "headwise.json").write_text(json.dumps(record, indent=2) + "\n")
    return out


def _check_target(out: Path, overwrite: bool) -> None:
    """Refuse to write over a file, or over a folder with something in it unless ``overwrite``."""
    if out.exists() and not out.is_dir():
        raise HeadwiseError(f"cannot export into {out}: it is a file")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise HeadwiseError(f"{out} exists and is not empty: pass overwrite to replace it")


def _check_tensors(model, name: str, arguments: dict[str, Any]) -> None:
    """Refuse a model whose tensor names or shapes differ from ``timm.create_model(name, **arguments)``'s
    (built on the meta device): timm could not load its weights."""
    import timm
    import torch

    with torch.device("meta"):
        timms = timm.create_model(name, **arguments)
    want = {k: tuple(v.shape) for k, v in timms.state_dict().items()}
    have = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    differing = sorted(k for k in want.keys() | have.keys() if want.get(k) != have.get(k))
    if differing:
        shown = ", ".join(f"{k} {have.get(k, 'missing')} vs timm's {want.get(k, 'none')}" for k in differing[:3])
        raise HeadwiseError(f"the model is not timm's {name!r} with these changes ({len(differing)} tensors differ: "
                            f"{shown})")


def _json_arguments(arguments: dict[str, Any], head_dim: int | None = None) -> dict[str, Any]:
    """``arguments`` as JSON: the held-width ``attn_layer`` (a class) left out, or, given its
    ``head_dim``, written as the call that makes it."""
    out = {k: v for k, v in arguments.items() if k != "attn_layer"}
    if head_dim is not None and "attn_layer" in arguments:
        out["attn_layer"] = f"headwise.families.vision.timm_attention.held_width_attention({head_dim})"
    return out


def pretrained_overlay(folder: str | os.PathLike) -> dict[str, Any]:
    """The ``pretrained_cfg_overlay`` that loads an export: its ``pretrained_cfg`` (classes, input
    size, mean and std) with the weights file."""
    folder = Path(folder)
    cfg = json.loads((folder / "config.json").read_text())["pretrained_cfg"]
    return {**cfg, "file": str(folder / WEIGHTS)}


def export_timm_run(run_dir: str | os.PathLike, out_dir: str | os.PathLike,
                    checkpoint: str | os.PathLike | None = None) -> tuple[Path, str]:
    """Export a run of a timm model (``[model.timm]``) with :func:`export_timm`: its final weights
    (else its latest checkpoint, or ``checkpoint``), normalised as it was trained (its image
    cache's mean and std, when the cache is still there). Returns the folder and the timm name;
    a run of headwise's own model is refused in one line (``headwise export --hf`` writes it)."""
    from headwise.data.cache_files import CacheInvalid
    from headwise.families.vision.cache import ImageCache
    from headwise.families.vision.model_source_timm import TimmSpec
    from headwise.run import read_summary
    from headwise.train.generate import load_run_model

    model, _ = load_run_model(Path(run_dir), Path(checkpoint) if checkpoint is not None else None)
    spec = model.spec
    if not isinstance(spec, TimmSpec):
        raise HeadwiseError(f"{run_dir} is a run of headwise's own model, not a timm model: export it with --hf "
                            "(nothing was written)")
    summary = read_summary(run_dir)
    cache = Path((summary.task if summary is not None else {}).get("cache") or "")
    mean = std = None
    if str(cache) != "." and cache.is_dir():
        try:
            images = ImageCache.open(cache)
            mean, std = images.mean, images.std
        except CacheInvalid:  # rebuilt or damaged since: export without the normalisation
            pass
    folder = export_timm(model.eval(), spec.name, spec.changes(), num_classes=spec.num_classes,
                         image_size=spec.image_size, in_chans=spec.channels, out_dir=out_dir, mean=mean, std=std)
    return folder, spec.name
