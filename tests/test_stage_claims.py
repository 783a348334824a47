"""A stage that starts from some variants only (``[[stages]] variants``), and claims whose pairs
name a stage's runs (``"STAGE/VARIANT"``): across two stages, and a stage against the study's own
runs, judged on the runs each name names and paired by seed (hand-computed differences)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from headwise.errors import HeadwiseError
from headwise.plans import Plan
from headwise.report.verdicts import study_comparisons
from headwise.run import RunStatus, RunSummary
from headwise.study.definition import load_study_file, resolve_study
from headwise.study.jobs import plan_stage_jobs
from headwise.study.layout import run_dir, save_study
from headwise.study.runner import stage_specs
from headwise.study.stages import stage_root

from helpers import write_run_dir

SCRATCH = ["constant-h48", "ascending-h48", "descending-h48"]
#: final eval loss per seed 0, 1, 2 of each run set; seed s of a stage's runs against seed s of the other side
LOSS = {"baseline": [3.0, 3.2, 3.1], "descending-h48": [3.50, 3.30, 3.90], "constant-h48": [3.4, 3.4, 3.4],
        "ascending-h48": [3.6, 3.6, 3.6],
        "prune-global/baseline": [3.40, 3.10, 3.75], "prune-uniform/baseline": [3.45, 3.20, 3.77]}
CLAIMS = [{"name": "global beats per-layer", "pairs": [["prune-global/baseline", "prune-uniform/baseline"]]},
          {"name": "as good as from scratch", "test": "as_good", "margin_percent": 1.0,
           "pairs": [["prune-global/baseline", "descending-h48"]]}]


def _raw(claims=(), **stage_variants) -> dict:
    """The built-in prune study's file with ``claims`` in its quick preset and each stage's
    ``variants`` set as given (by stage name, ``-`` for ``_``)."""
    raw, _ = load_study_file("prune")
    for stage in raw["stages"]:
        key = stage["name"].replace("-", "_")
        if key in stage_variants:
            stage["variants"] = stage_variants[key]
    raw["presets"]["quick"]["claims"] = list(claims)
    return raw


def _study(claims=(), seeds: int = 1, **stage_variants):
    return resolve_study(_raw(claims, **stage_variants), "prune.toml", preset="quick", seeds=seeds)


def _completed(path: Path, config: dict, seed: int, loss: float, steps: int = 100) -> None:
    """A completed run directory of ``steps`` steps whose eval loss was ``loss`` at every evaluation."""
    summary = RunSummary(status=RunStatus.COMPLETED, final_eval_loss=loss, last_eval_loss=loss, params=1000,
                         plan=Plan.explicit([4], [8]), steps=steps, tokens=16 * steps, tokens_per_step=16)
    write_run_dir(path, config, summary, [{"step": s, "eval_loss": loss} for s in range(10, steps + 1, 10)], seed)


def test_a_stage_starts_only_from_the_variants_it_names(tmp_path):
    study = _study()
    stage = study.config.stages[0]
    assert stage.variants == ["baseline"]
    for v in study.variants:  # every source run has completed
        _completed(run_dir(tmp_path, v.name, 0), v.config, 0, 3.0)
    jobs, done, waiting, diverged = plan_stage_jobs(study, tmp_path, stage)
    assert [j.key for j in jobs] == ["baseline/seed0"] and (done, waiting, diverged) == ([], [], [])
    assert jobs[0].run_dir == run_dir(stage_root(tmp_path, "prune-global"), "baseline", 0)
    assert jobs[0].spec.config["train"]["init_from"] == str(run_dir(tmp_path, "baseline", 0))
    # the checks before anything runs: one per stage, of the baseline only
    assert [(s.variant, s.config["train"]["prune"]["scope"]) for s in stage_specs(study)] == [
        ("baseline", "global"), ("baseline", "per-layer")]
    # without `variants`, every variant: a from-scratch plan would be pruned too (and refused, being
    # already within the budget, when its run started)
    everyone = _study(prune_global=None)
    assert [j.key for j in plan_stage_jobs(everyone, tmp_path, everyone.config.stages[0])[0]] == [
        "baseline/seed0", *(f"{name}/seed0" for name in SCRATCH)]


@pytest.mark.parametrize("change, says", [
    ({"prune_global": ["baseline", "nope"]},
     "stage 'prune-global' starts from variant 'nope', which the study does not have (variants: baseline, "),
    ({"prune_global": []}, "variants"),
])
def test_a_stage_naming_a_variant_the_study_lacks_is_one_line(change, says):
    with pytest.raises(HeadwiseError) as err:
        _study(**change)
    assert says in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("pair, says", [
    (["prune-global/constant-h48", "constant-h48"],
     "claim 'c' names prune-global/constant-h48, but stage 'prune-global' starts only from baseline"),
    (["prune-local/baseline", "constant-h48"],
     "claim 'c' names stage 'prune-local', which the study does not have (stages: prune-global, prune-uniform)"),
    (["prune-global/nope", "constant-h48"], "claim 'c' names variant 'nope', which the study does not have"),
])
def test_a_claim_naming_runs_the_study_lacks_is_one_line(pair, says):
    with pytest.raises(HeadwiseError) as err:
        _study([{"name": "c", "pairs": [pair]}])
    assert says in str(err.value) and "\n" not in str(err.value)


def _gains(variant: str, baseline: str) -> list[float]:
    """Lower loss is better: the variant's gain over the baseline, seed by seed."""
    return [b - v for v, b in zip(LOSS[variant], LOSS[baseline])]


