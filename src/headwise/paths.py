"""Small facts about output paths, checked before anything is written."""

from __future__ import annotations

import os
from pathlib import Path


def nearest_existing(path: Path) -> Path:
    """``path`` itself when it exists, else its nearest existing ancestor ("." or "/" at the
    latest, so a relative path without parents such as "." is its own answer). When that is a
    file, nothing can be made at ``path``."""
    return next((p for p in (path, *path.parents) if p.exists()), Path("."))


def refuse_unwritable_parent(flag: str, out: Path, what: str) -> None:
    """A HeadwiseError when ``out``'s parent (where a folder written beside it and renamed into
    place is made) may not be written, naming the flag and ``what`` would have been written."""
    from headwise.errors import HeadwiseError

    blocked = unwritable(Path(out).parent)
    if blocked is not None:
        raise HeadwiseError(f"{flag} {out}: {blocked} is not writable, so {what} cannot be written there; give "
                            "another folder (nothing was written)")


def unwritable(path: Path) -> Path | None:
    """The existing folder that making or changing ``path`` writes into (``path`` itself, else
    its nearest existing ancestor) when this user may not write there; None when it may (or
    when that is a file: the callers say so in their own words)."""
    existing = nearest_existing(path)
    return existing if existing.is_dir() and not os.access(existing, os.W_OK | os.X_OK) else None
