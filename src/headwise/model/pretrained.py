"""Saved models: ``model.safetensors`` with the spec beside it as ``spec.json``, and a
``manifest.json`` naming each file's size and sha256.

The manifest is written last, so a folder whose files all match it is complete and intact. A
folder without one (saved before manifests existed, or whose save was cut short) is still
loaded, after the checks that need no manifest: ``spec.json`` parses as a spec, and the
safetensors header parses and accounts for the file's exact size (a truncated file fails).
A file that fails is a :class:`DamagedFile`, named in one line.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Iterable

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model

from headwise.config import atomic_write_text, sha256_file
from headwise.errors import HeadwiseError
from headwise.model.transformer import Transformer
from headwise.model_sources import read_source_spec
from headwise.spec import ModelSpec

SPEC_FILE = "spec.json"
WEIGHTS_FILE = "model.safetensors"
MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "headwise-manifest/1"


class DamagedFile(HeadwiseError):
    """A file headwise wrote is truncated, altered, unreadable or missing. ``str()`` is one line,
    ``"<path> is damaged: <reason>"`` (``"<path> is missing"``); callers add what to do about it."""

    def __init__(self, path: str | Path, reason: str | None = None) -> None:
        self.path, self.reason = Path(path), reason or "it is missing"
        super().__init__(f"{self.path} is damaged: {reason}" if reason else f"{self.path} is missing")


# ------------------------------------------------------------------------- manifests


def write_manifest(directory: str | Path, names: Iterable[str]) -> None:
    """Write ``directory/manifest.json``: the size and sha256 of each named file (written last,
    after the files themselves)."""
    directory = Path(directory)
    files = {name: {"size": (directory / name).stat().st_size, "sha256": sha256_file(directory / name)}
             for name in names}
    atomic_write_text(directory / MANIFEST_FILE, json.dumps({"format": MANIFEST_FORMAT, "files": files}, indent=2))


def read_manifest(directory: str | Path) -> dict[str, dict[str, Any]] | None:
    """The ``files`` table of ``directory/manifest.json``; None when the folder has no manifest."""
    path = Path(directory) / MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
        files = data["files"]
        if data.get("format") != MANIFEST_FORMAT or not isinstance(files, dict) or not all(
                isinstance(v, dict) and isinstance(v.get("size"), int) and isinstance(v.get("sha256"), str)
                for v in files.values()):
            raise ValueError("not a headwise manifest")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DamagedFile(path, f"it does not parse ({first_line(exc)})") from None
    return files


def verify_manifest(directory: str | Path) -> bool:
    """Check every file ``directory/manifest.json`` lists against its size and sha256 (raises
    DamagedFile); False when there is no manifest to check against."""
    directory = Path(directory)
    files = read_manifest(directory)
    if files is None:
        return False
    for name, entry in files.items():
        path = directory / name
        if not path.is_file():
            raise DamagedFile(path)
        size = path.stat().st_size
        if size != entry["size"]:
            raise DamagedFile(path, f"it is {size:,} bytes, {MANIFEST_FILE} says {entry['size']:,}")
        if sha256_file(path) != entry["sha256"]:
            raise DamagedFile(path, f"its sha256 differs from the one in {MANIFEST_FILE}")
    return True


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message`` of an exception, for one-line reasons."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")


# ------------------------------------------------------------------------- checks without a manifest


def check_safetensors(path: str | Path) -> None:
    """Check that ``path`` is a whole safetensors file: a header that parses and whose tensors
    end exactly at the end of the file (raises DamagedFile)."""
    path = Path(path)
    size = path.stat().st_size
    if size < 8:
        raise DamagedFile(path, f"it is {size} bytes, too short for a safetensors file")
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n == 0 or 8 + n > size:
            raise DamagedFile(path, f"its header length ({n:,} bytes) does not fit the file ({size:,} bytes)")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise DamagedFile(path, f"its header does not parse ({first_line(exc)})") from None
    expected = 8 + n + max(ends, default=0)
    if size != expected:
        raise DamagedFile(path, f"it is {size:,} bytes, its header says {expected:,} (truncated or appended to)")


#: the safetensors dtypes a weights file may hold, as torch dtypes
SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def weights_dtype(path: Path) -> torch.dtype:
    """The dtype of the weights in the safetensors file ``path``: the one its tensors share, where
    it is float32, bfloat16 or float16; else float32."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        names = {f.get_slice(key).get_dtype() for key in f.keys()}
    return SAFETENSORS_DTYPES[names.pop()] if len(names) == 1 and names <= set(SAFETENSORS_DTYPES) else torch.float32