def test_claims_across_two_stages_and_a_stage_against_the_study_s_runs_are_judged_on_their_runs(tmp_path):
    study = _study(CLAIMS, seeds=3)
    out = tmp_path / "study"
    save_study(study, out, 3)
    for v in study.variants:
        for seed in range(3):
            # the from-scratch plans train for the baseline's steps plus the heal steps
            steps = 100 if v.name == "baseline" else 140
            _completed(run_dir(out, v.name, seed), v.config, seed, LOSS[v.name][seed], steps)
    for stage in ("prune-global", "prune-uniform"):
        for seed in range(3):
            _completed(run_dir(stage_root(out, stage), "baseline", seed), {}, seed, LOSS[f"{stage}/baseline"][seed])
    found = {(c.variant.name, c.baseline.name): c for c in study_comparisons(out)}
    assert list(found) == [("prune-global/baseline", "prune-uniform/baseline"),
                           ("prune-global/baseline", "descending-h48")]
    for (variant, baseline), c in found.items():
        gains = _gains(variant, baseline)
        # seed s against seed s: the mean and the spread of the paired differences
        assert c.judged.gain.n == 3
        assert c.judged.gain.mean == pytest.approx(statistics.mean(gains), abs=1e-12)
        assert c.judged.gain.sd == pytest.approx(statistics.stdev(gains), rel=1e-9)
        assert c.baseline_mean == pytest.approx(statistics.mean(LOSS[baseline]))
    # global vs per-layer: gains 0.05, 0.10, 0.02 (mean 0.0567, sd 0.0404): the 95% t interval
    # 0.0567 +- 4.3027 x 0.0404 / sqrt(3) lies across 0
    across = found["prune-global/baseline", "prune-uniform/baseline"].judged
    assert across.low == pytest.approx(0.17 / 3 - 4.302653 * statistics.stdev([0.05, 0.10, 0.02]) / 3 ** 0.5, rel=1e-5)
    assert across.low < 0 < across.high
    # against descending: gains 0.10, 0.20, 0.15; margin 1% of descending's mean 3.5667
    scratch = found["prune-global/baseline", "descending-h48"].judged
    assert scratch.margin == pytest.approx(0.035666667, rel=1e-6)
    assert str(scratch.verdict).startswith("non-inferior")
    # late in training: the two stages' runs end together; a healed run and one trained from
    # scratch do not, and the same step is not as late in both
    assert found["prune-global/baseline", "prune-uniform/baseline"].late == "stable"
    assert found["prune-global/baseline", "descending-h48"].late == (
        "unchecked: the runs end at different steps (100 and 140)")
