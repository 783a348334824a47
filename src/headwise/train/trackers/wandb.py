"""``wandb``: a W&B run whose files live in the run's ``wandb/``, in the mode ``log.wandb_mode`` or
``WANDB_MODE`` says (``offline`` writes only local files); a resumed run keeps its W&B id. A
study's runs share its group, and its report figures go to a run of job type ``report`` there."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headwise.errors import HeadwiseError, RunFailure
from headwise.model.pretrained import first_line
from headwise.train.trackers import Tracker, numbers, read_ids, register, save_id

if TYPE_CHECKING:
    from headwise.train.config import LogConfig


@register
class WandbTracker(Tracker):
    """A W&B run (job type ``train``) in ``log.project``, grouped by ``log.group``; its local
    files in the run's ``wandb/``. The id is kept in the run's ``trackers.json``, so a resumed run
    continues the same W&B run (W&B ignores, with a warning, the steps a killed run had logged
    after its last checkpoint when the resumed run logs them again)."""

    name = package = extra = "wandb"

    def __init__(self, log: LogConfig, run_dir: Path) -> None:
        super().__init__(log, run_dir)
        self.run: Any = None
        _check_wandb_mode(self.module, log)

    def start(self, config: dict[str, Any], resume_step: int | None) -> None:
        run_id = read_ids(self.run_dir).get(self.name) if resume_step is not None else None
        if run_id is None:
            run_id = uuid.uuid4().hex[:12]
            save_id(self.run_dir, self.name, run_id)
        # a resumed run may have changed its length or logging settings (see train/resume.py)
        self.run = _wandb_init(self.module, self.log, self.run_dir, id=run_id, resume="allow", config=config,
                               allow_val_change=resume_step is not None, job_type="train", name=self.run_name)

    def log_metrics(self, row: dict[str, Any], step: int) -> None:
        # committed now: left open, the last row would land after (and overwrite) the summary
        self.run.log({k: v for k, v in numbers(row).items() if k != "step"}, step=step, commit=True)

    def log_summary(self, summary: dict[str, Any]) -> None:
        self.run.summary.update({"status": summary.get("status"), **numbers(summary)})

    def log_figures(self, paths: list[Path]) -> None:
        self.run.log({Path(p).stem: self.module.Image(str(p)) for p in paths})

    def finish(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "completed" else 1)

    @classmethod
    def open_group(cls, log: LogConfig, study_dir: Path, group: str) -> dict[str, Any]:
        return {"group": group}

    @classmethod
    def log_group_figures(cls, log: LogConfig, study_dir: Path, group: str, paths: list[Path]) -> None:
        """The figures as a run of job type ``report`` in the study's group."""
        tracker = cls(log, study_dir)
        tracker.run = _wandb_init(tracker.module, log, study_dir, group=group, job_type="report",
                                  name=f"{group}-report")
        tracker.log_figures(paths)
        tracker.finish("completed")


def _check_wandb_mode(wandb: Any, log: LogConfig) -> None:
    """Refuse a ``WANDB_MODE`` W&B would refuse once the run has started (``log.wandb_mode`` overrides it)."""
    mode = os.environ.get("WANDB_MODE")
    if log.wandb_mode is not None or mode is None:
        return
    try:
        wandb.Settings(mode=mode)  # W&B's own check of the value
    except Exception:  # noqa: BLE001 - W&B's validation error
        raise HeadwiseError(f"WANDB_MODE={mode!r} is not a W&B mode: set it to online, offline or disabled, or "
                            "unset it and set log.wandb_mode") from None


def _wandb_init(wandb: Any, log: LogConfig, directory: Path, **kwargs: Any) -> Any:
    kwargs.setdefault("group", log.group)
    try:
        # reinit: a process may train several runs one after another (tests, notebooks).
        return wandb.init(project=log.project, dir=str(directory), mode=log.wandb_mode,
                          reinit="create_new", **kwargs)
    except Exception as exc:  # W&B raises its own errors (no login, no network): the run cannot log
        raise RunFailure(f"W&B could not start a run ({first_line(exc)}); "
                         "set log.wandb_mode = \"offline\" to log to local files only") from None

