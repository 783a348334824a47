"""Crash-safe checkpoints: ``checkpoints/step_XXXXXXXX/`` plus a ``latest`` pointer.

A checkpoint is written into a hidden temporary directory, every file and the directory are
fsynced, the directory is renamed into place, and only then is ``checkpoints/latest`` (a text
file naming it) replaced atomically. ``latest`` is the commit point: a kill at any moment
leaves the previous checkpoint as the latest, loadable, and :func:`clean_uncommitted` removes
whatever a killed save left behind.

Each checkpoint directory holds ``model.safetensors``, ``spec.json``, ``trainer.pt`` (optimiser,
schedule, every RNG state, data positions) and, written last before the rename,
``manifest.json`` with each file's size and sha256 (see :mod:`headwise.model.pretrained`).
:func:`load_checkpoint` checks a checkpoint against it (or, for checkpoints older than
manifests, checks what can be checked without one) and names a damaged file in one line;
``--resume`` then falls back to an older checkpoint (:mod:`headwise.train.resume`).
"""

from __future__ import annotations

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
from headwise.model import SPEC_FILE, WEIGHTS_FILE, Transformer, save_pretrained
from headwise.model.pretrained import DamagedFile, first_line, load_pretrained, verify_model_dir, write_manifest
from headwise.run.layout import CHECKPOINTS_DIR
from headwise.spec import ModelSpec

LATEST = "latest"
STATE_FILE = "trainer.pt"
_STEP_DIR = re.compile(r"step_(\d{8,})")
_TMP_PREFIX = ".tmp_"
#: a damaged checkpoint that ``--resume`` skipped is renamed to this prefix + its name
DAMAGED_PREFIX = "damaged_"
#: what every trainer state holds (and each of its ``ranks``)
_STATE_KEYS = ("step", "tokens", "train_time_s", "wall_time_s", "last_eval_loss", "world_size", "optimizer",
               "scheduler", "ranks")
_RANK_KEYS = ("rng", "stream", "loss_sum", "unlogged")


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


def read_latest(run_dir: Path) -> str | None:
    """The checkpoint name ``checkpoints/latest`` holds, or None when there is no such file
    (DamagedFile when it holds no checkpoint name)."""
    pointer = Path(run_dir) / CHECKPOINTS_DIR / LATEST
    if not pointer.exists():
        return None
    try:
        name = pointer.read_bytes().decode("utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise DamagedFile(pointer, f"it cannot be read ({type(exc).__name__})") from None
    if not _STEP_DIR.fullmatch(name):
        raise DamagedFile(pointer, f"it holds {name[:40]!r}, not a checkpoint name like step_00001000")
    return name


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint ``checkpoints/latest`` names, or None when the run has none."""
    name = read_latest(run_dir)
    if name is None:
        return None
    path = Path(run_dir) / CHECKPOINTS_DIR / name
    if not (path / STATE_FILE).is_file():
        raise DamagedFile(path.parent / LATEST, f"it names {name}, which is missing or incomplete: the run "
                                                "directory was altered")
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
    save_pretrained(model, tmp, manifest=False)
    torch.save(state, tmp / STATE_FILE)
    write_manifest(tmp, (WEIGHTS_FILE, SPEC_FILE, STATE_FILE))
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
    """The trainer state of a checkpoint directory (DamagedFile when it cannot be read as one).

    Loaded with ``weights_only=False``: it holds the task stream's own state, which may be any
    picklable object, and headwise wrote the file itself. Only load checkpoints you trust.
    """
    file = Path(path) / STATE_FILE
    if not file.is_file():
        raise DamagedFile(file)
    try:
        state = torch.load(file, map_location="cpu", weights_only=False)
    except Exception as exc:  # unpickling a damaged file can fail in any number of ways
        raise DamagedFile(file, f"it cannot be loaded ({first_line(exc)})") from None
    missing = [k for k in _STATE_KEYS if not isinstance(state, dict) or k not in state]
    if not missing and (not isinstance(state["ranks"], list) or len(state["ranks"]) != state["world_size"]):
        missing = ["one entry per process in 'ranks'"]
    if not missing:
        missing = [k for r in state["ranks"] for k in _RANK_KEYS if not isinstance(r, dict) or k not in r][:1]
    if missing:
        raise DamagedFile(file, f"it is not a trainer state (it lacks {missing[0]})")
    return state


def load_checkpoint(path: Path) -> tuple[Transformer, dict[str, Any]]:
    """The model (on the CPU) and trainer state of a checkpoint directory, after checking its
    files against its manifest (or, without one, what can be checked without it). A damaged or
    inconsistent checkpoint raises HeadwiseError (DamagedFile when a file is damaged)."""
    path = Path(path)
    verify_model_dir(path, extra=(STATE_FILE,))
    model = load_pretrained(path, verify=False)
    state = load_state(path)
    m = _STEP_DIR.fullmatch(path.name)
    if m and state["step"] != int(m.group(1)):
        raise DamagedFile(path / STATE_FILE, f"it holds the state of step {state['step']}, not of {path.name}")
    return model, state


def move_damaged(path: Path) -> Path:
    """Rename a damaged checkpoint directory out of the way (``damaged_step_XXXXXXXX``, with a
    suffix if that is taken), so that it neither counts towards ``checkpoint.keep`` nor is
    taken for a committed checkpoint. Returns the new path."""
    target = path.with_name(DAMAGED_PREFIX + path.name)
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{DAMAGED_PREFIX}{path.name}.{n}")
    os.replace(path, target)
    return target


def point_latest(run_dir: Path, path: Path) -> None:
    """Make ``checkpoints/latest`` name ``path`` (atomically)."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    atomic_write_text(root / LATEST, Path(path).name)
    _fsync_path(root)


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
