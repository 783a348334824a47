"""Small facts about output paths, checked before anything is written, and the staging folder
(:func:`staged_folder`) that a folder written whole is made in."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def staged_folder(out: Path, *, replace: bool = False) -> Iterator[Path]:
    """A hidden folder beside ``out`` (its missing parents made) to write a folder whole into,
    renamed to ``out`` when the block ends. A failure anywhere, the rename's too, removes it and
    the parents made for it, and leaves what was there as it was. ``out`` may be an empty folder
    already or, with ``replace``, anything: it is moved aside for the rename, put back should the
    rename fail, and removed after."""
    made = [p for p in (out.parent, *out.parent.parents) if not p.exists()][::-1]
    for folder in made:
        folder.mkdir()
    staging: Path | None = None
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        yield staging
        _rename_into_place(staging, out, replace)
    except BaseException:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        for folder in reversed(made):  # deepest first
            try:
                folder.rmdir()
            except OSError:  # something else was written into it meanwhile: not ours to remove
                break
        raise


def _rename_into_place(staging: Path, out: Path, replace: bool) -> None:
    """Rename ``staging`` to ``out``, moving an existing ``out`` aside first (refused unless it is
    an empty folder or ``replace``), back should the rename fail, and removing it after."""
    if not out.exists():
        staging.rename(out)
        return
    if not replace and any(out.iterdir()):  # written since the caller's check: never replaced unasked
        raise FileExistsError(f"{out} is no longer empty")
    aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
    os.replace(out, aside / out.name)
    try:
        os.replace(staging, out)
    except OSError:
        os.replace(aside / out.name, out)
        aside.rmdir()
        raise
    shutil.rmtree(aside, ignore_errors=True)
