"""Crash-safe checkpoints: ``checkpoints/step_XXXXXXXX/`` plus a ``latest`` pointer.

A checkpoint is written into a hidden temporary directory, every file and the directory are
fsynced, the directory is renamed into place, and only then is ``checkpoints/latest`` (a text
file naming it) replaced atomically. ``latest`` is the commit point: a kill at any moment
leaves the previous checkpoint as the latest, loadable, and :func:`clean_uncommitted` removes
whatever a killed save left behind.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from headwise.config import atomic_write_text
from headwise.errors import HeadwiseError
from headwise.model import SPEC_FILE, Transformer, save_pretrained
from headwise.run.layout import CHECKPOINTS_DIR
from headwise.spec import ModelSpec

LATEST = "latest"
STATE_FILE = "trainer.pt"
_STEP_DIR = re.compile(r"step_(\d{8,})")
_TMP_PREFIX = ".tmp_"


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(directory: Path) -> None:
    """Flush every file of ``directory`` and the directory itself to disk."""
    for p in directory.iterdir():
        if p.is_file():
            _fsync_path(p)
    _fsync_path(directory)


def checkpoint_dirs(run_dir: Path) -> list[tuple[int, Path]]:
    """``(step, directory)`` of the checkpoints renamed into place, oldest first (whether or not
    ``latest`` has committed them yet: see :func:`latest_checkpoint`)."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_DIR.fullmatch(p.name)
        if m and p.is_dir():
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint ``checkpoints/latest`` names, or None when the run has none."""
    pointer = Path(run_dir) / CHECKPOINTS_DIR / LATEST
    if not pointer.is_file():
        return None
    path = pointer.parent / pointer.read_text(encoding="utf-8").strip()
    if not (path / STATE_FILE).is_file():
        raise HeadwiseError(f"{pointer} names {path.name}, which is missing or incomplete: the run directory was altered")
    return path


def clean_uncommitted(run_dir: Path) -> None:
    """Remove what an interrupted save left: temporary directories and checkpoints newer than
    ``latest`` (renamed into place but never committed; a resumed run writes them again)."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return
    for p in root.iterdir():
        if p.name.startswith(_TMP_PREFIX):
            shutil.rmtree(p, ignore_errors=True)
        elif p.name.startswith(".") and p.name.endswith(".tmp"):  # a torn write of `latest`
            p.unlink()
    latest = latest_checkpoint(run_dir)
    latest_step = step_of(latest) if latest is not None else -1
    for step, p in checkpoint_dirs(run_dir):
        if step > latest_step:
            shutil.rmtree(p)


def step_of(path: Path) -> int:
    m = _STEP_DIR.fullmatch(Path(path).name)
    if not m:
        raise HeadwiseError(f"{path} is not a checkpoint directory (expected a name like step_00001000)")
    return int(m.group(1))


def save_checkpoint(run_dir: Path, step: int, model: Transformer, state: dict[str, Any], keep: int) -> Path:
    """Write the checkpoint of ``step`` atomically, point ``latest`` at it, keep the newest ``keep``."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(step)
    tmp = root / f"{_TMP_PREFIX}{final.name}"
    if tmp.exists():
        shutil.rmtree(tmp)
    save_pretrained(model, tmp)
    torch.save(state, tmp / STATE_FILE)
    _fsync_tree(tmp)
    if final.exists():  # the same step saved twice (e.g. a periodic save that is also the last step)
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_path(root)
    atomic_write_text(root / LATEST, final.name)
    _fsync_path(root)
    for _, old in checkpoint_dirs(run_dir)[:-keep]:
        shutil.rmtree(old)
    return final


def load_state(path: Path) -> dict[str, Any]:
    """The trainer state of a checkpoint directory.

    Loaded with ``weights_only=False``: it holds the task stream's own state, which may be any
    picklable object, and headwise wrote the file itself. Only load checkpoints you trust.
    """
    return torch.load(Path(path) / STATE_FILE, map_location="cpu", weights_only=False)


def checkpoint_spec(path: Path) -> ModelSpec:
    """The model spec saved with a checkpoint."""
    spec_path = Path(path) / SPEC_FILE
    return ModelSpec.parse(json.loads(spec_path.read_text(encoding="utf-8")), source=str(spec_path))


def spec_difference(a: ModelSpec, b: ModelSpec) -> str | None:
    """The first field where two specs differ, as ``"name: a vs b"``; None when they are equal."""
    da, db = a.model_dump(), b.model_dump()
    for key in da:
        if da[key] != db[key]:
            return f"{key}: {da[key]!r} vs {db[key]!r}"
    return None


def rng_state() -> dict[str, Any]:
    """Every random generator a run draws from: torch (CPU and CUDA), numpy and Python's."""
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": (np_state[0], torch.from_numpy(np_state[1].copy()), *np_state[2:]),
        "python": random.getstate(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore :func:`rng_state`."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy(), *rest))
    random.setstate(state["python"])


#: Settings a resumed run may change: how long it runs and what it records. Anything else
#: would make the continued run a different run from the one its checkpoints come from.
RESUMABLE_CHANGES = ("train.steps", "train.epochs", "train.tokens", "train.log_every", "train.compile",
                     "train.device", "train.peak_flops", "eval.", "checkpoint.", "analysis.")


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_difference(saved: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Dotted keys whose values differ between two config dicts, excluding RESUMABLE_CHANGES."""
    a, b = _flatten(saved), _flatten(new)
    keys = sorted(set(a) | set(b))
    return [k for k in keys if a.get(k) != b.get(k) and not any(
        k == r or (r.endswith(".") and k.startswith(r)) for r in RESUMABLE_CHANGES)]
