"""Study reports from fake run directories: the numbers in report.md against closed forms."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import numpy as np
import pytest
import tomli_w

from headwise.cli import main
from headwise.plans import Plan, plan_heads
from headwise.run import RunStatus, RunSummary
from headwise.report import write_report
from headwise.study import load_study
from headwise.study.layout import RESULTS_CSV, run_dir, save_study
from headwise.study.definition import load_study_file

from helpers import read_csv, write_run_dir

CURVES = {"constant": (2.0, 1.5, 0.02), "ascending": (2.05, 1.5, 0.02), "descending": (1.999, 1.5, 0.02)}
OFFSETS = [-0.01, 0.0, 0.01]  # seed offsets: the mean of each point lies on its curve


def curve(scheme: str, total: float) -> float:
    a, b, c = CURVES[scheme]
    return a + b * math.exp(-c * total)


def summary(plan: Plan, loss: float, **fields) -> RunSummary:
    """A completed run's summary, as the trainer writes it."""
    base = dict(status=RunStatus.COMPLETED, final_eval_loss=loss, last_eval_loss=loss, params=2195328, plan=plan,
                steps=20, tokens=20480, tokens_per_step=1024, precision="fp32", device="cpu", wall_time_s=10.0,
                train_time_s=9.0, tokens_per_s=2000.0, peak_memory_bytes=100 * 2**20)
    return RunSummary(**{**base, **fields})


def write_run(path: Path, config: dict, run: RunSummary, evals: list[tuple[int, float]], seed: int = 0) -> None:
    """A run directory: its config (the variant's, with its seed), summary and eval metrics."""
    write_run_dir(path, config, run, [{"step": s, "tokens": s * 1024, "eval_loss": v} for s, v in evals], seed)


def fill_progression(study, out: Path, seeds: int, d_model: int) -> None:
    """Runs of a progression study whose losses lie on :data:`CURVES` (plus the seed offsets)."""
    save_study(study, out, seeds)
    for v in study.variants:
        plan = v.config["model"]["plan"]
        p = plan_heads(plan["scheme"], 4, d_model, plan["total_heads"])
        for seed in range(seeds):
            loss = curve(p.scheme.value, p.total) + (OFFSETS[seed] if seeds > 1 else 0.0)
            write_run(run_dir(out, v.name, seed), v.config,
                      summary(p, loss, d_model=d_model, train_time_s=1.0 + p.total / 10),
                      [(10, loss + 0.5), (20, loss)], seed)


@pytest.fixture
def progression_dir(tmp_path) -> Path:
    out = tmp_path / "prog"
    fill_progression(load_study("progression", preset="tiny", seeds=3), out, 3, 192)
    return out


def test_heads_report_fits_differences_and_tests(progression_dir):
    path = write_report(progression_dir, samples=False, echo=lambda _: None)
    text = path.read_text()
    # the largest total every scheme reaches: ascending/descending top out at 180 (constant at 192)
    assert "fitted loss at 180 heads" in text
    for scheme in ("ascending", "descending"):
        expected = 100 * (curve(scheme, 180) - curve("constant", 180)) / curve("constant", 180)
        row = next(line for line in text.splitlines() if line.startswith(f"| {scheme} |"))
        assert f"{expected:+.2f}%" in row, row
        a, b, c = CURVES[scheme]
        assert f"| {a:.4f} | {b:.4f} |" in row
    assert "loss = a + b * exp(-c * heads)" in text
    # Welch's test: ascending (+2.5%) is far outside the seed spread, descending (-0.05%) is not
    section = text[text.index("## Differences and seed noise"):text.index("## All runs")]
    rows = {line.split("|")[1].strip(): line for line in section.splitlines() if line.startswith("| `")}
    assert "distinguishable from seed noise" in rows["`ascending-h180`"]
    assert "within seed noise" in rows["`descending-h180`"]
    assert "Welch" in text and "Holm" in text and "95% CI" in text
    # mean ± sd over the three seeds (sd of -0.01, 0, 0.01 is 0.01)
    assert f"{curve('constant', 192):.4f} ± 0.0100 (n=3)" in text
    # the blog's numbers, from the study file's [report.paper]
    assert ("For comparison, the blog's fits at 180 heads: descending 0.3% better and ascending 4.5% worse than "
            "constant (one seed each, d_model 768, 250k stories).") in text
    # every figure has its data beside it, and every linked file exists
    for link in re.findall(r"\]\(([^)]+\.(?:png|csv))\)", text):
        assert (path.parent / link).is_file(), link
    pngs = sorted(p.stem for p in path.parent.glob("*.png"))
    assert pngs == sorted(p.stem for p in path.parent.glob("*.csv"))
    assert {"loss_vs_heads", "time_vs_heads", "eval_curves"} <= set(pngs)
    points = [r for r in read_csv(path.parent / "loss_vs_heads.csv") if r["kind"] == "point"]
    assert len(points) == 9 and all(r["seeds"] == "3" for r in points)
    assert "No final model could be measured" in text  # fake runs have no weights


