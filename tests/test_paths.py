"""``staged_folder``: a folder written whole appears at OUT only when its block ends; a failure
anywhere leaves no trace (neither the staging folder nor the parents made for it) and never
touches what was there."""

import os
from pathlib import Path

import pytest

from headwise.paths import staged_folder


def _listing(root: Path) -> dict[str, str | None]:
    """Every path under ``root`` with a file's text (None for a folder)."""
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_text() for p in sorted(root.rglob("*"))}


def test_the_folder_appears_whole_at_out_with_its_parents(tmp_path):
    (tmp_path / "kept.txt").write_text("mine")
    out = tmp_path / "a" / "b" / "out"
    with staged_folder(out) as staging:
        # hidden, beside OUT, and OUT not there while it is written
        assert staging.parent == out.parent and staging.name.startswith(".out.") and not out.exists()
        (staging / "sub").mkdir()
        (staging / "sub" / "f.txt").write_text("x")
    assert _listing(tmp_path) == {"a": None, "a/b": None, "a/b/out": None, "a/b/out/sub": None,
                                  "a/b/out/sub/f.txt": "x", "kept.txt": "mine"}


def test_a_failure_leaves_nothing_and_the_parents_that_were_there_untouched(tmp_path):
    (tmp_path / "kept.txt").write_text("mine")
    before = _listing(tmp_path)
    with pytest.raises(RuntimeError, match="mid-way"):
        with staged_folder(tmp_path / "a" / "b" / "out") as staging:
            (staging / "f.txt").write_text("x")
            raise RuntimeError("mid-way")
    assert _listing(tmp_path) == before


def test_a_made_parent_that_something_else_wrote_into_stays(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with staged_folder(tmp_path / "a" / "b" / "out"):
            (tmp_path / "a" / "theirs.txt").write_text("y")
            raise KeyboardInterrupt
    assert _listing(tmp_path) == {"a": None, "a/theirs.txt": "y"}


def test_an_empty_out_is_replaced_and_a_filled_one_only_when_asked(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with staged_folder(out) as staging:
        (staging / "new.txt").write_text("new")
    assert _listing(tmp_path) == {"out": None, "out/new.txt": "new"}
    # something written into OUT after the caller's check: refused at the rename, OUT as it was
    with pytest.raises(FileExistsError):
        with staged_folder(out) as staging:
            (staging / "newer.txt").write_text("newer")
    assert _listing(tmp_path) == {"out": None, "out/new.txt": "new"}
    with staged_folder(out, replace=True) as staging:
        (staging / "newer.txt").write_text("newer")
    assert _listing(tmp_path) == {"out": None, "out/newer.txt": "newer"}


def test_a_failed_rename_puts_the_replaced_folder_back(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    before = _listing(tmp_path)
    real = os.replace

    def failing(src, dst):
        if Path(src).name.startswith(".out.") and Path(dst) == out:  # the staged folder's rename only
            raise OSError("rename failed")
        real(src, dst)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(OSError, match="rename failed"):
        with staged_folder(out, replace=True) as staging:
            (staging / "new.txt").write_text("new")
    assert _listing(tmp_path) == before
