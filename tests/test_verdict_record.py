"""The verdict record (docs/verdicts.json) behind the README's verdict table, and the rule by which
a rerun reproduces it (headwise.report.verdict_record)."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
import tomllib
from pathlib import Path

import pytest
import tomli_w

from bad_input_harness import Case, c, check_outcome, snapshot
from headwise.report.document import fmt
from headwise.report.verdict_record import VerdictRow, disagreements, rows_of, study_entry
from test_verdicts import write_runs

ROOT = Path(__file__).resolve().parents[1]


def row(mean=0.5, low=0.3, high=0.7, verdict="superior", variant="v") -> VerdictRow:
    return VerdictRow("c", variant, "b", "better", "error", 5, mean, low, high, 0.95, 1.0, verdict, "")


def test_a_rerun_within_each_other_s_interval_with_the_same_verdict_reproduces():
    assert disagreements([row()], [row(mean=0.6, low=0.45, high=0.75)]) == []


@pytest.mark.parametrize("rerun, problem", [
    (row(mean=0.72, low=0.45, high=0.99), "the rerun's mean 0.72 lies outside the recorded interval [0.3, 0.7]"),
    (row(mean=0.65, low=0.62, high=0.68), "the recorded mean 0.5 lies outside the rerun's interval [0.62, 0.68]"),
    (row(mean=0.5, low=-0.1, high=1.1, verdict="not shown at this scale"),
     "verdict 'not shown at this scale', recorded 'superior'"),
    (row(variant="other"), "not in the rerun"),
])
def test_a_rerun_that_moves_is_named(rerun, problem):
    found = disagreements([row()], [rerun])
    assert len(found) == 1 and problem in found[0] and found[0].startswith("'c': v vs b")


def test_the_readme_quotes_the_recorded_verdicts():
    """Every recorded comparison's gain, interval and verdict are on one row of the README's table."""
    record = json.loads((ROOT / "docs" / "verdicts.json").read_text())
    readme = (ROOT / "README.md").read_text()
    table = [line for line in readme[readme.index("## Verdicts on the papers' claims"):].splitlines()
             if line.startswith("| [")]
    for study, entry in record.items():
        for r in rows_of(entry):
            interval = f"{fmt(r.mean)} [{fmt(r.low)}, {fmt(r.high)}]"
            lines = [line for line in table if interval in line]
            assert len(lines) == 1, f"{study}: the README has no row (or several) with {interval}"
            assert r.verdict in lines[0], f"{study}: the README's row with {interval} does not say {r.verdict!r}"
            assert re.search(rf"\), {r.n} \|", lines[0]), f"{study}: the README's row with {interval} does not say n {r.n}"


# --- benchmarks/check_verdicts.py on fabricated study folders and a copy of the record ----------------

def _load_check_verdicts():
    spec = importlib.util.spec_from_file_location("check_verdicts", ROOT / "benchmarks" / "check_verdicts.py")
    module = sys.modules["check_verdicts"] = importlib.util.module_from_spec(spec)  # its dataclass looks itself up
    spec.loader.exec_module(module)
    return module


check_verdicts = _load_check_verdicts()


def set_study(study_dir: Path, **changes) -> None:
    """Rewrite fields of a study folder's study.toml (``claims=None`` drops its claims)."""
    path = study_dir / "study.toml"
    data = tomllib.loads(path.read_text())
    if changes.pop("claims", True) is None:
        data["definition"].pop("claims")
    path.write_text(tomli_w.dumps({**data, **changes}))


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """Once per module: a finished study ``claims`` of 5 seeds (preset quick), the same as a search's
    confirmation (a search of preset quick), one with no claims, and a record whose ``claims`` entry
    holds that study's rows at preset verdict with 5 seeds."""
    root = tmp_path_factory.mktemp("made")
    study = write_runs(root / "w", [0, 1, 2, 3, 4])
    set_study(study, preset="quick")
    shutil.copytree(study, root / "search" / "confirm")
    (root / "search" / "search.toml").write_text(tomli_w.dumps(
        {"name": "claims", "preset": "quick", "definition": {}, "fingerprint": "0"}))
    shutil.copytree(study, root / "no-claims")
    set_study(root / "no-claims", claims=None, preset="verdict")
    record = json.loads((ROOT / "docs" / "verdicts.json").read_text())
    record["claims"] = {**study_entry(study, "headwise study claims --preset verdict"), "preset": "verdict"}
    assert len(record["claims"]["rows"]) == 7
    (root / "verdicts.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    shutil.move(study, root / "study")
    return root


@pytest.fixture
def workdir(made, tmp_path, monkeypatch) -> Path:
    """A fresh copy of ``made``, whose verdicts.json the script reads and writes."""
    root = tmp_path / "w"
    shutil.copytree(made, root)
    monkeypatch.setattr(check_verdicts, "RECORD", root / "verdicts.json")
    monkeypatch.chdir(root)
    return root


def run_check_verdicts(root: Path, case: Case, capsys) -> str:
    """Run ``case`` in-process and check the house promise for it (its one line on stderr, its status,
    nothing on disk changed); its stdout."""
    before = snapshot(root)
    capsys.readouterr()
    try:
        code = check_verdicts.main(case.argv)
    except SystemExit as exc:  # argparse: a usage error
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    check_outcome(case, code, err, before, snapshot(root))
    assert err.startswith("check_verdicts"), err  # the house line names its command
    return out


OTHER_RUN = ("claims", "quick", "verdict")


@pytest.mark.parametrize("case", [
    # a record may be replaced only by a run of its own preset and seeds, with comparisons, or on purpose
    c("record-another-preset", "record", "study", says=OTHER_RUN + ("5 seeds", "--replace")),
    c("record-another-search-preset", "record", "search", says=OTHER_RUN + ("--replace",)),
    c("record-no-comparisons", "record", "no-claims", says=("no comparisons", "holds 7", "--replace")),
    c("record-the-same-study-twice", "record", "study", "search", "--replace", says="second run of study claims"),
    # a run of another preset is no NOT REPRODUCED: it is not the recorded study
    c("compare-another-preset", "compare", "study", says=OTHER_RUN + ("compare a run of that command",)),
    c("compare-another-search-preset", "compare", "search", says=OTHER_RUN),
    c("compare-a-confirmation-alone", "compare", "search/confirm", says=OTHER_RUN),
    # not a study folder
    c("compare-missing", "compare", "nowhere", says=("nowhere", "not a folder")),
    c("record-a-file", "record", "verdicts.json", says="not a folder"),
    c("compare-a-run-folder", "compare", "study/runs", says="not a study directory"),
    c("record-a-search-without-confirmation", "record", "search-alone", says="no confirmation"),
    c("check-unrecorded", "check", "nope", says="no record of study 'nope'"),
    c("check-a-search", "check", "progression-confirm", says="recorded from a search"),
    c("record-usage", "record", says="check_verdicts.py record: error"),
], ids=lambda case: case.id)
def test_check_verdicts_refuses_bad_input_in_one_line_and_keeps_the_record(workdir, capsys, case):
    (workdir / "search-alone").mkdir()
    (workdir / "search-alone" / "search.toml").write_text((workdir / "search" / "search.toml").read_text())
    out = run_check_verdicts(workdir, case, capsys)
    assert "NOT REPRODUCED" not in out and "recorded " not in out


@pytest.mark.parametrize("damage", [lambda t: t[:len(t) // 2], lambda t: "[]", lambda t: '{"rank": {"rows": [{}]}}',
                                    lambda t: t.replace('"preset"', '"presets"')],
                         ids=["cut", "a-list", "a-bad-row", "no-preset"])
@pytest.mark.parametrize("argv", [["record", "study", "--replace"], ["compare", "study"], ["check", "rank"]],
                         ids=lambda argv: argv[0])
def test_a_damaged_record_is_one_line_that_says_how_to_restore_it(workdir, capsys, damage, argv):
    path = workdir / "verdicts.json"
    path.write_text(damage(path.read_text()))
    run_check_verdicts(workdir, c("damaged", *argv, says=(str(path), "damaged", "git checkout docs/verdicts.json")),
                       capsys)


def test_record_replaces_a_record_with_a_run_of_its_preset_and_seeds_or_on_purpose(workdir, capsys):
    def recorded():
        return json.loads((workdir / "verdicts.json").read_text())

    before = recorded()
    set_study(workdir / "study", preset="verdict")
    assert check_verdicts.main(["compare", "study"]) == 0      # the same rows as recorded
    assert check_verdicts.main(["record", "study"]) == 0
    assert recorded()["claims"]["rows"] == before["claims"]["rows"]
    assert check_verdicts.main(["record", "no-claims", "--replace"]) == 0
    after = recorded()
    assert after["claims"]["rows"] == [] and after["rank"] == before["rank"]
    for search in ("search", "search/confirm"):  # a confirmation is recorded as the search that ran it
        assert check_verdicts.main(["record", search, "--replace"]) == 0
        assert recorded()["claims"]["preset"] == "quick"
        assert recorded()["claims"]["command"] == "headwise search claims --preset quick"
    assert "recorded claims: 7 comparisons" in capsys.readouterr().out
