"""The ``vision`` report layout (Leaner Transformers' Figs. 2-4 and Table 4) from fake run folders of
the ``vit`` study: accuracies, parameters, the baseline, seed noise and the findings' verdicts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from headwise.cli import main
from headwise.plans import plan_heads
from headwise.report import write_report
from headwise.families.vision.report import acc_cell
from headwise.report.stats import seed_stats
from headwise.run import RunStatus, RunSummary
from headwise.study import load_study
from headwise.study.layout import run_dir, save_study

from helpers import read_csv, write_run_dir

D_MODEL, HEAD_DIM = 64, 16
OFFSETS = [-0.002, 0.0, 0.002]  # seed offsets of the accuracy (fraction): sd 0.2 points


def params(layers: int, heads: int, ratio: float) -> int:
    """A parameter count that grows with depth, heads (attention width) and the MLP."""
    return layers * (4 * D_MODEL * heads * HEAD_DIM + 2 * D_MODEL * int(ratio * D_MODEL)) + 10_000


def heads_help(layers: int, heads: int, ratio: float) -> float:
    """Accuracy rising by a point per head, a little lower at reduced depth; the MLP ratio barely matters."""
    return 0.80 + 0.01 * heads - 0.005 * (6 - layers) + 0.001 * ratio


def no_effect(layers: int, heads: int, ratio: float) -> float:
    return 0.85


def fill(out: Path, seeds: int, accuracy, *, classes: int = 10, skip=(), failed=(), cond: bool = True) -> None:
    """Runs of the vit study (tiny preset) whose top-1 is ``accuracy(layers, heads, ratio)`` plus the
    seed offsets; ``skip`` variants have no runs, ``failed`` ones a failed run."""
    study = load_study("vit", preset="tiny", seeds=seeds)
    save_study(study, out, seeds)
    for v in study.variants:
        m = v.config["model"]
        layers, ratio = m["n_layers"], m["mlp_ratio"]
        heads = m["heads"][0] if isinstance(m["heads"], list) else m["heads"]
        plan = plan_heads("explicit", layers, D_MODEL, heads=m["heads"], head_dim=HEAD_DIM)
        for seed in range(seeds if v.name not in skip else 0):
            acc = accuracy(layers, heads, ratio) + (OFFSETS[seed] if seeds > 1 else 0.0)
            metrics = {"accuracy": acc, **({"top5_accuracy": min(1.0, acc + 0.1)} if classes > 10 else {})}
            done = v.name not in failed
            summary = RunSummary(
                status=RunStatus.COMPLETED if done else RunStatus.FAILED, final_eval_loss=1 - acc if done else None,
                last_eval_loss=1 - acc, eval_metrics=metrics, params=params(layers, heads, ratio), d_model=D_MODEL,
                plan=plan, unit="images", steps=469, tokens=60_032, tokens_per_step=128, device="cpu",
                train_time_s=30.0, wall_time_s=35.0, tokens_per_s=2000.0 - 100 * heads,
                peak_memory_bytes=(200 + 10 * layers) * 2**20, error=None if done else "boom",
                task={"task": "images", "data": "fashion-mnist (IDX)", "classes": classes, "image_size": 28,
                      "train_images": 60000, "eval_images": 5000})
            rows = [{"step": s, "tokens": s * 128, "epoch": s / 469, "eval_loss": 1 - acc, "eval_accuracy": acc,
                     **({"cond_mean": 1000.0 / heads * (1 + 469 / s)} if cond else {})} for s in (117, 234, 469)]
            write_run_dir(run_dir(out, v.name, seed), v.config, summary, rows, seed)


def report(out: Path, **kw) -> str:
    return write_report(out, samples=False, echo=lambda _: None, **kw).read_text()


def findings(text: str) -> str:
    return text[text.index("## Findings"):text.index("## Table 4")]


def row(text: str, name: str, section: str = "Every variant:") -> list[str]:
    part = text[text.index(section):]
    line = next(line for line in part.splitlines() if line.startswith(f"| `{name}`"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_heads_help_with_seeds(tmp_path):
    out = tmp_path / "vit"
    fill(out, 3, heads_help, classes=100)
    text = report(out)
    # Table 4 rows: depth, heads, MLP hidden width, top-1 mean ± sd over the three seeds, top-5, params
    base = row(text, "l6-h4-m4")
    assert base[:5] == ["`l6-h4-m4` (baseline)", "6", "4", "256", "84.40 ± 0.20 (n=3)"]
    assert base[5] == "94.40 ± 0.20 (n=3)" and base[6] == f"{params(6, 4, 4) / 1e3:.1f}k"
    assert base[7] == "260 MiB" and base[8] == "1600"
    reduced = row(text, "l3-h6-m2", "## Table 4")  # the headline table, against the baseline
    acc = 100 * heads_help(3, 6, 2)
    assert reduced[1:5] == ["3", "6", "128", f"{acc:.2f} ± 0.20 (n=3) ({acc - 84.4:+.2f})"]
    assert f"({100 * (params(3, 6, 2) - params(6, 4, 4)) / params(6, 4, 4):+.0f}%)" in reduced[6]
    assert "The paper's Table 4 (ImageNet-1k), quoted as published" in text
    assert "| (7, 16) MLP 1536 | 80.4 | 94.9 | 40.10M | 101.6 GB |" in text
    # Fig. 3: one panel per depth at MLP ratio 4, with the baseline's value in the legend
    report_dir = out / "report"
    pts = read_csv(report_dir / "accuracy_vs_heads.csv")
    by = {r["variant"]: r for r in pts}
    assert {f"l{d}-h{h}-m4" for d in (6, 4) for h in (1, 2, 4, 6, 8)} <= set(by)
    assert float(by["l4-h8-m4"]["top1_mean"]) == pytest.approx(100 * heads_help(4, 8, 4))
    assert float(by["l4-h8-m4"]["top1_sd"]) == pytest.approx(0.2)
    assert by["l4-h8-m4"]["seeds"] == "3"
    assert "error bars one sd over seeds" in text
    # Fig. 4: the MLP grid at the baseline's 4 heads
    mlp = {r["variant"]: float(r["mlp_ratio"]) for r in read_csv(report_dir / "accuracy_vs_mlp.csv")}
    assert mlp == {f"l{d}-h4-m{r}": float(r) for d in (6, 4) for r in (1, 2, 4, 8)}
    # findings: every part of the claim reproduced, with tests
    f = findings(text)
    assert "The paper's claim: \"with head_dim fixed, accuracy rises with heads" in f
    assert ("Accuracy vs heads at 6 layers: 1 head 81.40% -> 8 heads 88.40% (+7.00 points; rises with heads): "
            "reproduced") in f
    assert "Accuracy vs heads at 4 layers:" in f and "Reduced depth with more heads:" in f
    assert f.count("reproduced (Welch p = ") >= 3 and "not reproduced" not in f and "within noise (" not in f
    assert "MLP ratio vs heads at 6 layers: the MLP ratio (1, 2, 4, 8) moves top-1 by 0.70 points, heads by 7.00" in f
    # seed noise: the large differences are distinguishable
    noise = text[text.index("## Differences from the baseline"):]
    assert "| `l6-h8-m4` |" in noise and "distinguishable from seed noise" in noise
    # conditioning over training, falling with heads
    assert "falls with every added head" in f
    cond = read_csv(report_dir / "conditioning_training.csv")
    assert {r["n_layers"] for r in cond} == {"6", "4"} and len(cond) == 30
    for name in ("accuracy_vs_heads", "accuracy_vs_mlp", "conditioning_training", "time_vs_heads", "eval_curves"):
        assert (report_dir / f"{name}.png").stat().st_size > 1000, name
    for link in re.findall(r"\]\(([^)]+\.(?:png|csv))\)", text):
        assert (report_dir / link).is_file(), link
    # the common sections read image runs: setup line, conditioning with heads per layer on the x axis
    assert "image classification on fashion-mnist (IDX), 100 classes at 28 px" in text
    assert "469 steps of 128 images" in text
    assert "No final model could be measured" in text  # fake runs have no weights


def test_no_effect_is_within_noise(tmp_path):
    out = tmp_path / "flat"
    fill(out, 3, no_effect, cond=False)
    text = report(out)
    f = findings(text)
    assert "(+0.00 points; does not rise with heads): within noise" in f
    assert "reduced depth" not in f.lower() or "within noise" in f[f.index("Reduced depth"):]
    assert "MLP ratio vs heads at 6 layers" in f and f.count("within noise (") >= 4
    assert "reproduced (" not in f.replace("not reproduced (", "")
    assert "## Conditioning during training" not in text  # nothing logged
    assert row(text, "l6-h4-m4")[5] == "–"  # 10 classes: no top-5
    assert "within seed noise" in text


def test_one_seed_says_noise_cannot_be_judged(tmp_path):
    out = tmp_path / "one"
    fill(out, 1, no_effect)
    f = findings(report(out, conditioning=False))
    assert "does not rise with heads): not reproduced (one seed: noise cannot be judged)" in f
    assert "one seed, so noise cannot be judged" in f
    assert row(report(out, conditioning=False), "l6-h4-m4")[4] == "85.00"
    # heads help on one seed: reproduced, still without a claim about noise
    out2 = tmp_path / "one-help"
    fill(out2, 1, heads_help)
    f = findings(report(out2, conditioning=False))
    assert "rises with heads): reproduced (one seed: noise cannot be judged)" in f
    assert "the best, `l4-h8-m4`, 87.40% (+3.00 points)" in f


def test_missing_and_failed_runs_are_reported(tmp_path):
    out = tmp_path / "partial"
    fill(out, 1, heads_help, skip=("l4-h8-m4", "l6-h4-m1"), failed=("l6-h8-m4",))
    text = report(out, conditioning=False)
    assert "Without a completed, scored run" in text
    assert "`l4-h8-m4` (1 pending)" in text and "`l6-h8-m4` (1 failed)" in text
    assert row(text, "l6-h8-m4")[4] == "–" and row(text, "l4-h8-m4")[-1] == "1 pending"
    assert "l6-h8-m4" not in {r["variant"] for r in read_csv(out / "report" / "accuracy_vs_heads.csv")}
    assert "Accuracy vs heads at 6 layers: 1 head 81.40% -> 6 heads 86.40%" in findings(text)


def test_missing_baseline_and_no_runs(tmp_path):
    out = tmp_path / "none"
    fill(out, 1, heads_help, skip=("l6-h4-m4",))
    text = report(out, conditioning=False)
    assert "Reduced depth" not in findings(text) and "`l6-h4-m4` (1 pending)" in text
    empty = tmp_path / "empty"
    fill(empty, 1, heads_help, skip=tuple(v.name for v in load_study("vit", preset="tiny").variants))
    assert "No run has completed yet" in report(empty)


def test_acc_cell():
    assert acc_cell(seed_stats([])) == "–"
    assert acc_cell(seed_stats([81.234])) == "81.23"
    assert acc_cell(seed_stats([80.0, 82.0])) == "81.00 ± 1.41 (n=2)"


def test_vit_dry_run_needs_no_data(monkeypatch, capsys):
    monkeypatch.delenv("HEADWISE_DATA", raising=False)
    assert main(["study", "vit", "--preset", "tiny", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "17 variants" in out and "l3-h6-m2" in out
    assert load_study("vit", preset="tiny").config.report["kind"] == "vision"


def test_the_noise_summary_says_why_nothing_could_be_tested():
    """One seed and several seeds that agree exactly are different reasons Welch's test is silent."""
    import math

    from headwise.report.accuracy import noise_summary
    from headwise.report.stats import Comparison

    silent = [Comparison("v", "b", 2, 2, 0.0, 0.0, math.nan, math.nan)]
    one, testable = noise_summary(silent, seeds=1)
    assert "one seed" in one and not testable
    two, testable = noise_summary(silent, seeds=2)
    assert "With 2 seeds, no configuration's values differ between seeds" in two and "one seed" not in two
    assert not testable
