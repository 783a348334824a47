"""``tensorboard``: events in the run's ``tb/`` (a resume purges the steps after its checkpoint);
a study's report figures as images in the study's own ``tb/``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headwise.run.layout import TENSORBOARD_DIR
from headwise.train.trackers import Tracker, numbers, register

if TYPE_CHECKING:
    from headwise.train.config import LogConfig


@register
class TensorBoardTracker(Tracker):
    """Scalars per step, the config and summary as text, figures as images, in the run's ``tb/``."""

    name, package, extra = "tensorboard", "torch.utils.tensorboard", "tensorboard"

    def __init__(self, log: LogConfig, run_dir: Path) -> None:
        super().__init__(log, run_dir)
        self.writer: Any = None
        self.step = 0

    def start(self, config: dict[str, Any], resume_step: int | None) -> None:
        # purge_step discards events a killed run wrote after its last checkpoint.
        self.writer = self.module.SummaryWriter(str(self.run_dir / TENSORBOARD_DIR),
                                                purge_step=resume_step + 1 if resume_step is not None else None)
        self.step = resume_step or 0
        self.writer.add_text("config", _as_code(config), self.step)

    def log_metrics(self, row: dict[str, Any], step: int) -> None:
        self.step = step
        for key, value in numbers(row).items():
            if key != "step":
                self.writer.add_scalar(key, value, step)

    def log_summary(self, summary: dict[str, Any]) -> None:
        self.writer.add_text("summary", _as_code(summary), self.step)

    def log_figures(self, paths: list[Path]) -> None:
        from matplotlib.image import imread

        for path in paths:
            self.writer.add_image(Path(path).stem, imread(path), self.step, dataformats="HWC")

    def finish(self, status: str) -> None:
        self.writer.close()

    @classmethod
    def log_group_figures(cls, log: LogConfig, study_dir: Path, group: str, paths: list[Path]) -> None:
        """The figures as images in the study's own ``tb/``."""
        tracker = cls(log, study_dir)
        tracker.writer = tracker.module.SummaryWriter(str(study_dir / TENSORBOARD_DIR))
        tracker.log_figures(paths)
        tracker.finish("completed")


def _as_code(data: dict[str, Any]) -> str:
    # TensorBoard renders text as markdown: indent the JSON so it shows as a code block.
    return "\n".join("    " + line for line in json.dumps(data, indent=2).splitlines())

