"""The ``lra`` report layout (Leaner Transformers' Figs. 8-9 and Table 3) from fake run folders of the
``lra`` study (tiny preset: ListOps and Fashion-MNIST, 1-2 layers x 2/4/8 heads): per-task tables beside
the paper's rows, the reference lines, seed noise, and the findings' verdicts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomli_w

from headwise.cli import main
from headwise.errors import HeadwiseError
from headwise.plans import plan_heads
from headwise.report import write_report
from headwise.report.options import ReportSpec, study_report
from headwise.run import RunStatus, RunSummary
from headwise.study import load_study
from headwise.study.layout import run_dir, save_study

from helpers import read_csv, write_run_dir

D_MODEL, HEAD_DIM = 64, 32
OFFSETS = [-0.002, 0.0, 0.002]  # seed offsets of the accuracy (fraction): sd 0.2 points
TASK_PARAMS = {"listops": 100_000, "fashion-mnist": 120_000}
BASE_ACC = {"listops": 0.30, "fashion-mnist": 0.80}


def params(task: str, layers: int, heads: int) -> int:
    """Grows with depth and heads; (1, 4) has fewer parameters than (2, 2)."""
    return TASK_PARAMS[task] + layers * (8_000 * heads + 20_000)


def heads_help(task: str, layers: int, heads: int) -> float:
    """A point per head, half a point lower at one layer: (1, 4) beats (2, 2) by 1.5 points."""
    return BASE_ACC[task] + 0.01 * heads - 0.005 * (2 - layers)


def no_effect(task: str, layers: int, heads: int) -> float:
    return BASE_ACC[task] + 0.05


def test_header_describes_lra_setup(tmp_path):
    out = tmp_path / "lra"
    fill(out, 1, heads_help, skip=tuple(v.name for v in load_study("lra", preset="tiny").variants)[1:])
    assert "Setup (from `runs/listops-l1-h2/seed0`): LRA listops" in report(out).split("## ")[0]


def fill(out: Path, seeds: int, accuracy, *, skip=(), failed=()) -> None:
    """Runs of the lra study (tiny preset) whose top-1 is ``accuracy(task, layers, heads)`` plus the
    seed offsets; ``skip`` variants have no runs, ``failed`` ones a failed run."""
    study = load_study("lra", preset="tiny", seeds=seeds)
    save_study(study, out, seeds)
    for v in study.variants:
        m, task = v.config["model"], v.config["task"]["task"]
        layers = m["n_layers"]
        heads = m["heads"][0] if isinstance(m["heads"], list) else m["heads"]
        plan = plan_heads("explicit", layers, D_MODEL, heads=m["heads"], head_dim=HEAD_DIM)
        for seed in range(seeds if v.name not in skip else 0):
            acc = accuracy(task, layers, heads) + (OFFSETS[seed] if seeds > 1 else 0.0)
            done = v.name not in failed
            summary = RunSummary(
                status=RunStatus.COMPLETED if done else RunStatus.FAILED, final_eval_loss=1 - acc if done else None,
                last_eval_loss=1 - acc, eval_metrics={"accuracy": acc}, params=params(task, layers, heads),
                d_model=D_MODEL, plan=plan, unit="tokens", steps=625, tokens=2_000_000, tokens_per_step=3200,
                device="cpu", train_time_s=60.0, wall_time_s=70.0, tokens_per_s=30_000.0 - 1000 * heads * layers,
                peak_memory_bytes=(300 + 20 * layers * heads) * 2**20, error=None if done else "boom",
                task={"task": "lra", "data": task, "classes": 10, "vocab_size": 20, "max_length": 784,
                      "train_examples": 10000, "eval_examples": 2000})
            rows = [{"step": s, "tokens": s * 3200, "epoch": s / 625, "eval_loss": 1 - acc, "eval_accuracy": acc}
                    for s in (200, 400, 625)]
            write_run_dir(run_dir(out, v.name, seed), v.config, summary, rows, seed)


def report(out: Path) -> str:
    return write_report(out, samples=False, conditioning=False, echo=lambda _: None).read_text()


def findings(text: str) -> str:
    return text[text.index("## Findings"):text.index("## Accuracy vs heads")]


def section(text: str, start: str, end: str = "\n## ") -> str:
    part = text[text.index(start):]
    return part[:part.index(end, len(start))] if end in part[len(start):] else part


def row(text: str, name: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(f"| `{name}`"))
    return [c.strip() for c in line.strip("|").split("|")]


def pct(a: float, b: float) -> str:
    return f"{100 * (a - b) / b:+.1f}%"


def test_heads_help_with_seeds(tmp_path):
    out = tmp_path / "lra"
    fill(out, 3, heads_help)
    text = report(out)
    table = section(text, "## Table 3")
    listops = section(table, "### listops", "### fashion-mnist")
    # Table 3 rows: (depth, heads), top-1 with the difference from the reference, params with theirs, paper beside
    ref = row(listops, "listops-l2-h2")
    assert ref[:3] == ["`listops-l2-h2` (reference)", "(2, 2)", "32.00 ± 0.20 (n=3)"]
    assert ref[3] == f"{params('listops', 2, 2) / 1e3:.1f}k"
    assert ref[4] == f"{300 + 80} MiB" and ref[5] == "26000"
    assert ref[7:] == ["36.79", "209.8k"]
    wide = row(listops, "listops-l1-h4")
    assert wide[1:3] == ["(1, 4)", "33.50 ± 0.20 (n=3) (+1.50)"]
    assert wide[3] == (f"{params('listops', 1, 4) / 1e3:.1f}k "
                       f"({pct(params('listops', 1, 4), params('listops', 2, 2))})")
    assert wide[7:] == ["37.13 (+0.34)", f"192.9k ({pct(192.9e3, 209.8e3)})"]
    assert "The other shapes on listops:" in listops and "| `listops-l2-h8` | (2, 8) | 38.00 ± 0.20 (n=3) (+6.00)" \
        in listops
    # Fashion-MNIST: grouped by task.task (label fmnist), stands in for LRA Image, the paper's image rows beside
    fm = section(table, "### fashion-mnist", "Tasks of")
    assert row(fm, "fmnist-l1-h4")[7:] == ["38.2 (+1.00)", "191.2k (+0.0%)"]
    assert row(fm, "fmnist-l2-h2")[2] == "82.00 ± 0.20 (n=3)"
    assert "`fashion-mnist` stands in for LRA Image, which the paper ran on CIFAR-10" in fm
    assert "Tasks of the paper's Table 3 this study did not run: text, retrieval, pathfinder." in table
    assert "listops-l" not in fm and "fmnist-l" not in listops
    assert "ListOps here is the short variant (20-100 tokens)" in listops
    # Figs. 8-9: one figure per task, a panel per depth, the reference line's value in the text
    d = out / "report"
    pts = {r["variant"]: r for r in read_csv(d / "accuracy_vs_heads_listops.csv")}
    assert set(pts) == {f"listops-l{l}-h{h}" for l in (1, 2) for h in (2, 4, 8)}
    assert float(pts["listops-l1-h8"]["top1_mean"]) == pytest.approx(100 * heads_help("listops", 1, 8))
    assert float(pts["listops-l1-h8"]["top1_sd"]) == pytest.approx(0.2) and pts["listops-l1-h8"]["seeds"] == "3"
    assert pts["listops-l1-h8"]["params"] == str(params("listops", 1, 8))
    assert {r["task"] for r in read_csv(d / "accuracy_vs_heads_fashion-mnist.csv")} == {"fashion-mnist"}
    assert "listops, the reference `listops-l2-h2` (dashed line): top-1 % 32.00 ± 0.20 (n=3) [172.0k]." in text
    assert "fashion-mnist, the reference `fmnist-l2-h2` (dashed line): top-1 % 82.00 ± 0.20 (n=3)" in text
    assert "listops, top-1 % at 1 layer: 2 heads 31.50 ± 0.20 (n=3) [136.0k], 4 heads 33.50" in text
    assert "error bars one sd over seeds" in text
    for name in ("accuracy_vs_heads_listops", "accuracy_vs_heads_fashion-mnist", "time_vs_heads", "eval_curves"):
        assert (d / f"{name}.png").stat().st_size > 1000, name
    for link in re.findall(r"\]\(([^)]+\.(?:png|csv))\)", text):
        assert (d / link).is_file(), link
    # findings: every part reproduced, with Holm-corrected tests, per task
    f = findings(text)
    assert f.startswith("## Findings\n\n- The paper's claim: \"one layer of 4 heads outperforms the reference")
    assert ("listops, accuracy vs heads at 1 layer: 2 heads 31.50% -> 8 heads 37.50% (+6.00 points; rises with "
            "heads): reproduced (Welch p = ") in f
    assert "fashion-mnist, accuracy vs heads at 2 layers: 2 heads 82.00% -> 8 heads 88.00%" in f
    assert (f"listops, `listops-l1-h4` (1 layer, 4 heads) against the reference `listops-l2-h2`: 33.50% vs 32.00% "
            f"(+1.50 points) with {pct(params('listops', 1, 4), params('listops', 2, 2))} parameters [the paper: "
            "+0.34 points with -8.1% parameters]; better with no more parameters: reproduced (Welch p = ") in f
    assert f.count("reproduced (Welch p = ") == 6 and "not reproduced" not in f and "within noise (" not in f
    # seed noise per task, against its own reference
    noise = section(text, "## Differences from the reference")
    assert "### listops (against `listops-l2-h2`)" in noise and "### fashion-mnist (against `fmnist-l2-h2`)" in noise
    assert "| `listops-l2-h8` | 38.00 ± 0.20 (n=3) | +6.00 |" in noise
    assert "distinguishable from seed noise" in noise
    assert "listops: with 3 seeds, 5 of 5 differences from the reference are distinguishable" in f


def test_no_effect_is_within_noise(tmp_path):
    out = tmp_path / "flat"
    fill(out, 3, no_effect)
    text = report(out)
    f = findings(text)
    assert ("listops, accuracy vs heads at 2 layers: 2 heads 35.00% -> 8 heads 35.00% (+0.00 points; does not rise "
            "with heads): within noise (Welch p = ") in f
    assert "(+0.00 points) with" in f and "not better: within noise (Welch p = " in f
    assert f.count("within noise (Welch p = ") == 6
    assert "reproduced (" not in f
    assert "within seed noise" in text and "0 of 5 differences from the reference" in f
    assert row(section(section(text, "## Table 3"), "### fashion-mnist"), "fmnist-l1-h4")[2] == \
        "85.00 ± 0.20 (n=3) (+0.00)"


def test_one_seed_says_noise_cannot_be_judged(tmp_path):
    out = tmp_path / "one"
    fill(out, 1, no_effect)
    text = report(out)
    f = findings(text)
    assert "does not rise with heads): not reproduced (one seed: noise cannot be judged)" in f
    assert "not better: not reproduced (one seed: noise cannot be judged)" in f
    assert f.count("one seed, so noise cannot be judged") == 1  # said once, not per task
    assert row(section(text, "## Table 3"), "listops-l2-h2")[2] == "35.00"
    assert "error bars" not in text
    out2 = tmp_path / "one-help"
    fill(out2, 1, heads_help)
    f = findings(report(out2))
    assert "rises with heads): reproduced (one seed: noise cannot be judged)" in f
    assert "better with no more parameters: reproduced (one seed: noise cannot be judged)" in f
    assert "not reproduced" not in f


def test_missing_and_failed_runs_are_listed(tmp_path):
    out = tmp_path / "partial"
    fill(out, 1, heads_help, skip=("listops-l1-h8", "fmnist-l2-h2"), failed=("listops-l1-h4",))
    text = report(out)
    assert "listops, without a completed, scored run" in text
    assert "`listops-l1-h8` (1 pending)" in text and "`listops-l1-h4` (1 failed)" in text
    assert "fashion-mnist, without a completed, scored run" in text and "`fmnist-l2-h2` (1 pending)" in text
    lo = row(section(text, "## Table 3"), "listops-l1-h4")
    assert lo[1:3] == ["(1, 4)", "–"] and lo[6] == "1 failed"
    assert "listops-l1-h8" not in {r["variant"] for r in read_csv(out / "report" / "accuracy_vs_heads_listops.csv")}
    f = findings(text)
    assert "listops, accuracy vs heads at 1 layer: 2 heads 31.50% -> 2 heads" not in f  # one point left: no trend
    assert "listops, (1 layer, 4 heads) against the reference (2 layers, 2 heads): untested (no completed " \
           "`l1-h4` run)." in f
    assert "fashion-mnist, (1 layer, 4 heads) against the reference (2 layers, 2 heads): untested (no completed " \
           "reference run)." in f
    # the pending reference is still placed in its task (from the study's plan) and listed
    assert "`fmnist-l2-h2` (reference)" in text
    assert row(section(text, "## Table 3"), "fmnist-l2-h2")[6] == "1 pending"


def test_no_runs(tmp_path):
    empty = tmp_path / "empty"
    fill(empty, 1, heads_help, skip=tuple(v.name for v in load_study("lra", preset="tiny").variants))
    assert "No run has completed yet" in report(empty)


def test_options_are_validated():
    spec = ReportSpec.parse({"kind": "lra"})
    assert spec.options.baseline_shape == "l2-h2" and spec.options.table == ["l2-h2", "l1-h4"]
    with pytest.raises(HeadwiseError, match="not lL-hH"):
        ReportSpec.parse({"kind": "lra", "baseline_shape": "2x2"})
    with pytest.raises(HeadwiseError, match="depth, heads"):
        ReportSpec.parse({"kind": "lra", "paper": {"source": "s", "table": "t", "rows": [
            {"task": "listops", "shape": "l2-h2", "top1": 1.0, "params": 1.0}]}})


def test_lra_dry_run_needs_no_data(monkeypatch, capsys):
    monkeypatch.delenv("HEADWISE_DATA", raising=False)
    assert main(["study", "lra", "--preset", "tiny", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "12 variants" in out and "listops-l1-h4" in out and "fmnist-l2-h8" in out
    study = load_study("lra", preset="tiny")
    report_spec = study_report(study.config.report, study.source)
    assert report_spec.kind == "lra" and report_spec.options.paper.table == "Table 3"
    assert len(report_spec.options.paper.rows) == 10


def test_without_paper_and_a_wider_table_shape(tmp_path):
    """No [report.paper]: no quoted columns or claim; a shape with more parameters than the reference is
    'better but with more parameters', which does not reproduce the claim."""
    import tomllib

    out = tmp_path / "nopaper"
    fill(out, 1, heads_help)
    path = out / "study.toml"
    data = tomllib.loads(path.read_text())
    data["definition"]["report"] = {"kind": "lra", "table": ["l2-h2", "l1-h8"]}
    path.write_text(tomli_w.dumps(data))
    text = report(out)
    assert "Table 3 top-1 %" not in text and "The paper's claim" not in text and "did not run" not in text
    f = findings(text)
    assert ("listops, `listops-l1-h8` (1 layer, 8 heads) against the reference `listops-l2-h2`: 37.50% vs 32.00% "
            f"(+5.50 points) with {pct(params('listops', 1, 8), params('listops', 2, 2))} parameters; better but "
            "with more parameters: not reproduced (one seed: noise cannot be judged).") in f
    assert "(1 layer, 4 heads)" not in f
