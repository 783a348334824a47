"""What every converter to and from a ``transformers`` architecture shares: the check that a
spec meets what the architecture fixes, and the per-block key pairs of its state dict."""

from __future__ import annotations

from headwise.spec import ModelSpec


def fixed_field_problem(spec: ModelSpec, fixed: list[tuple[str, object, str]]) -> str | None:
    """The first of ``fixed`` (spec field, the value an architecture requires, why) that ``spec``
    does not meet, as a reason; None when it meets them all."""
    for field, value, why in fixed:
        if getattr(spec, field) != value:
            return f"{field} = {getattr(spec, field)!r}: {why}"
    return None


def block_pairs(n_layers: int, prefix: str, names: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(headwise name, transformers name) of the weight and bias of each block's modules:
    ``names`` pairs a headwise module (``"mlp.fc"``) with its transformers name under
    ``f"{prefix}{i}."`` (``"mlp.c_fc"`` under ``"transformer.h.{i}."``)."""
    return [(f"blocks.{i}.{a}.{p}", f"{prefix}{i}.{b}.{p}")
            for i in range(n_layers) for a, b in names for p in ("weight", "bias")]
