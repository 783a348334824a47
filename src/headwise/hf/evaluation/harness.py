"""Running lm-evaluation-harness tasks on a ``transformers`` causal LM, scores to a JSON file.

lm-eval is an optional extra; without it every entry point here says how to install it, in one line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from headwise.config import atomic_write_text
from headwise.errors import HeadwiseError, RunFailure

INSTALL = 'pip install -c requirements.lock -e ".[eval]"'


def require_lm_eval() -> None:
    """A one-line HeadwiseError when lm-eval (with its Hugging Face backend) is not installed."""
    try:
        import lm_eval  # noqa: F401
        from lm_eval.models.huggingface import HFLM  # noqa: F401  (needs accelerate, part of lm-eval[hf])
    except ImportError as exc:
        raise HeadwiseError(f"evaluation needs lm-evaluation-harness ({exc}): {INSTALL}") from None


def task_manager(include_path: str | Path | None, standard: bool) -> Any:
    """lm-eval's ``TaskManager`` over the YAML tasks in ``include_path``, and lm-eval's own
    (standard) tasks when ``standard`` (indexing those takes seconds, so only when asked)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(include_path) if include_path else None, include_defaults=standard)


def unknown_tasks(manager: Any, tasks: Sequence[str]) -> list[str]:
    """The names in ``tasks`` that ``manager`` does not know (tasks, groups or tags)."""
    return [t for t in tasks if t not in manager.all_tasks]


def scores_of(results: dict) -> dict[str, dict[str, float | None]]:
    """``{task: {metric: value}}`` from ``simple_evaluate``'s results; a metric computed after a
    filter other than lm-eval's default ``none`` is named ``metric,filter``."""
    scores: dict[str, dict[str, float | None]] = {}
    for task, row in results["results"].items():
        out: dict[str, float | None] = {}
        for key, value in row.items():
            metric, _, filt = key.partition(",")
            if not filt:  # "alias" and other labels
                continue
            name = metric if filt == "none" else key
            out[name] = value if isinstance(value, (int, float)) else None  # stderr may be "N/A"
        scores[task] = out
    return scores


def split_generation(manager: Any, tasks: Sequence[str]) -> tuple[list[str], list[str]]:
    """``tasks`` as (those without generation requests, those with): a name goes with the second
    when any task under it (a group's or tag's tasks) is ``generate_until``. Loads the tasks (and
    their data)."""
    plain, generating = [], []
    for name in tasks:
        kinds = {getattr(t, "OUTPUT_TYPE", None) for t in manager.load([name])["tasks"].values()}
        (generating if "generate_until" in kinds else plain).append(name)
    return plain, generating


def run_harness(model: Any, tokenizer: Any, tasks: Sequence[str], include_path: str | Path | None,
                out_path: str | Path, limit: int | None = None, batch_size: int = 1,
                generation_batch_size: int = 1, standard: bool = False, config: dict[str, Any] | None = None,
                manager: Any | None = None) -> dict[str, Any]:
    """Evaluate ``model`` (a ``transformers`` causal LM, e.g. ``HeadwiseForCausalLM``) with its
    ``tokenizer`` on lm-eval ``tasks``: those in ``include_path`` (see
    :func:`~headwise.hf.evaluation.local_tasks.write_local_tasks`) and, when ``standard``, lm-eval's
    own; ``limit`` examples per task. Writes ``{"scores", "n_samples", "versions", "config"}`` to
    ``out_path`` (``config``: lm-eval's settings plus ``config`` given here) and returns it.
    ``manager``: a :func:`task_manager` already built (then ``include_path`` and ``standard`` are its).

    The context is the tokenizer's ``model_max_length`` (contexts are cut from the left to fit).
    lm-eval pads batches: on the right for log-likelihoods (harmless for a causal model), on the
    left with an attention mask for generation, which ``HeadwiseForCausalLM`` refuses (its learned
    positions count from each row's start). So tasks that generate run at ``generation_batch_size``
    (1: never padded), the others at ``batch_size``, in two lm-eval calls when the two differ."""
    require_lm_eval()
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    manager = manager or task_manager(include_path, standard)
    missing = unknown_tasks(manager, tasks)
    if missing:
        raise HeadwiseError(f"unknown lm-eval task {', '.join(map(repr, missing))}")
    max_length = tokenizer.model_max_length if tokenizer.model_max_length < 1 << 30 else None
    report: dict[str, Any] = {"scores": {}, "n_samples": {}, "versions": {}, "config": {}}
    try:
        if generation_batch_size == batch_size:
            groups = [(list(tasks), batch_size)]
        else:
            plain, generating = split_generation(manager, tasks)
            groups = [(plain, batch_size), (generating, generation_batch_size)]
        for names, size in groups:
            if not names:
                continue
            lm = HFLM(pretrained=model, backend="causal", tokenizer=tokenizer, batch_size=size,
                      max_length=max_length)
            results = lm_eval.simple_evaluate(model=lm, tasks=names, task_manager=manager, limit=limit,
                                              log_samples=False)
            report["scores"].update(scores_of(results))
            report["n_samples"].update(results.get("n-samples", {}))
            report["versions"].update(results.get("versions", {}))
            report["config"] = {**report["config"], **(results.get("config") or {})}
    except OSError as exc:  # a task's data could not be read or downloaded (datasets raises ConnectionError offline)
        hint = ("; lm-eval's own tasks download their data from the Hugging Face hub, so they need network access"
                if isinstance(exc, ConnectionError) else "")
        raise RunFailure(f"lm-eval could not load a task's data: {str(exc).splitlines()[0]}{hint}") from None
    except AssertionError as exc:  # lm-eval checks each request with asserts, most without a message
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else (
            f"an answer is empty or longer than the model's context of {max_length} tokens")
        raise RunFailure(f"lm-eval cannot score a request of {', '.join(tasks)} with this model: {why}") from None
    report["config"].update({"lm_eval_version": lm_eval.__version__, "tasks": list(tasks), "limit": limit,
                             "batch_size": batch_size, "generation_batch_size": generation_batch_size,
                             "max_length": max_length, **(config or {})})
    # lm-eval's config may hold objects (the model itself): recorded by their text
    text = json.dumps(report, indent=2, default=str)
    atomic_write_text(Path(out_path), text + "\n")
    return json.loads(text)
