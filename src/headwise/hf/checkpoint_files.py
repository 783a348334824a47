"""A ``transformers`` checkpoint folder's safetensors weights: one ``model.safetensors``, or the
shards its ``model.safetensors.index.json`` names (as ``save_pretrained`` writes them with a
``max_shard_size``). One reader for both ends: the importer checks a folder before
``transformers`` loads it, and :func:`headwise.hf.models.load_export` loads one itself."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from headwise.model.pretrained import DamagedFile, check_safetensors, first_line

#: the weights of an unsharded safetensors checkpoint, and the index of a sharded one
SAFETENSORS, SHARD_INDEX = "model.safetensors", "model.safetensors.index.json"


def has_safetensors(folder: Path) -> bool:
    """Whether the folder holds safetensors weights, whole or sharded."""
    return (folder / SAFETENSORS).is_file() or (folder / SHARD_INDEX).is_file()


def safetensors_files(folder: Path) -> dict[str, list[str]]:
    """Each weights file of the folder and the tensors its index puts there (``[]`` for an
    unsharded ``model.safetensors``, which ``transformers`` reads first when both exist); empty
    when the folder has neither. A damaged index is :class:`DamagedFile`."""
    index = folder / SHARD_INDEX
    if (folder / SAFETENSORS).is_file():
        return {SAFETENSORS: []}
    if not index.is_file():
        return {}
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        shards: dict[str, list[str]] = {}
        for tensor, shard in weight_map.items():
            shards.setdefault(str(shard), []).append(tensor)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # JSON errors are ValueErrors
        raise DamagedFile(index, f"it is not a shard index ({first_line(exc)})") from None
    # save_pretrained writes shards beside their index: a path elsewhere is not a checkpoint of this folder
    elsewhere = sorted(name for name in shards if Path(name).name != name or name in ("", ".", ".."))
    if elsewhere:
        raise DamagedFile(index, f"it names the shard {elsewhere[0]!r}, which is not a file beside it")
    return shards


def check_weights(folder: Path) -> dict[str, list[str]]:
    """The folder's :func:`safetensors_files`, each checked whole and holding the tensors its
    index puts there (``transformers`` would take them from any shard); else :class:`DamagedFile`
    naming the file."""
    from safetensors import safe_open

    files = safetensors_files(folder)
    for name, tensors in sorted(files.items()):
        path = folder / name
        if not path.is_file():
            raise DamagedFile(folder / SHARD_INDEX, f"it names the shard {name}, which is missing")
        check_safetensors(path)
        with safe_open(str(path), "pt") as f:
            missing = sorted(set(tensors) - set(f.keys()))
        if missing:
            raise DamagedFile(folder / SHARD_INDEX, f"it puts {missing[0]} in {name}, which does not hold it")
    return files


def load_weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's safetensors weights, checked first (:func:`check_weights`)."""
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for name in check_weights(folder):
        state.update(load_file(str(folder / name)))
    return state