def test_report_at_a_chosen_total_and_single_seed(progression_dir, tmp_path):
    text = write_report(progression_dir, at_heads=90, samples=False, conditioning=False,
                        echo=lambda _: None).read_text()
    expected = 100 * (curve("descending", 90) - curve("constant", 90)) / curve("constant", 90)
    assert "fitted loss at 90 heads" in text and f"{expected:+.2f}%" in text
    # one seed: the report says that no claim can be made
    study = load_study("progression", preset="quick")
    out = tmp_path / "one"
    save_study(study, out, 1)
    for v in study.variants:
        plan = plan_heads(v.config["model"]["plan"]["scheme"], 4, 96, 90)
        write_run(run_dir(out, v.name, 0), v.config, summary(plan, 5.0 + len(v.name) / 100, params=1), [(10, 6.0)])
    text = write_report(out, samples=False, conditioning=False, echo=lambda _: None).read_text()
    assert "no claim can be made" in text and "exponential fit needs at least three distinct totals" in text


def _study_file(tmp_path: Path, name: str, edit) -> str:
    """A copy of a built-in study file, changed by ``edit(raw)``."""
    raw, _ = load_study_file(name)
    edit(raw)
    path = tmp_path / f"{name}-edited.toml"
    path.write_text(tomli_w.dumps(raw))
    return str(path)


def test_relabelled_axis_keeps_its_baseline(tmp_path):
    # The series is each run's plan scheme, not the axis label: labels const/asc/desc still
    # compare against the constant baseline.
    def relabel(raw):
        raw["presets"]["quick"]["axes"][0] = {"name": "scheme", "values": [
            {"label": short, "set": {"model.plan.scheme": scheme}}
            for short, scheme in (("const", "constant"), ("asc", "ascending"), ("desc", "descending"))]}

    study = load_study(_study_file(tmp_path, "progression", relabel), preset="quick", seeds=2)
    assert [v.name for v in study.variants] == ["const-h90", "asc-h90", "desc-h90"]
    out = tmp_path / "relabelled"
    fill_progression(study, out, 2, 96)
    text = write_report(out, samples=False, conditioning=False, echo=lambda _: None).read_text()
    section = text[text.index("## Differences and seed noise"):text.index("## All runs")]
    rows = {line.split("|")[1].strip(): line for line in section.splitlines() if line.startswith("| `")}
    assert set(rows) == {"`asc-h90`", "`desc-h90`"}
    assert all("| `const-h90` |" in row for row in rows.values())
    assert "`asc-h90`" in text[text.index("## Findings"):] and "vs `const-h90`" in text
    # the baseline series comes first in the figure's data
    points = [r for r in read_csv(out / "report" / "loss_vs_heads.csv") if r["kind"] == "point"]
    assert points[0]["series"] == "constant" and {r["series"] for r in points} == set(CURVES)


def test_paper_values_come_from_the_study_file(tmp_path):
    def edit(raw):
        raw["report"]["paper"]["difference"]["descending"] = -0.7
        raw["report"]["paper"]["note"] = "edited in the study file"

    study = load_study(_study_file(tmp_path, "progression", edit), preset="tiny", seeds=1)
    out = tmp_path / "paper"
    fill_progression(study, out, 1, 192)
    text = write_report(out, samples=False, conditioning=False, echo=lambda _: None).read_text()
    assert ("the blog's fits at 180 heads: descending 0.7% better and ascending 4.5% worse than constant "
            "(edited in the study file).") in text
    assert "0.3% better" not in text


def test_report_leaves_results_csv_alone(progression_dir):
    # the report reads the runs; results.csv is the study runner's, rewritten as runs finish
    write_report(progression_dir, samples=False, conditioning=False, echo=lambda _: None)
    assert not (progression_dir / RESULTS_CSV).exists()
    results = progression_dir / RESULTS_CSV
    results.write_text("variant,seed\nold,0\n")
    os.utime(results, ns=(1_000_000_000, 1_000_000_000))
    write_report(progression_dir, samples=False, conditioning=False, echo=lambda _: None)
    assert results.read_text() == "variant,seed\nold,0\n" and results.stat().st_mtime_ns == 1_000_000_000


