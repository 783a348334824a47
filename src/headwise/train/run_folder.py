"""The run folder ``headwise train`` writes: refused before it is touched, made, and taken back.

:func:`check_run_dir` refuses what cannot be done with ``--out`` before anything is written;
:func:`prepare_run_dir` then writes the run's ``config.toml`` and tokenizer. Everything the
trainer can check is checked before that (the task's data, the model, an ``init_from`` source's
weights, the first batches), but a refusal can still come after it: a tracker that cannot start,
bad input found in the first steps. A run refused before it has saved a checkpoint takes back
what its own invocation created (:class:`NewFolder`), so that the corrected command is not
refused as "holds a different run" and ``--resume`` is not offered a run with nothing to resume;
a resume puts its run's config back (:class:`ResumedConfig`).

A run whose model was not trained here (``headwise convert``'s, ``headwise heads prune``'s) is
written whole by :func:`write_run_atomically` into a folder :func:`check_new_run_folder` allowed.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from headwise.config import atomic_write_text
from headwise.errors import HeadwiseError
from headwise.model import SPEC_FILE, WEIGHTS_FILE, save_pretrained
from headwise.model.pretrained import MANIFEST_FILE
from headwise.paths import nearest_existing, staged_folder
from headwise.run import RunDir, RunSummary, write_summary
from headwise.run.tokenizer import check_resumed_tokenizer, save_run_tokenizer
from headwise.spec import ModelSpec
from headwise.train.checkpoint import clean_uncommitted, step_dir_name
from headwise.train.config import RunConfig
from headwise.train.resume import ResumePoint, check_resume, commit_fallback, config_difference, saved_config

if TYPE_CHECKING:
    from torch import nn

    from headwise.text.tokenizer import Tokenizer


def check_run_dir(run_dir: RunDir, cfg: RunConfig, spec: ModelSpec, tokenizer: "Tokenizer | None",
                  world_size: int, *, resume: bool, overwrite: bool) -> ResumePoint | None:
    """Refuse what cannot be done with ``run_dir``, before anything is written. Returns the
    checkpoint to resume, loaded and verified (:func:`headwise.train.resume.check_resume`)."""
    out = run_dir.path
    if resume:
        check_resumed_tokenizer(out, tokenizer)
        return check_resume(run_dir, spec, cfg.to_dict(), world_size)
    if out.exists() and not out.is_dir():
        raise HeadwiseError(f"{out} is a file, not a run directory")
    if out.is_dir() and any(out.iterdir()):
        if not run_dir.has_run():
            raise HeadwiseError(f"{out} is not empty and holds no headwise run: choose another --out")
        if not overwrite:
            same = not config_difference(saved_config(run_dir.config), cfg.to_dict())
            what = "this run already" if same else "a different run"
            raise HeadwiseError(f"{out} holds {what}: pass --resume to continue it or --overwrite to replace it")
    return None


class NewFolder:
    """What one invocation adds to the file system for a new run at ``out``: the folders it makes
    (``out`` and any missing parents) or, where ``out`` is a folder already, the entries it writes
    there. Taken before anything is written; :meth:`take_back` removes exactly that."""

    def __init__(self, out: Path) -> None:
        self.out = out
        #: the entries of ``out`` when it is a folder already (None when this invocation makes it)
        self.kept: set[str] | None = {p.name for p in out.iterdir()} if out.is_dir() else None
        #: the folders this invocation makes, deepest first (none when ``out`` exists)
        self.made: list[Path] = []
        path = out
        while not path.exists() and path != path.parent:
            self.made.append(path)
            path = path.parent

    def take_back(self) -> None:
        """Remove what this invocation added: the run folder it made, each parent it made that is
        still empty (another run may have been started in one since), or the entries it wrote into
        a folder that was there, never one that was there before."""
        if self.kept is not None:
            for entry in self.out.iterdir():
                if entry.name in self.kept:
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
            return
        if self.made:
            shutil.rmtree(self.made[0], ignore_errors=True)
        for parent in self.made[1:]:
            try:
                parent.rmdir()
            except OSError:  # not empty: someone else's run is in it now
                return


class ResumedConfig:
    """A resumed run's ``config.toml`` as it was before the resume wrote its own (which may change
    what it records: ``log``, ``eval``, ``checkpoint``); :meth:`take_back` writes it back, so that
    a resume refused before it trains leaves the run as resumable as it found it. The repairs it
    made to the checkpoints (:func:`~headwise.train.resume.commit_fallback`) stay: they hold."""

    def __init__(self, run_dir: RunDir) -> None:
        self.path = run_dir.config
        self.text = self.path.read_text(encoding="utf-8")

    def take_back(self) -> None:
        """Write the config back as it was."""
        atomic_write_text(self.path, self.text)


def prepare_run_dir(run_dir: RunDir, cfg: RunConfig, tokenizer: "Tokenizer | None", resume_from: ResumePoint | None,
                    overwrite: bool) -> tuple[NewFolder | ResumedConfig, list[str]]:
    """Write the run's config and tokenizer into ``run_dir`` (replacing the run there with
    ``overwrite``; for a resume, commit the checkpoint it continues from). Returns what to take
    back should the run be refused before it trains (:class:`NewFolder`, or for a resume
    :class:`ResumedConfig`) and the resume's notes."""
    out, notes = run_dir.path, []
    if overwrite and run_dir.has_run():
        shutil.rmtree(out)
    undo = NewFolder(out) if resume_from is None else ResumedConfig(run_dir)
    try:
        if resume_from is not None:
            notes = commit_fallback(out, resume_from)
            clean_uncommitted(out)
        out.mkdir(parents=True, exist_ok=True)
        cfg.save(run_dir.config)
        save_run_tokenizer(out, tokenizer)  # before the summary that records its hash
    except BaseException:
        undo.take_back()
        raise
    return undo, notes


