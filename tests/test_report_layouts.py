"""The layout registry and the ``[report]`` table: kinds by name, each layout's keys validated
with one-line errors, and a new kind added by registering one class."""

from __future__ import annotations

import pytest
import tomli_w

from headwise.cli import main
from headwise.errors import HeadwiseError
from headwise.plans import plan_heads
from headwise.report import ReportSpec, write_report
from headwise.report.registry import Layout, LayoutOptions, get_layout, layout_kinds, register_layout
from headwise.run import RunStatus, RunSummary, write_summary
from headwise.study import load_study
from headwise.study.layout import run_dir, save_study
from headwise.study.definition import load_study_file


def _study_with_report(tmp_path, report: dict) -> str:
    raw, _ = load_study_file("progression")
    raw["report"] = report
    path = tmp_path / "study.toml"
    path.write_text(tomli_w.dumps(raw))
    return str(path)


def test_builtin_kinds_are_registered():
    assert {"heads", "depth", "rank"} <= set(layout_kinds())
    assert get_layout("depth").kind == "depth"


def _refused_before_any_run(tmp_path, capsys, path: str) -> str:
    """``headwise study`` on ``path`` exits 2 before making the study directory; its one line."""
    out = tmp_path / "out"
    assert main(["study", path, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and not out.exists(), err
    return err


def test_unknown_kind_is_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(HeadwiseError, match=r"unknown report kind 'hedas'; did you mean 'heads'\?"):
        get_layout("hedas")
    path = _study_with_report(tmp_path, {"kind": "hedas"})
    err = _refused_before_any_run(tmp_path, capsys, path)
    assert "report.kind: unknown report kind 'hedas'; did you mean 'heads'?" in err, err
    # the study keeps the table as written; a dry run lists the variants without the report
    assert load_study(path).config.report["kind"] == "hedas"
    assert main(["study", path, "--dry-run"]) == 0


@pytest.mark.parametrize("report, needle", [
    ({"kind": "heads", "at_head": 90}, "unknown key 'at_head' for report kind 'heads'; did you mean 'at_heads'?"),
    ({"kind": "depth", "series": "scheme"}, "unknown key 'series' for report kind 'depth'"),
    ({"kind": "heads", "promt": "Once"}, "did you mean 'prompt'?"),
    ({"kind": "heads", "paper": {"sorce": "x", "at_heads": 1, "difference": {"a": 1}}}, "did you mean 'source'?"),
    ({"kind": "heads", "at_heads": -1}, "at_heads"),
])
def test_layout_keys_are_validated_in_one_line(tmp_path, capsys, report, needle):
    path = _study_with_report(tmp_path, report)
    err = _refused_before_any_run(tmp_path, capsys, path)
    assert needle in err, err


def test_without_a_kind_the_task_family_chooses_the_layout(tmp_path):
    raw, _ = load_study_file("rank")
    del raw["report"]
    path = tmp_path / "rank.toml"
    path.write_text(tomli_w.dumps(raw))
    study = load_study(str(path), preset="quick")
    assert "kind" not in study.config.report
    out = tmp_path / "rank"
    save_study(study, out, 1)
    for v in study.variants:
        m = v.config["model"]
        plan = plan_heads("explicit", 1, 16, heads=m["heads"], head_dim=m["head_dim"])
        run = run_dir(out, v.name, 0)
        run.mkdir(parents=True)
        (run / "config.toml").write_text(tomli_w.dumps(v.config))
        write_summary(run, RunSummary(status=RunStatus.COMPLETED, final_eval_loss=0.5, params=1, d_model=16, plan=plan))
    text = write_report(out, samples=False, echo=lambda _: None).read_text()
    assert "## Error vs rank per head" in text  # the nearest-neighbour family's layout
    # a layout's keys need the layout named
    with pytest.raises(HeadwiseError, match="keys 'series' belong to a layout: name it with `kind`"):
        ReportSpec.parse({"series": "scheme"})


def test_layout_keys_stay_as_written_and_typed():
    spec = ReportSpec.parse({"kind": "heads", "series": "scheme", "at_heads": 180})
    assert spec.options.at_heads == 180.0 and spec.options.baseline is None
    assert spec.to_dict()["at_heads"] == 180 and "baseline" not in spec.to_dict()
    assert load_study("progression", preset="paper").config.report["at_heads"] == 180


class ToyOptions(LayoutOptions):
    title: str


@register_layout
class ToyLayout(Layout):
    """A layout as a new study kind would add one: its own keys and sections."""

    kind = "toy-test"
    Options = ToyOptions
    conditioning = False

    def sections(self, doc):
        losses = ", ".join(f"{v.name} {v.stats.mean:.2f}" for v in self.study.done)
        doc.add(f"## {self.options.title}", losses)
        return [f"{len(self.study.done)} variants done"]


def test_a_registered_layout_writes_the_report(tmp_path):
    path = _study_with_report(tmp_path, {"kind": "toy-test", "title": "Toy section"})
    study = load_study(path, preset="quick")
    out = tmp_path / "toy"
    save_study(study, out, 1)
    for v in study.variants:
        plan = plan_heads(v.config["model"]["plan"]["scheme"], 4, 96, 90)
        write_summary(run_dir(out, v.name, 0), RunSummary(status=RunStatus.COMPLETED, final_eval_loss=3.0,
                                                          params=1, plan=plan))
    text = write_report(out, samples=False, echo=lambda _: None).read_text()
    assert "## Toy section\n\nconstant-h90 3.00, ascending-h90 3.00, descending-h90 3.00" in text
    assert "- 3 variants done" in text and "## All runs" in text and "## Conditioning" not in text
    with pytest.raises(HeadwiseError, match="unknown key 'titel'"):
        ReportSpec.parse({"kind": "toy-test", "titel": "x"})