def test_depth_report_table_2(tmp_path):
    study = load_study("depth-for-heads", preset="quick")
    out = tmp_path / "dfh"
    save_study(study, out, 1)
    numbers = {"l12-h12-hd8": (2.47, 1_000_000, 128.0), "l4-h16-hd8": (2.41, 720_000, 97.0),
               "l4-h16-dfixed": (2.50, 640_000, 90.0)}
    for v in study.variants:
        m = v.config["model"]
        loss, params, mib = numbers[v.name]
        plan = plan_heads("explicit", m["n_layers"], 96, heads=m["heads"], head_dim=m.get("head_dim"))
        write_run(run_dir(out, v.name, 0), v.config,
                  summary(plan, loss, params=params, d_model=96, peak_memory_bytes=int(mib * 2**20)), [(10, loss + 1)])
    text = write_report(out, samples=False, conditioning=False, echo=lambda _: None).read_text()
    table = text[text.index("## Table 2"):text.index("## Loss vs heads per layer")]
    assert "| `l12-h12-hd8` (baseline) | 12 layers x 12 heads, head_dim 8 | 2.4700 | 1.00M | 128 MiB |" in table
    # -28% parameters, -24% memory, -2.43% loss: the paper's Table 2 deltas
    assert "| `l4-h16-hd8` | 4 layers x 16 heads, head_dim 8 | 2.4100 (-2.43%) | 720.0k (-28%) | 97 MiB (-24%) |" in table
    assert "4 layers x 16 heads, head_dim 6" in table  # d_model held fixed: 96 / 16
    # the paper's own numbers, from the study file's [report.paper]
    assert "The paper reports GPT-2 12 x 12 at 2.47 / 89M / 12.8 GB against 4 x 16 at 2.41 / 64M (-28%) / 9.7 GB" in table
    assert ("For comparison, the paper's Table 2: 4 x 16 at val. loss 2.41 against 2.47 for GPT-2 12 x 12, with "
            "-28% parameters and -24% training memory.") in text
    assert (out / "report" / "loss_vs_heads_by_depth.png").is_file()
    # the grid is drawn by depth (head_dim 8); the d_model-fixed variant on its own
    rows = read_csv(out / "report" / "loss_vs_heads_by_depth.csv")
    assert [r["variant"] for r in rows] == ["l4-h16-hd8", "l12-h12-hd8", "l4-h16-dfixed"]
    groups = {r["variant"]: r["group"] for r in read_csv(out / "report" / "time_vs_heads.csv")}
    assert groups == {"l12-h12-hd8": "12 layers", "l4-h16-hd8": "4 layers", "l4-h16-dfixed": "l4-h16-dfixed"}
    assert (out / "report" / "loss_vs_params.csv").is_file()


def test_rank_report_draws_the_learned_nothing_baseline(tmp_path):
    study = load_study("rank", preset="quick")
    out = tmp_path / "rank"
    save_study(study, out, 1)
    losses = {"l1-r16-h1-n8": 0.15, "l1-r4-h4-n8": 0.70, "l1-r1-h16-n8": 0.75}
    for v in study.variants:
        m = v.config["model"]
        plan = plan_heads("explicit", 1, 16, heads=m["heads"], head_dim=m["head_dim"])
        write_run(run_dir(out, v.name, 0), v.config, summary(plan, losses[v.name], params=9506, d_model=16),
                  [(100, 0.8), (200, losses[v.name])])
    text = write_report(out, samples=False, echo=lambda _: None).read_text()
    # the learned-nothing level 1 - E[max_j <-x_i, x_j>]^2, by Monte Carlo (d = 16, N = 8)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40000, 8, 16))
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    m = np.max(-np.einsum("bd,bjd->bj", x[:, 0], x[:, 1:]), axis=1).mean()
    level = float(re.search(r"learned nothing: (0\.\d+)", text).group(1))
    assert level == pytest.approx(1 - m**2, abs=0.005)
    assert "one full-rank head (rank 16) reaches error 0.150; 16 heads of rank 1" in text
    rows = read_csv(out / "report" / "error_vs_rank.csv")
    assert {(r["rank"], r["heads"], r["loss"]) for r in rows} == {("16", "1", "0.15"), ("4", "4", "0.7"),
                                                                  ("1", "16", "0.75")}
    assert "## Samples" not in text  # a vector task has nothing to sample
    assert "## Conditioning" not in text  # not measured for this layout


def test_report_cli_refuses_a_non_study_dir(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a study directory" in err
