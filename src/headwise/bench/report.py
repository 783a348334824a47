"""Targets and the markdown of a benchmark result (the dict :func:`run_bench` returns): the
machine, settings and load, the targets, then each section's tables, in the suite's order.

Each section says its own targets and tables (:class:`headwise.bench.sections.BenchSection`);
the helpers below are the cells and rows they share.
"""

from __future__ import annotations

import json
from pathlib import Path
from collections.abc import Callable
from typing import Any

from headwise.bench.core import QUIET_STALL, quiet_mask
from headwise.bench.sections import once, ordered_sections
from headwise.config import atomic_write_text

RESULT_JSON = "latest.json"
RESULT_MD = "latest.md"


def target(name: str, goal: str, value: float | None, ok: bool | None, shown: str | None = None) -> dict[str, Any]:
    """One row of the targets table: what, the goal, the measured figure (None: not measured)
    and whether it was met."""
    return {"target": name, "goal": goal, "measured": value,
            "shown": shown if shown is not None else ("n/a" if value is None else f"{value:.2f}"),
            "met": ok if value is not None else None}


def ratio_shown(row: dict[str, Any]) -> str:
    """A ratio row's figure in the targets table: the median ratio, its rounds and the ratio of medians."""
    return f"{row['ratio']:.2f}x ({row.get('basis', '')} rounds; ratio of medians {row['ratio_of_medians']:.2f}x)"


def versus_hf_targets(what: str, rows: list[dict[str, Any]], goal: float,
                      first_label: Callable[[dict[str, Any]], str],
                      worst_label: Callable[[dict[str, Any]], str]) -> list[dict[str, Any]]:
    """The two targets of a section's headwise / HF rows: the first (the reference plan) at least
    ``goal``x, and no plan slower than HF (the worst plan at least 1.0x)."""
    first, worst = rows[0], min(rows, key=lambda r: r["ratio"])
    return [target(f"{what}: {first_label(first)}", f">= {goal}x", first["ratio"], first["ratio"] >= goal,
                   ratio_shown(first)),
            target(f"{what}: never slower at any plan (worst plan)", ">= 1.0x", worst["ratio"], worst["ratio"] >= 1.0,
                   f"{ratio_shown(worst)}: {worst_label(worst)}")]


def ratio_cell(row: dict[str, Any] | None) -> str:
    """A ratio row in a table cell: the median ratio (the ratio of medians); empty for none."""
    return "" if row is None else f"{row['ratio']:.2f}x ({row['ratio_of_medians']:.2f}x)"


def number(x: float | None, digits: int = 0) -> str:
    """A figure with thousands separators; ``n/a`` for none."""
    return "n/a" if x is None else f"{x:,.{digits}f}"


def quiet_count(case: dict[str, Any]) -> str:
    """How many of a case's samples were quiet (``3/5``)."""
    stall = case.get("cpu_stall", [])
    return f"{sum(quiet_mask(stall))}/{len(stall)}"


def evaluate_targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Every section's targets with their measured figures (none for the sections that did not run)."""
    return [t for targets in once(s.targets for s in ordered_sections()) for t in targets(result)]


def _load_line(result: dict[str, Any]) -> str:
    parts = []
    for when, snap in result.get("load", {}).items():
        la = snap.get("loadavg")
        psi = snap.get("cpu_pressure_avg60")
        text = f"{when}: loadavg {la[0]:.2f}/{la[1]:.2f}" if la else f"{when}: loadavg n/a"
        if psi is not None:
            text += f", CPU pressure {psi:.0f}%"
        parts.append(text)
    return "; ".join(parts)


def render_markdown(result: dict[str, Any]) -> str:
    """The result as markdown: machine, settings and load, targets, then each section's tables."""
    m = result["machine"]
    cfg = result["config"]
    lines = [f"# headwise benchmark ({'quick' if result['quick'] else 'full'} run, {result['date']})", ""]
    mem = f", {m['memory_gib']} GiB RAM" if m.get("memory_gib") else ""
    lines.append(f"- Machine: {m['cpu']}, {m['cores']} cores, {m['torch_threads']} torch threads{mem}"
                 + (f"; GPU {m['gpu']}" if m.get("gpu") else "; no GPU"))
    lines.append(f"- torch {m['torch']}, transformers {m.get('transformers')}, Python {m['python']}")
    lines.append(f"- Command: `{result.get('command', 'headwise bench')}`; "
                 f"wall time {result['wall_time_s'] / 60:.1f} min")
    lines.append("- Dtype: float32 unless marked bf16 (torch.autocast). A training step is forward + "
                 "cross-entropy (headwise: the LM task's own, headwise.model.loss; HF: F.cross_entropy on fp32 "
                 "logits, as transformers computes it) + backward + AdamW step on B x T random token ids; "
                 "every number is the median of "
                 f"{cfg['rounds']} rounds (every case once per round, in shuffled order) after {cfg['warmup']} "
                 "warm-up; a ratio is the median of per-round ratios (ratio of the medians in brackets). "
                 f"Only quiet rounds count when there are two or more: a sample is quiet when other work kept a "
                 f"task waiting for a CPU less than {100 * QUIET_STALL:.0f}% of its time (Linux PSI); "
                 "the `quiet` column says how many were.")
    if result.get("training"):  # the GPT-Neo model of the training sections; other sections describe their own
        lines.append(f"- Model: GPT-Neo, d_model {cfg['d_model']}, {cfg['n_layers']} layers G,L,..., window 256, "
                     f"vocab {cfg['vocab_size']:,}; HF = transformers GPTNeoForCausalLM, eager attention, "
                     "same weights (headwise.hf.to_hf)")
    opt = next((t.get("optimizer") for t in result.get("training", [])), None)
    settings = result.get("settings", {})
    lines.append(f"- Settings: glibc malloc keeps freed memory: {'yes' if settings.get('malloc_tuned') else 'no'}"
                 + (f"; optimizer AdamW fused={opt.get('fused')} foreach={opt.get('foreach')}" if opt else ""))
    lines.append(f"- Load: {_load_line(result)}")
    lines.append("")
    targets = result.get("targets") or evaluate_targets(result)
    if targets:
        lines += ["## Targets", "", "| target | goal | measured | met |", "|---|---|---|---|"]
        for t in targets:
            met = {True: "yes", False: "**no**", None: "n/a"}[t["met"]]
            lines.append(f"| {t['target']} | {t['goal']} | {t['shown']} | {met} |")
        lines.append("")
    for render in once(s.render for s in ordered_sections()):
        lines += render(result)
    return "\n".join(lines)


def write_results(result: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """Write ``latest.json`` and ``latest.md`` into ``out_dir`` (atomically); returns their paths."""
    result.setdefault("targets", evaluate_targets(result))
    out_dir = Path(out_dir)
    js, md = out_dir / RESULT_JSON, out_dir / RESULT_MD
    atomic_write_text(js, json.dumps(result, indent=1) + "\n")
    atomic_write_text(md, render_markdown(result) + "\n")
    return js, md