def read_spec(path: str | Path) -> ModelSpec:
    """The spec saved in a ``spec.json``, a headwise model's or another library's
    (:mod:`headwise.model_sources`); a file that does not parse is DamagedFile."""
    path = Path(path)
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except ValueError as exc:
        raise DamagedFile(path, f"it is not JSON ({first_line(exc)})") from None
    if not isinstance(data, dict):
        raise DamagedFile(path, "it is not a JSON object")
    try:
        return read_source_spec(data, str(path)) or ModelSpec.parse(data, source=str(path))
    except HeadwiseError as exc:
        raise DamagedFile(path, f"it is not a model spec ({exc})") from None


def verify_model_dir(directory: str | Path, extra: Iterable[str] = ()) -> bool:
    """Check a saved model folder before loading it: its manifest when it has one, else the
    checks that need none. ``extra`` names further files that must exist. Returns whether a
    manifest vouched for the files; raises DamagedFile (or HeadwiseError for a folder that is
    not a saved model at all)."""
    directory = Path(directory)
    for name in (SPEC_FILE, WEIGHTS_FILE, *extra):
        if not (directory / name).is_file():
            raise DamagedFile(directory / name)
    if verify_manifest(directory):
        return True
    check_safetensors(directory / WEIGHTS_FILE)
    return False


# ------------------------------------------------------------------------- save and load


def save_pretrained(model: Transformer, directory: str | Path, manifest: bool = True) -> None:
    """Write ``model.safetensors``, ``spec.json`` and (unless ``manifest`` is False: the caller
    writes its own, as checkpoints do) ``manifest.json`` into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    # An old manifest would not match the files while they are being replaced.
    (directory / MANIFEST_FILE).unlink(missing_ok=True)
    tmp = directory / f".{WEIGHTS_FILE}.tmp"
    save_model(model, str(tmp))
    tmp.replace(directory / WEIGHTS_FILE)
    atomic_write_text(directory / SPEC_FILE, json.dumps(model.spec.to_dict(), indent=2))
    if manifest:
        write_manifest(directory, (WEIGHTS_FILE, SPEC_FILE))


def load_pretrained(directory: str | Path, map_location: str | torch.device = "cpu",
                    verify: bool = True) -> Transformer:
    """Build the model of ``spec.json`` and load ``model.safetensors``; they must agree. A folder
    that is not such a pair is the user's bad input (HeadwiseError); a damaged file in it is
    :class:`DamagedFile`. ``verify=False`` skips :func:`verify_model_dir`, for a caller that
    has just run it."""
    directory = Path(directory)
    spec_path, weights_path = directory / SPEC_FILE, directory / WEIGHTS_FILE
    if not spec_path.is_file() and not weights_path.is_file():
        raise HeadwiseError(f"{directory} is not a saved headwise model (no {SPEC_FILE} or {WEIGHTS_FILE})")
    if verify:
        verify_model_dir(directory)
    model = read_spec(spec_path).build()
    try:
        load_model(model, str(weights_path), strict=True, device=str(map_location))
    except (SafetensorError, OSError) as exc:
        raise DamagedFile(weights_path, f"it cannot be read ({first_line(exc)})") from None
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()
        detail = next((line.strip() for line in first[1:] if line.strip()), first[0] if first else "")
        raise HeadwiseError(f"{weights_path} does not match {spec_path}: {detail}") from None
    return model
