"""Study reports from fake run directories: the numbers in report.md against closed forms."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import tomli_w

from headwise.cli import main
from headwise.plans import plan_heads
from headwise.study import load_study, write_report
from headwise.study.layout import run_dir, save_study

CURVES = {"constant": (2.0, 1.5, 0.02), "ascending": (2.05, 1.5, 0.02), "descending": (1.999, 1.5, 0.02)}
OFFSETS = [-0.01, 0.0, 0.01]  # seed offsets: the mean of each point lies on its curve


def curve(scheme: str, total: float) -> float:
    a, b, c = CURVES[scheme]
    return a + b * math.exp(-c * total)


def write_run(path: Path, model: dict, task: dict, summary: dict, evals: list[tuple[int, float]]) -> None:
    path.mkdir(parents=True)
    (path / "config.toml").write_text(tomli_w.dumps({"model": model, "task": task, "optim": {"lr": 0.005}}))
    base = {"status": "completed", "steps": 20, "tokens": 20480, "tokens_per_step": 1024, "precision": "fp32",
            "device": "cpu", "wall_time_s": 10.0, "train_time_s": 9.0, "tokens_per_s": 2000.0,
            "peak_memory_bytes": 100 * 2**20}
    (path / "summary.json").write_text(json.dumps({**base, **summary}))
    (path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "tokens": s * 1024, "eval_loss": v}) + "\n"
                                                for s, v in evals))


def read_csv(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.fixture
def progression_dir(tmp_path) -> Path:
    study = load_study("progression", preset="tiny", seeds=3)
    out = tmp_path / "prog"
    save_study(study, out, 3)
    for v in study.variants:
        plan = v.config["model"]["plan"]
        heads = plan_heads(plan["scheme"], 4, 192, plan["total_heads"]).heads
        for seed, off in enumerate(OFFSETS):
            loss = curve(plan["scheme"], sum(heads)) + off
            write_run(run_dir(out, v.name, seed), {"d_model": 192, "n_layers": 4, "heads": heads},
                      v.config["task"], {"final_eval_loss": loss, "heads": heads, "total_heads": sum(heads),
                                         "head_dims": [192 // h for h in heads], "params": 2195328,
                                         "train_time_s": 1.0 + sum(heads) / 10},
                      [(10, loss + 0.5), (20, loss)])
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
        heads = plan_heads(v.config["model"]["plan"]["scheme"], 4, 96, 90).heads
        write_run(run_dir(out, v.name, 0), {"d_model": 96, "n_layers": 4, "heads": heads}, v.config["task"],
                  {"final_eval_loss": 5.0 + len(v.name) / 100, "heads": heads, "total_heads": sum(heads),
                   "head_dims": [96 // h for h in heads], "params": 1}, [(10, 6.0)])
    text = write_report(out, samples=False, conditioning=False, echo=lambda _: None).read_text()
    assert "no claim can be made" in text and "exponential fit needs at least three distinct totals" in text


def test_depth_report_table_2(tmp_path):
    study = load_study("depth-for-heads", preset="quick")
    out = tmp_path / "dfh"
    save_study(study, out, 1)
    numbers = {"l12-h12-hd8": (2.47, 1_000_000, 128.0), "l4-h16-hd8": (2.41, 720_000, 97.0),
               "l4-h16-dfixed": (2.50, 640_000, 90.0)}
    for v in study.variants:
        m = v.config["model"]
        loss, params, mib = numbers[v.name]
        heads = m["heads"]
        hd = m.get("head_dim", 96 // heads[0])
        write_run(run_dir(out, v.name, 0), {"d_model": 96, "n_layers": m["n_layers"], "heads": heads},
                  v.config["task"], {"final_eval_loss": loss, "heads": heads, "total_heads": sum(heads),
                                     "head_dims": [hd] * len(heads), "params": params,
                                     "peak_memory_bytes": mib * 2**20}, [(10, loss + 1)])
    text = write_report(out, samples=False, conditioning=False, echo=lambda _: None).read_text()
    table = text[text.index("## Table 2"):text.index("## Loss vs heads per layer")]
    assert "| `l12-h12-hd8` (baseline) | 12 layers x 12 heads, head_dim 8 | 2.4700 | 1.00M | 128 MiB |" in table
    # -28% parameters, -24% memory, -2.43% loss: the paper's Table 2 deltas
    assert "| `l4-h16-hd8` | 4 layers x 16 heads, head_dim 8 | 2.4100 (-2.43%) | 720.0k (-28%) | 97 MiB (-24%) |" in table
    assert "4 layers x 16 heads, head_dim 6" in table  # d_model held fixed: 96 / 16
    assert (out / "report" / "loss_vs_heads_by_depth.png").is_file()
    assert (out / "report" / "loss_vs_params.csv").is_file()


def test_rank_report_draws_the_learned_nothing_baseline(tmp_path):
    study = load_study("rank", preset="quick")
    out = tmp_path / "rank"
    save_study(study, out, 1)
    losses = {"l1-r16-h1-n8": 0.15, "l1-r4-h4-n8": 0.70, "l1-r1-h16-n8": 0.75}
    for v in study.variants:
        m = v.config["model"]
        write_run(run_dir(out, v.name, 0), {"d_model": 16, "n_layers": 1, "heads": m["heads"]}, v.config["task"],
                  {"final_eval_loss": losses[v.name], "heads": m["heads"], "total_heads": m["heads"][0],
                   "head_dims": [m["head_dim"]], "params": 9506}, [(100, 0.8), (200, losses[v.name])])
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


def test_report_cli_refuses_a_non_study_dir(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a study directory" in err
