"""``headwise analyze`` on a trained run, on a study, in --theory mode, and its bad-input errors."""

import json
import math

import pytest
import torch

from headwise.analysis import runs as analysis_runs
from headwise.analysis.conditioning import analyze_model
from headwise.analysis.plots import plot_condition_vs_heads
from headwise.analysis.runs import condition_vs_heads
from headwise.cli import main
from headwise.model import Transformer, save_pretrained
from headwise.plans import Plan, plan_heads
from headwise.run import RunDir, RunStatus, RunSummary, write_summary
from headwise.spec import ModelSpec

from helpers import read_csv


def _one_error_line(capsys, needle):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("headwise: error:") and needle in err, err


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A 20-step nearest-neighbour run with checkpoints at 10 and 20 and analysis metrics."""
    from headwise.train import RunConfig, run_training

    out = tmp_path_factory.mktemp("run") / "nn"
    cfg = RunConfig.parse(dict(
        model=dict(preset="amsel-nn", d_model=8, n_layers=2, heads=[2, 4], head_dim=None, mlp_hidden=32,
                   max_seq_len=8),
        task=dict(kind="nearest", dim=8, n_points=8, eval_batches=1, eval_batch_size=16),
        optim=dict(lr=1e-2),
        train=dict(micro_batch=16, steps=20, device="cpu", log_every=10),
        eval=dict(every=10),
        checkpoint=dict(every=10, keep=5),
        analysis=dict(every=10),
    ))
    run_training(cfg, out)
    return out


def test_analyze_trained_run_matches_training_metrics(trained_run, capsys):
    assert main(["analyze", str(trained_run), "--batches", "1"]) == 0
    rows = read_csv(trained_run / "analysis" / "conditioning.csv")
    assert [(r["step"], r["layer"]) for r in rows] == [
        (s, layer) for s in ("10", "20") for layer in ("0", "1", "all")]
    for name in ("conditioning.png", "head_stats.png"):
        assert (trained_run / "analysis" / name).stat().st_size > 10_000
    # The trainer logged its analysis metrics on the first eval batch at the checkpointed steps:
    # the same batch and weights give the same numbers.
    logged = {m["step"]: m for m in map(json.loads, (trained_run / "metrics.jsonl").read_text().splitlines())
              if "cond_mean" in m}
    assert sorted(logged) == [10, 20]
    for r in rows:
        key = "cond_mean" if r["layer"] == "all" else f"cond_layer{r['layer']}_mean"
        assert float(r["cond_mean"]) == pytest.approx(logged[int(r["step"])][key], rel=1e-6)
    assert "step" in capsys.readouterr().out

    assert main(["analyze", str(trained_run), "--checkpoints", "last", "--batches", "1",
                 "--out", str(trained_run / "last")]) == 0
    assert {r["step"] for r in read_csv(trained_run / "last" / "conditioning.csv")} == {"20"}


def test_run_dir_without_checkpoints_is_one_line_exit_2(trained_run, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text((trained_run / "config.toml").read_text())
    assert main(["analyze", str(run)]) == 2
    _one_error_line(capsys, "has no checkpoints")
    assert not (run / "analysis").exists()


def test_batch_longer_than_context_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    spec = ModelSpec.parse(dict(vocab_size=50, d_model=16, n_layers=1, heads=[2], max_seq_len=8))
    save_pretrained(Transformer(spec), run / "checkpoints" / "step_00000005")
    (run / "config.toml").write_text("# analysed with eval inputs patched in\n")
    monkeypatch.setattr(analysis_runs, "eval_inputs", lambda _run, _n: [torch.randint(0, 50, (2, 9))])
    assert main(["analyze", str(run)]) == 2
    _one_error_line(capsys, "longer than the model's context (max_seq_len 8)")
    assert not (run / "analysis").exists()


@pytest.mark.parametrize("argv, needle", [
    (["analyze"], "give a RUN_DIR or STUDY_DIR"),
    (["analyze", "/nonexistent/run"], "is not a directory"),
    (["analyze", "--theory", "."], "--theory takes no RUN_DIR"),
])
def test_usage_errors(argv, needle, capsys):
    assert main(argv) == 2
    _one_error_line(capsys, needle)


def test_empty_study_is_one_line_exit_2(tmp_path, capsys):
    assert main(["analyze", str(tmp_path)]) == 2
    _one_error_line(capsys, "holds no run directories")


def _fake_run(root, name, plan, status=RunStatus.COMPLETED, seed=0):
    run = root / name
    spec = ModelSpec.parse(dict(vocab_size=50, d_model=16, n_layers=2, heads=list(plan.heads), max_seq_len=16))
    torch.manual_seed(len(name))
    save_pretrained(Transformer(spec), RunDir(run).model)
    RunDir(run).config.write_text(f"[model]\nd_model = 16\n\n[task]\nkind = \"lm\"\n\n[train]\nseed = {seed}\n")
    write_summary(run, RunSummary(status=status, params=1, d_model=16, plan=plan, steps=7))
    return run


def test_condition_vs_heads_on_a_study(tmp_path, monkeypatch, capsys):
    study = tmp_path / "study"
    inputs = [torch.randint(0, 50, (3, 12))]
    monkeypatch.setattr(analysis_runs, "eval_inputs", lambda _run, _n: inputs)
    _fake_run(study / "runs", "constant-h4", plan_heads("constant", 2, 16, 4))  # scheme and heads: the plan's
    _fake_run(study / "runs", "descending-h6", plan_heads("descending", 2, 16, 6))
    _fake_run(study / "runs", "explicit-h3", Plan.explicit([1, 2]))
    _fake_run(study / "runs", "broken", plan_heads("constant", 2, 16, 4), status=RunStatus.FAILED)
    rows = condition_vs_heads(study)
    got = {r["run"]: r for r in rows}
    assert set(got) == {"runs/constant-h4", "runs/descending-h6", "runs/explicit-h3"}
    assert [got[k]["scheme"] for k in sorted(got)] == ["constant", "descending", "explicit"]
    assert got["runs/descending-h6"]["total_heads"] == 6 and got["runs/descending-h6"]["heads"] == "4-2"
    from headwise.model import load_pretrained

    expected = analyze_model(load_pretrained(study / "runs" / "explicit-h3" / "model"), inputs).cond_mean
    assert got["runs/explicit-h3"]["cond_mean"] == pytest.approx(expected)
    assert got["runs/explicit-h3"]["step"] == 7
    assert plot_condition_vs_heads(rows, tmp_path / "fig.png").stat().st_size > 10_000

    assert main(["analyze", str(study)]) == 0
    out = capsys.readouterr().out
    assert "runs/broken: skipped (status failed)" in out
    table = read_csv(study / "analysis" / "condition_vs_heads.csv")
    assert len(table) == 3 and (study / "analysis" / "condition_vs_heads.png").is_file()
    assert main(["analyze", str(study), "--checkpoints", "last"]) == 2


def test_theory_into_the_current_folder(tmp_path, monkeypatch):
    """``--out .`` (a path with no parents) is the current folder, not a crash."""
    monkeypatch.chdir(tmp_path)
    assert main(["analyze", "--theory", "--seeds", "1", "--out", "."]) == 0
    assert (tmp_path / "theory.md").is_file()


def test_theory_command_writes_table_and_figure(tmp_path, capsys):
    assert main(["analyze", "--theory", "--seeds", "2", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "theory.md").read_text()
    assert "(sqrt(D) + sqrt(N)) / (sqrt(D) - sqrt(N))" in md
    grid = read_csv(tmp_path / "theory_grid.csv")
    row = next(r for r in grid if r["n"] == "64" and r["d"] == "256")
    assert float(row["closed_form"]) == pytest.approx(3.0)
    assert abs(float(row["kappa_mean"]) / 3.0 - 1) < 0.15
    sweep = read_csv(tmp_path / "theory_heads.csv")
    assert math.isinf(float(next(r for r in sweep if r["d"] == r["n"])["closed_form"]))
    assert (tmp_path / "theory.png").stat().st_size > 10_000
