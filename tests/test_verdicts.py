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

from helpers import read_csv, tiny_nearest_config, write_run_dir

BASE = [2.0, 2.1, 2.2, 2.3, 2.4]                 # the baseline's final loss per seed
BETTER = [0.01, 0.02, 0.03, 0.04, 0.05]          # gains: mean 0.03, 95% t interval 0.03 +- 0.0196324
EVEN = [0.0, -0.02, 0.02, -0.01, 0.01]           # gains: mean 0, interval +- 0.0196324
CLAIMS = [
    {"name": "wide beats base", "source": "Paper, Table 1", "pairs": [["wide", "base"]], "paper_gain_percent": 1.0,
     "paper_scale": "a big model"},
    {"name": "lean is as good", "test": "as_good", "margin_percent": 1.0, "pairs": [["lean", "base"]]},
    {"name": "late beats base", "pairs": [["late", "base"]]},
]


def study_file(tmp_path: Path, claims: list[dict]) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "claims.toml"
    variants = [{"name": n, "set": {"model.heads": [h]}} for n, h in (("base", 1), ("wide", 2), ("lean", 1),
                                                                          ("late", 2))]
    path.write_text(tomli_w.dumps({"name": "claims", "seeds": 5, "base": tiny_nearest_config(100, 10, 10),
                                   "variants": variants, "claims": claims}))
    return path


def write_runs(tmp_path: Path, seeds: list[int]) -> Path:
    """Runs whose final losses are BASE minus the gains; ``late`` beats the baseline at the end
    but trailed it at step 90 (the last fifth of 100 steps)."""
    study = load_study(str(study_file(tmp_path, CLAIMS)))
    out = tmp_path / "study"
    save_study(study, out, 5)
    finals = {"base": [0.0] * 5, "wide": BETTER, "lean": EVEN, "late": BETTER}
    for v in study.variants:
        plan = Plan.from_dict({"scheme": "explicit", "heads": v.config["model"]["heads"], "head_dims": [8]})
        for k, seed in enumerate(seeds):
            loss = BASE[k] - finals[v.name][k]
            rows = [{"step": s, "eval_loss": loss + (100 - s) / 100} for s in range(10, 101, 10)]
            if v.name == "late":
                rows[8]["eval_loss"] = BASE[k] + 0.5    # step 90: worse than the baseline's BASE + 0.1
            summary = RunSummary(status=RunStatus.COMPLETED, final_eval_loss=loss, last_eval_loss=loss, params=1000,
                                 plan=plan, steps=100, tokens=1600, tokens_per_step=16)
            write_run_dir(run_dir(out, v.name, seed), v.config, summary, rows, seed)
    return out


def verdict_rows(text: str) -> dict[str, list[str]]:
    section = text[text.index("## Verdicts on the papers' claims"):]
    return {line.split("|")[2].strip(): [c.strip() for c in line.split("|")[1:-1]]
            for line in section.splitlines() if line.startswith("| ") and "` vs `" in line}


def test_the_verdict_table_against_hand_worked_intervals(tmp_path):
    text = write_report(write_runs(tmp_path, [0, 1, 2, 3, 4]), samples=False, conditioning=False,
                        echo=lambda _: None).read_text()
    rows = verdict_rows(text)
    wide = rows["`wide` vs `base`"]
    # gain 0.03 [0.0103676, 0.0496324], +1.36% of the baseline mean 2.2
    assert wide[6] == "0.0300 [0.0104, 0.0496] (+1.36%)"
    assert wide[5] == "5" and wide[10] == "reproduced" and wide[11] == "yes"
    assert wide[7] == f"{0.03 / 0.0158114:.2f}"                       # d_z = mean / sd
    lean = rows["`lean` vs `base`"]
    # margin 1% of 2.2 = 0.022 > the interval's half-width 0.0196: the interval stays above -0.022
    assert lean[3] == "as good (margin 0.0220)" and lean[10] == "equivalent within the margin"
    late = rows["`late` vs `base`"]
    assert late[10] == "reproduced" and late[11] == "no: the ranking was reversed at step 90 of 100"
    assert "still moving" in text and "here 1.0k vs 1.0k params, 100 steps, 1,600 tokens" in text and "the paper: a big model" in text
    figure = {r["variant"]: r for r in read_csv(tmp_path / "study" / "report" / "verdicts.csv")}
    assert float(figure["wide"]["gain_percent"]) == pytest.approx(100 * 0.03 / 2.2, rel=1e-5)
    assert float(figure["wide"]["paper_percent"]) == pytest.approx(1.0)
    assert float(figure["lean"]["margin_percent"]) == pytest.approx(1.0)


def test_relabelled_seeds_give_the_same_verdicts(tmp_path):
    first = verdict_rows(write_report(write_runs(tmp_path / "a", [0, 1, 2, 3, 4]), samples=False,
                                      conditioning=False, echo=lambda _: None).read_text())
    # the same runs filed under other seed numbers (each seed's pair keeps its partner)
    second = verdict_rows(write_report(write_runs(tmp_path / "b", [4, 0, 3, 1, 2]), samples=False,
                                       conditioning=False, echo=lambda _: None).read_text())
    assert first == second


@pytest.mark.parametrize("claim, message", [
    ({"name": "x", "pairs": [["nope", "base"]]}, "claim 'x' names variant 'nope', which the study does not have"),
    ({"name": "x", "test": "as_good", "pairs": [["wide", "base"]]}, "needs exactly one of margin or margin_percent"),
    ({"name": "x", "margin": 0.1, "pairs": [["wide", "base"]]}, "a margin belongs to an as_good claim"),
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
