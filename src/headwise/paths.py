"""Small facts about output paths, checked before anything is written."""

from __future__ import annotations

import os
from pathlib import Path


def nearest_existing(path: Path) -> Path:
    """``path`` itself when it exists, else its nearest existing ancestor ("." or "/" at the
    latest, so a relative path without parents such as "." is its own answer). When that is a
    file, nothing can be made at ``path``."""
    return next((p for p in (path, *path.parents) if p.exists()), Path("."))


def unwritable(path: Path) -> Path | None:
    """The existing folder that making or changing ``path`` writes into (``path`` itself, else
    its nearest existing ancestor) when this user may not write there; None when it may (or
    when that is a file: the callers say so in their own words)."""
    existing = nearest_existing(path)
    return existing if existing.is_dir() and not os.access(existing, os.W_OK | os.X_OK) else None
