"""Named model presets, as data (litgpt style): ``spec_from_preset(name, **overrides)``.

A preset is a dict of :class:`~headwise.spec.ModelSpec` fields. Each family writes its own in its
folder's ``presets`` module (``families/vision/presets.py``: the ViTs), registering each with
:func:`register_preset`; the first lookup imports every family's ``presets`` modules
(:func:`headwise.families.import_family_modules`), so a new preset edits no shared file.
Importing this module imports no family and no torch.
"""

from __future__ import annotations

from typing import Any

from headwise.registry import Registry
from headwise.spec import ModelSpec


def _discover() -> None:
    # imported here, not at the top: the families (and torch) load on the first lookup only
    from headwise.families import import_family_modules

    import_family_modules("presets")


#: every registered preset's spec fields, by name
PRESETS: Registry[dict[str, Any]] = Registry("model preset", discover=_discover)


def register_preset(name: str, fields: dict[str, Any]) -> dict[str, Any]:
    """Register the spec fields of preset ``name`` (once); returns them."""
    return PRESETS.register(name, fields)


def preset_dict(name: str) -> dict[str, Any]:
    """The spec fields of a named preset (a copy); an unknown name is a one-line HeadwiseError
    naming the presets."""
    return {k: (list(v) if isinstance(v, list) else v) for k, v in PRESETS.get(name).items()}


def spec_from_preset(name: str, **overrides: Any) -> ModelSpec:
    """A ModelSpec from a named preset with fields overridden."""
    return ModelSpec.parse({**preset_dict(name), **overrides}, source=f"preset {name}")
