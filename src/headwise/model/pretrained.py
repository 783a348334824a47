"""Saved models: ``model.safetensors`` with the spec beside it as ``spec.json``."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_model, save_model

from headwise.config import atomic_write_text
from headwise.errors import HeadwiseError
from headwise.model.transformer import Transformer
from headwise.spec import ModelSpec

SPEC_FILE = "spec.json"
WEIGHTS_FILE = "model.safetensors"


def save_pretrained(model: Transformer, directory: str | Path) -> None:
    """Write ``model.safetensors`` and ``spec.json`` into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{WEIGHTS_FILE}.tmp"
    save_model(model, str(tmp))
    tmp.replace(directory / WEIGHTS_FILE)
    atomic_write_text(directory / SPEC_FILE, json.dumps(model.spec.to_dict(), indent=2))


def load_pretrained(directory: str | Path, map_location: str | torch.device = "cpu") -> Transformer:
    """Build the model of ``spec.json`` and load ``model.safetensors``; they must agree. A folder
    that is not such a pair is the user's bad input (HeadwiseError)."""
    directory = Path(directory)
    spec_path, weights_path = directory / SPEC_FILE, directory / WEIGHTS_FILE
    for p in (spec_path, weights_path):
        if not p.is_file():
            raise HeadwiseError(f"{p} is missing: {directory} is not a saved headwise model")
    spec = ModelSpec.parse(json.loads(spec_path.read_text()), source=str(spec_path))
    model = Transformer(spec)
    try:
        load_model(model, str(weights_path), strict=True, device=str(map_location))
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()
        detail = next((line.strip() for line in first[1:] if line.strip()), first[0] if first else "")
        raise HeadwiseError(f"{weights_path} does not match {spec_path}: {detail}") from None
    return model
