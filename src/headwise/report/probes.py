"""What the report computes from the final models: attention conditioning (through
:func:`headwise.analysis.runs.final_conditioning`, as ``headwise analyze STUDY_DIR`` does), text
samples (:func:`headwise.train.generate.generate_text`) and the nearest-neighbour pick accuracy.

Each value is cached in the report directory and reused while the run's final weights and the
settings are unchanged, so regenerating a report costs no model evaluation.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from headwise.config import atomic_write_text
from headwise.errors import HeadwiseError
from headwise.report.data import RunRecord
from headwise.run import RunDir

#: Sequences of the first evaluation batch on which the final models' conditioning is measured.
COND_SEQUENCES = 8
CACHE_FILE = ".cache.json"


@contextmanager
def one_thread() -> Iterator[None]:
    """Evaluate the final models (decoding, conditioning) on one thread: they are small per-token
    ops where a second thread mostly spins, and on a busy CPU badly (measured here: 0.28 s on one
    thread against 4.4 s on two for one model's conditioning)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _weights(run: RunRecord) -> Path:
    from headwise.model import WEIGHTS_FILE

    return RunDir(run.path).model / WEIGHTS_FILE


class ProbeCache:
    """Values computed from a run's final weights, keyed by what was computed and the run, and
    stamped with the weights' mtime and the settings."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self.data = {}

    @staticmethod
    def stamp(run: RunRecord, settings: Any) -> str:
        weights = _weights(run)
        mtime = weights.stat().st_mtime_ns if weights.is_file() else 0
        return json.dumps([mtime, settings], sort_keys=True)

    def get(self, kind: str, run: RunRecord, settings: Any) -> Any:
        """The cached value, or None when absent or stale."""
        entry = self.data.get(f"{kind}:{run.path}")
        return entry["value"] if entry and entry.get("stamp") == self.stamp(run, settings) else None

    def put(self, kind: str, run: RunRecord, settings: Any, value: Any) -> None:
        """Store a value (the cache file is rewritten atomically)."""
        self.data[f"{kind}:{run.path}"] = {"stamp": self.stamp(run, settings), "value": value}
        atomic_write_text(self.path, json.dumps(self.data, indent=1))


class Probes:
    """The final models' measurements for one report, cached in its directory."""

    def __init__(self, report_dir: Path) -> None:
        self.cache = ProbeCache(Path(report_dir) / CACHE_FILE)

    def _cached(self, kind: str, run: RunRecord, settings: Any, compute: Callable[[], Any]) -> Any:
        """The cached value, else ``compute()``'s on one thread, cached unless it is None."""
        value = self.cache.get(kind, run, settings)
        if value is None:
            with one_thread():
                value = compute()
            if value is not None:
                self.cache.put(kind, run, settings, value)
        return value

    def conditioning(self, run: RunRecord) -> dict[str, float] | None:
        """cond_mean, cond_median and rank_deficient of the final model on the first
        :data:`COND_SEQUENCES` sequences of the first eval batch; None without final weights."""
        from headwise.analysis.runs import eval_inputs, final_conditioning

        def measure() -> dict[str, float]:
            result = final_conditioning(run.path, [eval_inputs(run.path, 1)[0][:COND_SEQUENCES]])
            return {"cond_mean": result.cond_mean, "cond_median": result.cond_median,
                    "rank_deficient": result.rank_deficient}

        # a value is cached only with its weights, so none without them (and no torch loaded for nothing)
        return self._cached("cond", run, COND_SEQUENCES, measure) if _weights(run).is_file() else None

    def sample(self, run: RunRecord, prompt: str, temperature: float, tokens: int, untrained: bool = False) -> str:
        """Text continuing ``prompt`` from the run's final model (or a fresh one of its spec),
        sampling seed 0."""
        from headwise.train.generate import generate_text

        return self._cached("sample-untrained" if untrained else "sample", run, [prompt, temperature, tokens],
                            lambda: generate_text(run.path, prompt, tokens, temperature=temperature, seed=0,
                                                  untrained=untrained)[0])

    def pick_accuracy(self, run: RunRecord) -> float | None:
        """Share of held-out tokens whose output is closest to the right point (first eval
        batch); None when the model cannot be scored."""
        from headwise.train.generate import held_out_predictions, load_run_model, run_config, run_task

        def score() -> float | None:
            if run.task is None:
                return None
            try:
                model, _ = load_run_model(run.path)
                task = run_task(run.path, run_config(run.path))  # text in the run's saved vocabulary
                return float(held_out_predictions(model, task, task.eval_batches()[0])["accuracy"])
            except HeadwiseError:
                return None

        return self._cached("pick", run, "eval batch 0", score)
