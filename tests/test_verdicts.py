"""A study's ``[[claims]]`` and the report's verdicts, from hand-written runs with hand-worked values."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomli_w

from headwise.errors import HeadwiseError
from headwise.plans import Plan
from headwise.report import write_report
from headwise.run import RunStatus, RunSummary
from headwise.study import load_study
from headwise.study.layout import run_dir, save_study

from headwise.report.paired import seeds_for_power

from helpers import read_csv, tiny_nearest_config, write_run_dir

BASE = [2.0, 2.1, 2.2, 2.3, 2.4]                 # the baseline's final loss per seed
BASE2 = [22.0, 22.1, 22.2, 22.3, 22.4]           # a second baseline, ten times the first
BETTER = [0.01, 0.02, 0.03, 0.04, 0.05]          # gains: mean 0.03, 95% t interval 0.03 +- 0.0196324
EVEN = [0.0, -0.02, 0.02, -0.01, 0.01]           # gains: mean 0, sd 0.0158114, se 0.00707107, 95% +- 0.0196324
LOWER = [g - 0.1 for g in EVEN]                  # gains: mean -0.1, same spread
#: variant -> (heads, its baseline or None, its gains over that baseline per seed)
VARIANTS = {"base": (1, None, None), "wide": (2, "base", BETTER), "lean": (1, "base", EVEN),
            "late": (2, "base", BETTER), "base2": (3, None, None), "lean2": (3, "base2", LOWER)}
LEVEL = {"base": BASE, "base2": BASE2}
CLAIMS = [
    {"name": "wide beats base", "source": "Paper, Table 1", "pairs": [["wide", "base"]], "paper_gain_percent": 1.0,
     "paper_scale": "a big model"},
    {"name": "lean is as good", "test": "as_good", "margin_percent": 1.0, "pairs": [["lean", "base"]]},
    {"name": "late beats base", "pairs": [["late", "base"]]},
    {"name": "wide is as good", "test": "as_good", "margin_percent": 1.0, "pairs": [["wide", "base"]]},
    {"name": "lean is equivalent", "test": "equivalent", "margin_percent": 1.0, "pairs": [["lean", "base"]]},
    # two pairs: Bonferroni over 2, and a 1% margin of 2.2 (0.022) on one, of 22.2 (0.222) on the other
    {"name": "both lean ones are as good", "test": "as_good", "margin_percent": 1.0,
     "pairs": [["lean", "base"], ["lean2", "base2"]]},
]


def study_file(tmp_path: Path, claims: list[dict]) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "claims.toml"
    variants = [{"name": n, "set": {"model.heads": [h]}} for n, (h, _, _) in VARIANTS.items()]
    path.write_text(tomli_w.dumps({"name": "claims", "seeds": 5, "base": tiny_nearest_config(100, 10, 10),
                                   "variants": variants, "claims": claims}))
    return path


def write_runs(tmp_path: Path, seeds: list[int], steps: tuple[int, ...] = tuple(range(10, 101, 10))) -> Path:
    """Runs whose final losses are their baseline's minus the gains, evaluated at ``steps`` with
    the same gains at every step; ``late`` beats the baseline at the end but trailed it at step
    90 (in the last quarter of 100 steps)."""
    study = load_study(str(study_file(tmp_path, CLAIMS)))
    out = tmp_path / "study"
    save_study(study, out, 5)
    for v in study.variants:
        _, base, gains = VARIANTS[v.name]
        plan = Plan.from_dict({"scheme": "explicit", "heads": v.config["model"]["heads"], "head_dims": [8]})
        for k, seed in enumerate(seeds):
            loss = LEVEL[v.name][k] if base is None else LEVEL[base][k] - gains[k]
            rows = [{"step": s, "eval_loss": loss + (100 - s) / 100} for s in steps]
            if v.name == "late":
                for row in rows:
                    if row["step"] == 90:
                        row["eval_loss"] = BASE[k] + 0.5    # worse than the baseline's BASE + 0.1
            summary = RunSummary(status=RunStatus.COMPLETED, final_eval_loss=loss, last_eval_loss=loss, params=1000,
                                 plan=plan, steps=100, tokens=1600, tokens_per_step=16)
            write_run_dir(run_dir(out, v.name, seed), v.config, summary, rows, seed)
    return out


def verdict_rows(text: str) -> dict[tuple[str, str], list[str]]:
    """(claim, comparison) -> the cells of its row in the verdict table."""
    section = text[text.index("## Verdicts on the papers' claims"):]
    return {(line.split("|")[1].strip(), line.split("|")[2].strip()): [c.strip() for c in line.split("|")[1:-1]]
            for line in section.splitlines() if line.startswith("| ") and "` vs `" in line}


def report(out: Path) -> str:
    return write_report(out, samples=False, conditioning=False, echo=lambda _: None).read_text()


#: the columns of the verdict table
TEST, N, GAIN, LEVEL_, DZ, P, VERDICT, LATE = 3, 5, 6, 7, 8, 10, 11, 12


def test_the_verdict_table_against_hand_worked_intervals(tmp_path):
    text = report(write_runs(tmp_path, [0, 1, 2, 3, 4]))
    rows = verdict_rows(text)
    assert "| gain [CI, Bonferroni over the claim's m] (% of baseline) | CI level |" in text
    assert "| p (one-sided, x m) | verdict | same verdict late in training |" in text
    wide = rows["wide beats base", "`wide` vs `base`"]
    # gain 0.03 [0.0103676, 0.0496324], +1.36% of the baseline mean 2.2; one comparison: 95%
    assert wide[GAIN] == "0.0300 [0.0104, 0.0496] (+1.36%)" and wide[LEVEL_] == "95% (m = 1)"
    assert wide[TEST] == "better (superiority, bound 0)"
    assert wide[N] == "5" and wide[VERDICT] == "superior" and wide[LATE] == "stable"
    assert wide[P] == "0.0066"                                          # p(t_4 > 4.242641) = 0.006618
    assert wide[DZ] == f"{0.03 / 0.0158114:.2f}"                       # d_z = mean / sd
    lean = rows["lean is as good", "`lean` vs `base`"]
    # margin 1% of 2.2 = 0.022 > the interval's half-width 0.0196: the interval lies within +-0.022
    assert lean[TEST] == "as good (non-inferiority, margin 0.0220)"
    assert lean[VERDICT] == "non-inferior within the margin (also equivalent (TOST))"
    late = rows["late beats base", "`late` vs `base`"]
    # at step 90 every gain is -0.4: an interval of no width below 0
    assert late[VERDICT] == "superior" and late[LATE] == "changed at step 90 of 100 (there: inferior)"
    assert "`late` vs `base`: still moving late in training, the verdict changed at step 90 of 100" in text
    assert "here 1.0k vs 1.0k params, 100 steps, 1,600 tokens" in text and "the paper: a big model" in text
    figure = {(r["claim"], r["variant"]): r for r in read_csv(tmp_path / "study" / "report" / "verdicts.csv")}
    w = figure["wide beats base", "wide"]
    assert float(w["gain_percent"]) == pytest.approx(100 * 0.03 / 2.2, rel=1e-5)
    assert float(w["paper_percent"]) == pytest.approx(1.0)
    assert float(figure["lean is as good", "lean"]["margin_percent"]) == pytest.approx(1.0)
    # one comparison: the adjusted interval is the unadjusted 95% one
    assert float(w["low_adjusted_percent"]) == pytest.approx(float(w["low_95_unadjusted_percent"]), rel=1e-9)
    assert float(w["low_95_unadjusted_percent"]) == pytest.approx(100 * (0.03 - 0.0196324) / 2.2, rel=1e-5)


def test_as_good_superior_is_never_called_equivalent_and_tost_is_its_own_test(tmp_path):
    rows = verdict_rows(report(write_runs(tmp_path, [0, 1, 2, 3, 4])))
    wide = rows["wide is as good", "`wide` vs `base`"]
    # [0.0104, 0.0496] lies above 0 and above -0.022 but reaches past +0.022
    assert wide[VERDICT] == "non-inferior within the margin (also superior: the interval excludes 0)"
    assert "equivalent" not in wide[VERDICT]
    lean = rows["lean is equivalent", "`lean` vs `base`"]
    assert lean[TEST] == "equivalent (TOST, margin ±0.0220)" and lean[VERDICT] == "equivalent"
    # TOST p: both one-sided t = 0.022 / 0.00707107 = 3.111270, p(t_4 > 3.111270) = 0.017914
    assert lean[P] == "0.018"


def test_bonferroni_over_a_claim_and_each_pair_against_its_own_baseline_s_margin(tmp_path):
    text = report(write_runs(tmp_path, [0, 1, 2, 3, 4]))
    rows = verdict_rows(text)
    lean = rows["both lean ones are as good", "`lean` vs `base`"]
    # two comparisons: each at 97.5%, half-width t(0.9875, 4) x 0.00707107 = 3.495406 x 0.00707107 = 0.024716,
    # wider than the 0.022 margin; alone (above) the same gains are non-inferior
    assert lean[LEVEL_] == "97.5% (m = 2)" and lean[GAIN].endswith("[-0.0247, 0.0247] (+0.00%)")
    assert lean[VERDICT] == "not shown at this scale"
    # p x 2: 2 x p(t_4 > 0.022 / 0.00707107) = 2 x 0.017914
    assert lean[P] == "0.036"
    need = seeds_for_power(0.0158114, "as_good", true_gain=0.0, margin=0.022, alpha=0.0125)
    assert need is not None and need > 5
    assert (f"`lean` vs `base` (5 seeds ran): about {need} seeds for 80% power to show non-inferiority if the true "
            "gain is 0 (sd 0.0158 observed, one-sided level 0.0125).") in text
    lean2 = rows["both lean ones are as good", "`lean2` vs `base2`"]
    # its own margin is 1% of 22.2 = 0.222: [-0.1247, -0.0753] lies above -0.222 (and within +-0.222); the
    # first pair's 0.022 would have called it inferior
    assert lean2[TEST] == "as good (non-inferiority, margin 0.2220)"
    assert lean2[VERDICT] == "non-inferior within the margin (also equivalent (TOST))"
    # late in training the same level and bounds are used: at 95% lean would be non-inferior, and against
    # 0.022 lean2 inferior, at every evaluation
    assert lean[LATE] == lean2[LATE] == "stable"
    figure = {(r["claim"], r["variant"]): r for r in read_csv(tmp_path / "study" / "report" / "verdicts.csv")}
    two = figure["both lean ones are as good", "lean2"]
    assert float(two["margin_percent"]) == pytest.approx(1.0) and float(two["ci_level"]) == pytest.approx(0.975)
    one = figure["both lean ones are as good", "lean"]
    assert float(one["low_adjusted_percent"]) == pytest.approx(-100 * 0.0247163 / 2.2, rel=1e-4)
    assert float(one["low_95_unadjusted_percent"]) == pytest.approx(-100 * 0.0196324 / 2.2, rel=1e-4)


@pytest.mark.parametrize("steps, late", [((50, 100), "unchecked: only 1 evaluation in the last quarter"),
                                         ((20, 80, 100), "unchecked: only 2 evaluations in the last quarter"),
                                         ((70, 80, 90, 100), None)])
def test_the_late_training_check_needs_three_evaluations_in_the_last_quarter(tmp_path, steps, late):
    text = report(write_runs(tmp_path, [0, 1, 2, 3, 4], steps))
    rows = verdict_rows(text)
    if late is None:   # 80, 90 and 100 are in the last quarter; 70 is not
        assert rows["wide beats base", "`wide` vs `base`"][LATE] == "stable"
        assert rows["late beats base", "`late` vs `base`"][LATE] == "changed at step 90 of 100 (there: inferior)"
        return
    assert {r[LATE] for r in rows.values()} == {late}
    assert f"`wide` vs `base`: whether the verdict holds late in training is {late} (needs 3)" in text
    assert "still moving" not in text   # late's step 90 is not evaluated here


def test_relabelled_seeds_give_the_same_verdicts(tmp_path):
    first = verdict_rows(report(write_runs(tmp_path / "a", [0, 1, 2, 3, 4])))
    # the same runs filed under other seed numbers (each seed's pair keeps its partner)
    second = verdict_rows(report(write_runs(tmp_path / "b", [4, 0, 3, 1, 2])))
    assert first == second


@pytest.mark.parametrize("claim, message", [
    ({"name": "x", "pairs": [["nope", "base"]]}, "claim 'x' names variant 'nope', which the study does not have"),
    ({"name": "x", "test": "as_good", "pairs": [["wide", "base"]]}, "needs exactly one of margin or margin_percent"),
    ({"name": "x", "margin": 0.1, "pairs": [["wide", "base"]]}, "a margin belongs to an as_good or equivalent claim"),
    ({"name": "x", "test": "equivalent", "pairs": [["wide", "base"]]},
     "an equivalent claim needs exactly one of margin or margin_percent"),
    ({"name": "x", "test": "equivalent", "margin": 1, "margin_percent": 1, "pairs": [["wide", "base"]]},
     "an equivalent claim needs exactly one of margin or margin_percent"),
    ({"name": "x", "test": "same", "pairs": [["wide", "base"]]}, "'better', 'as_good' or 'equivalent'"),
    ({"name": "x", "metric": "accuracy", "pairs": [["wide", "base"]]}, "say whether a higher or lower 'accuracy'"),
    ({"name": "x", "test": "as_good", "margin": -1, "pairs": [["wide", "base"]]}, "greater than 0"),
])
def test_a_bad_claim_is_one_line(tmp_path, claim, message):
    with pytest.raises(HeadwiseError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        load_study(str(study_file(tmp_path, [claim])))
    assert "\n" not in str(err.value)


def test_claims_are_part_of_the_identity_and_none_keeps_the_old_one(tmp_path):
    with_claims = load_study(str(study_file(tmp_path, CLAIMS)))
    without = load_study(str(study_file(tmp_path, [])))
    assert "claims" not in without.identity()["definition"]
    assert with_claims.fingerprint() != without.fingerprint()


def test_an_accuracy_claim_reads_the_eval_metric_in_points_and_higher_is_a_gain(tmp_path):
    from headwise.report.data import RunRecord
    from headwise.report.paired import paired_gain
    from headwise.report.verdicts import final_value
    from headwise.study.claims import Claim
    from headwise.study.results import RunResult

    claim = Claim.parse({"name": "x", "metric": "accuracy", "better": "higher", "percent": True,
                         "test": "as_good", "margin": 1.0, "pairs": [["a", "b"]]})
    plan = Plan.from_dict({"scheme": "explicit", "heads": [1], "head_dims": [8]})

    def run(acc, status=RunStatus.COMPLETED):
        summary = RunSummary(status=status, final_eval_loss=1.0, eval_metrics={"accuracy": acc}, params=10, plan=plan)
        return RunRecord(RunResult("a", 0, {}, status, "runs/a/seed0", summary, {}), tmp_path, None)

    assert final_value(run(0.375), claim) == pytest.approx(37.5)
    assert final_value(run(0.375, RunStatus.DIVERGED), claim) is None
    assert final_value(run(float("nan")), claim) is None
    gain = paired_gain({0: 37.5, 1: 40.0}, {0: 36.0, 1: 39.5}, claim.higher_is_better)
    assert gain.gains == (1.5, 0.5) and claim.margin_for(38.0) == 1.0


def test_results_csv_carries_each_family_s_metrics_and_unit(tmp_path):
    from headwise.study.results import RunResult, results_csv
    from headwise.study.layout import load_study_record

    out = write_runs(tmp_path, [0, 1, 2, 3, 4])
    record = load_study_record(out)
    plan = Plan.from_dict({"scheme": "explicit", "heads": [4], "head_dims": [16]})
    images = RunSummary(status=RunStatus.COMPLETED, final_eval_loss=0.5, eval_metrics={"accuracy": 0.8125, "top5": 0.99},
                        params=10, plan=plan, unit="images", tokens_per_s=321.5, tokens=60000)
    text = RunSummary(status=RunStatus.COMPLETED, final_eval_loss=2.5, params=10, plan=plan, tokens_per_s=4000.0)
    rows = [RunResult("base", 0, {}, RunStatus.COMPLETED, "runs/base/seed0", images),
            RunResult("wide", 0, {}, RunStatus.COMPLETED, "runs/wide/seed0", text)]
    lines = results_csv(record, rows).splitlines()
    header = lines[0].split(",")
    # the metrics follow the loss; the throughput names its unit
    assert header[header.index("final_eval_loss") + 1:header.index("final_eval_loss") + 3] == ["eval_accuracy", "eval_top5"]
    first, second = (dict(zip(header, line.split(","))) for line in lines[1:])
    assert (first["eval_accuracy"], first["eval_top5"], first["unit"], first["per_s"], first["seen"]) == \
        ("0.8125", "0.99", "images", "321.5", "60000")
    assert (second["eval_accuracy"], second["unit"], second["per_s"]) == ("", "tokens", "4000")
