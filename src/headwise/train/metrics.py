"""What a run records and shows: ``metrics.jsonl`` (and, through the run's experiment trackers,
TensorBoard, W&B or MLflow), a progress bar or plain log lines, and peak memory (the peak FLOP/s
that MFU is measured against is :mod:`headwise.train.peak`'s)."""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import torch

from headwise.config import atomic_write_text
from headwise.run.layout import METRICS_FILE
from headwise.run.metrics import scan_metrics
from headwise.train.trackers import Tracker, warn


def peak_memory_bytes(device: torch.device) -> int:
    """CUDA: the most memory tensors held at once; CPU: the process's peak resident set size
    (which includes the Python interpreter and libraries, not only tensors)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    # ru_maxrss is in kilobytes on Linux (bytes on macOS).
    scale = 1 if sys.platform == "darwin" else 1024
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale


class MetricsLog:
    """Appends one JSON object per logged step to ``metrics.jsonl`` and passes each row on to the
    run's experiment trackers (:mod:`headwise.train.trackers`), which it starts with the resolved
    ``config``. On resume, rows after the checkpoint's step are dropped, since the resumed run
    records those steps again, and so are damaged lines (counted in ``dropped``): the file is
    rewritten from the rows that read back."""

    def __init__(self, run_dir: Path, resume_step: int | None = None, trackers: list[Tracker] | None = None,
                 config: dict[str, Any] | None = None) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        #: damaged lines of the file that a resume dropped (see :func:`headwise.run.metrics.scan_metrics`)
        self.dropped = 0
        if resume_step is not None:
            rows, self.dropped = scan_metrics(run_dir)
            kept = [r for r in rows if r["step"] <= resume_step]
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        self._file: TextIO = open(self.path, "a", encoding="utf-8")
        self.trackers = list(trackers or [])
        try:
            for tracker in self.trackers:
                tracker.start(config or {}, resume_step)
        except BaseException:
            self._file.close()
            raise

    def write(self, row: dict[str, Any]) -> None:
        """Append ``row`` to ``metrics.jsonl`` and pass it to the trackers. A tracker that fails
        (its server unreachable mid-run) is one warning line and is dropped for the rest of the
        run: training and the run's own files go on."""
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        for tracker in list(self.trackers):
            try:
                tracker.log_metrics(row, row["step"])
            except Exception as exc:  # noqa: BLE001 - any backend's failure; the line names it
                warn(f"tracker {tracker.name} failed at step {row['step']} and is dropped for the rest of the "
                     f"run (metrics.jsonl has every row): {type(exc).__name__}: {exc}")
                self.trackers.remove(tracker)

    def close(self, summary: dict[str, Any] | None = None) -> None:
        """Close the file; give the trackers the run's ``summary`` (``summary.json``'s content)
        and close them. A tracker failing here is one warning line: the run itself is done and
        on disk, and the other trackers still close."""
        self._file.close()
        status = str((summary or {}).get("status", "failed"))
        for tracker in self.trackers:
            try:
                if summary is not None:
                    tracker.log_summary(summary)
                tracker.finish(status)
            except Exception as exc:  # noqa: BLE001 - any backend's failure; the line names it
                warn(f"tracker {tracker.name} did not close cleanly: {type(exc).__name__}: {exc}")
        self.trackers = []


def _duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}"


def _eval_metrics(row: dict[str, Any]) -> str:
    """The task's evaluation metrics of a row (``eval_accuracy`` 0.8512 -> ", accuracy 0.8512")."""
    return "".join(f", {k[5:]} {v:.4f}" for k, v in row.items()
                   if k.startswith("eval_") and k != "eval_loss" and isinstance(v, float))


class Progress:
    """A live ``rich`` progress bar (loss, lr, tokens/s, ETA) on a terminal; plain log lines
    otherwise. Only the main process shows anything."""

    def __init__(self, total: int, start: int, enabled: bool, unit: str = "tokens") -> None:
        self.total, self.start, self.enabled = total, start, enabled
        self.speed_unit = "tok/s" if unit == "tokens" else f"{unit}/s"
        self.t0 = time.perf_counter()
        self.bar = None
        if enabled and sys.stdout.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress
            from rich.progress import TextColumn, TimeRemainingColumn

            self.bar = RichProgress(
                TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]}  lr {task.fields[lr]}  {task.fields[speed]} " + self.speed_unit),
                TimeRemainingColumn(),
            )
            self.task = self.bar.add_task("train", total=total, completed=start, loss="-", lr="-", speed="-")
            self.bar.start()

    def advance(self, step: int) -> None:
        """Move the bar to ``step`` (host-side only: no device synchronisation)."""
        if self.bar is not None:
            self.bar.update(self.task, completed=step)

    def log(self, row: dict[str, Any]) -> None:
        """Show a metrics row."""
        if not self.enabled:
            return
        loss, lr, speed = f"{row['train_loss']:.4f}", f"{row['lr']:.2e}", f"{row['tokens_per_s']:,.0f}"
        if self.bar is not None:
            self.bar.update(self.task, completed=row["step"], loss=loss, lr=lr, speed=speed)
            if "eval_loss" in row:
                self.bar.console.print(f"step {row['step']}: eval loss {row['eval_loss']:.4f}{_eval_metrics(row)}")
            return
        done = row["step"] - self.start
        eta = (time.perf_counter() - self.t0) / done * (self.total - row["step"]) if done else 0.0
        line = f"step {row['step']}/{self.total} | loss {loss} | lr {lr} | {speed} {self.speed_unit} | eta {_duration(eta)}"
        if "eval_loss" in row:
            line += f" | eval {row['eval_loss']:.4f}{_eval_metrics(row)}"
        print(line, flush=True)

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.console.print(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