def check_new_run_folder(out: Path) -> None:
    """``--out`` of a run written whole (:func:`write_run_atomically`): a new or empty folder that
    can be made, refused before anything is read or written."""
    if out.exists() and not out.is_dir():
        raise HeadwiseError(f"--out {out} is a file: give a new folder for the run (nothing was written)")
    if out.is_dir() and any(out.iterdir()):
        raise HeadwiseError(f"--out {out} already exists and is not empty: give a new folder (nothing was written)")
    if not nearest_existing(out).is_dir():
        raise HeadwiseError(f"--out {out}: {nearest_existing(out)} is a file, so the folder cannot be made there "
                            "(nothing was written)")


def write_run_atomically(out: Path, model: nn.Module, cfg: RunConfig, tokenizer: Tokenizer | None,
                         summary: RunSummary, extra: dict[str, str] | None = None) -> None:
    """Write a run of a model not trained here into ``out`` (a new or empty folder): its config,
    tokenizer, final model, a step-0 checkpoint of the same files (``headwise analyze`` measures
    checkpoints; no trainer state: such a run is trained on with ``train.init_from``, never
    resumed), its summary and ``extra`` files (name: text), in a :func:`~headwise.paths.staged_folder`:
    a failure leaves nothing, nor the folders it made above ``out``."""
    with staged_folder(out) as tmp:
        run = RunDir(tmp)
        cfg.save(run.config)
        save_run_tokenizer(tmp, tokenizer)
        save_pretrained(model, run.model)
        step = run.checkpoints / step_dir_name(0)
        step.mkdir(parents=True)
        for name in (WEIGHTS_FILE, SPEC_FILE, MANIFEST_FILE):
            try:
                os.link(run.model / name, step / name)  # the same bytes: no second copy of a large model
            except OSError:
                shutil.copyfile(run.model / name, step / name)
        write_summary(tmp, summary)
        for name, text in (extra or {}).items():
            (tmp / name).write_text(text, encoding="utf-8")
