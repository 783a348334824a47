"""Study definitions: variant expansion and names, presets, validation of every variant."""

import pytest

from headwise.cli import main
from headwise.config import deep_merge
from headwise.errors import HeadwiseError
from headwise.plans import Scheme
from headwise.study import load_study
from headwise.study.definition import builtin_studies, load_study_file, resolve_study

NEAREST_BASE = {
    "model": {"preset": "amsel-nn", "d_model": 8, "heads": 1, "mlp_hidden": 16, "max_seq_len": 16},
    "task": {"kind": "nearest", "dim": 8, "n_points": 4},
    "train": {"micro_batch": 8, "steps": 5, "device": "cpu"},
}


def study(**extra):
    return {"name": "t", "base": NEAREST_BASE, **extra}


def test_axes_expand_in_order_with_readable_names():
    raw = study(axes=[
        {"name": "layers", "key": "model.n_layers", "label": "l{value}", "values": [1, 2]},
        {"name": "shape", "values": [{"label": "r8-h1", "set": {"model.head_dim": 8, "model.heads": 1}},
                                     {"label": "r1-h8", "set": {"model.head_dim": 1, "model.heads": 8}}]},
    ])
    s = resolve_study(raw, "test", seeds=2)
    assert [v.name for v in s.variants] == ["l1-r8-h1", "l1-r1-h8", "l2-r8-h1", "l2-r1-h8"]
    v = s.variants[3]
    assert v.labels == {"layers": "l2", "shape": "r1-h8"}
    # `heads = 8` means 8 in every layer
    assert v.config["model"]["heads"] == [8, 8] and v.config["model"]["n_layers"] == 2
    runs = s.runs()
    assert [(r.variant, r.seed) for r in runs[:3]] == [("l1-r8-h1", 0), ("l1-r8-h1", 1), ("l1-r1-h8", 0)]
    assert runs[1].config["train"]["seed"] == 1
    # the base is not shared between variants
    assert s.variants[0].config["model"]["heads"] == [1]


def test_scalar_labels_default_and_lists():
    raw = study(axes=[{"name": "scheme", "key": "model.heads", "values": [[1, 2], [2, 1]]},
                      {"name": "lr", "key": "optim.lr", "values": [0.01]}],
                base={**NEAREST_BASE, "model": {**NEAREST_BASE["model"], "n_layers": 2, "head_dim": 4}})
    names = [v.name for v in resolve_study(raw, "test").variants]
    assert names == ["scheme1x2-lr0.01", "scheme2x1-lr0.01"]


def test_grids_union_and_explicit_variants_dedupe_by_name():
    axis = {"name": "layers", "key": "model.n_layers", "label": "l{value}"}
    raw = study(grids=[{"axes": [{**axis, "values": [1, 2]}]}, {"axes": [{**axis, "values": [2, 3]}]}],
                variants=[{"name": "wide", "set": {"model.heads": 2, "model.head_dim": 4}}])
    s = resolve_study(raw, "test")
    assert [v.name for v in s.variants] == ["l1", "l2", "l3", "wide"]
    assert s.variants[3].config["model"]["heads"] == [2]
    clash = study(axes=[{**axis, "values": [1]}], variants=[{"name": "l1", "set": {"model.n_layers": 2}}])
    with pytest.raises(HeadwiseError, match="'l1' is produced twice"):
        resolve_study(clash, "test")


def test_a_rejected_axis_value_names_its_variant():
    raw = study(axes=[{"name": "heads", "key": "model.heads", "label": "h{value}", "values": [1, 0]}])
    with pytest.raises(HeadwiseError, match=r"variant 'h0'.*heads = 0; every layer needs at least 1 head"):
        resolve_study(raw, "test")
    bad_key = study(axes=[{"name": "x", "key": "train.stepz", "values": [3]}])
    with pytest.raises(HeadwiseError, match=r"variant 'x3'.*unknown key 'train.stepz'.*did you mean 'steps'"):
        resolve_study(bad_key, "test")
    wrong_width = study(axes=[{"name": "d", "key": "model.d_model", "values": [16]}])
    with pytest.raises(HeadwiseError, match=r"variant 'd16'.*differs from the task's vector size 8"):
        resolve_study(wrong_width, "test")


def test_presets_merge_extend_and_are_checked():
    raw = study(axes=[{"name": "layers", "key": "model.n_layers", "values": [1]}], default_preset="a",
                presets={"a": {"summary": "A", "base": {"train": {"steps": 7}}},
                         "b": {"extends": "a", "base": {"optim": {"lr": 0.5}},
                               "axes": [{"name": "layers", "key": "model.n_layers", "values": [2, 3]}]},
                         "loop": {"extends": "loop"}})
    a = resolve_study(raw, "test")
    assert a.preset == "a" and a.preset_summary == "A" and a.variants[0].config["train"]["steps"] == 7
    b = resolve_study(raw, "test", preset="b")
    assert [v.name for v in b.variants] == ["layers2", "layers3"]
    assert b.variants[0].config["train"]["steps"] == 7 and b.variants[0].config["optim"]["lr"] == 0.5
    assert a.fingerprint() != b.fingerprint()
    with pytest.raises(HeadwiseError, match=r"no preset 'c'.*presets: a, b, loop"):
        resolve_study(raw, "test", preset="c")
    with pytest.raises(HeadwiseError, match="in a loop"):
        resolve_study(raw, "test", preset="loop")


def test_overrides_apply_to_the_base_and_change_the_identity():
    raw = study(axes=[{"name": "layers", "key": "model.n_layers", "values": [1]}])
    plain = resolve_study(raw, "test")
    over = resolve_study(raw, "test", overrides=["optim.lr=0.02"])
    assert over.variants[0].config["optim"]["lr"] == 0.02
    assert plain.fingerprint() != over.fingerprint()
    # the seed count is not part of the identity (seeds can be added to a study)
    assert resolve_study(raw, "test", seeds=3).fingerprint() == plain.fingerprint()
    # nor how it is run or reported: both can change between reruns of one study
    shown = resolve_study({**raw, "report": {"kind": "rank"}, "runner": {"jobs": 2}}, "test")
    assert shown.fingerprint() == plain.fingerprint()
    with pytest.raises(HeadwiseError, match="key=value"):
        resolve_study(raw, "test", overrides=["optim.lr"])


#: a list given on a shell command line whose quotes the shell ate: TOML reads no literal, so a string
BARE_LIST = "model.heads=a,b"
HINT = r"\(model.heads=a,b was read as the string 'a,b': quote strings inside it .* --set 'model.heads=\[\"a\",\"b\"\]'\)"


def test_a_bare_override_that_should_be_a_list_hints_at_quoting_in_a_study_and_a_search():
    # both go through config.apply_overrides and its hints, as `headwise train --set` does
    from headwise.search.definition import resolve_search
    from test_search_confirm import RAW

    raw = study(axes=[{"name": "layers", "key": "model.n_layers", "values": [1]}])
    with pytest.raises(HeadwiseError, match=r"variant 'layers1': run config: model.heads: .*" + HINT):
        resolve_study(raw, "test", overrides=[BARE_LIST])
    with pytest.raises(HeadwiseError, match=r"test \[base\]: model.heads: .*" + HINT):
        resolve_search(RAW, "test", overrides=[BARE_LIST])
    # a hint only where quoting is what went wrong
    with pytest.raises(HeadwiseError) as refused:
        resolve_study(raw, "test", overrides=["optim.lr=fast"])
    assert "optim.lr" in str(refused.value) and "quote" not in str(refused.value)


def test_deep_merge_merges_tables_and_replaces_lists():
    assert deep_merge({"a": {"x": 1, "y": [1, 2]}, "b": 1}, {"a": {"y": [3]}, "c": 2}) == \
        {"a": {"x": 1, "y": [3]}, "b": 1, "c": 2}


def test_unknown_study_and_missing_file():
    with pytest.raises(HeadwiseError, match=r"unknown study 'progresion'; did you mean 'progression'"):
        load_study_file("progresion")
    with pytest.raises(HeadwiseError, match="does not exist"):
        load_study_file("nothere/study.toml")


def test_study_file_needs_variants(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('name = "s"\n[base]\n')
    with pytest.raises(HeadwiseError, match="needs `axes`, `grids` or `variants`"):
        load_study(str(path))


@pytest.mark.parametrize("name", ["progression", "depth-for-heads", "rank"])
@pytest.mark.parametrize("preset", ["paper", "tiny", "quick"])
def test_builtin_studies_resolve_and_every_variant_validates(name, preset):
    assert name in builtin_studies()
    s = load_study(name, preset=preset)
    assert s.preset == preset and s.preset_summary
    assert len({v.name for v in s.variants}) == len(s.variants)


def test_builtin_study_sizes():
    # the blog's nine plans at the paper's scale, and its "~190 heads" constant run
    paper = load_study("progression", preset="paper")
    assert len(paper.variants) == 9 and paper.config.report["at_heads"] == 180
    quick = load_study("progression", preset="quick")
    assert [v.name for v in quick.variants] == ["constant-h90", "ascending-h90", "descending-h90"]
    assert len(load_study("progression", preset="tiny").variants) == 9
    dfh = load_study("depth-for-heads", preset="tiny")
    names = [v.name for v in dfh.variants]
    assert {"l12-h12-hd8", "l4-h16-hd8", "l4-h16-dfixed"} <= set(names)
    fixed_d = next(v for v in dfh.variants if v.name == "l4-h16-dfixed").config["model"]
    assert fixed_d["heads"] == [16] * 4 and "head_dim" not in fixed_d
    rank = load_study("rank", preset="tiny")
    full = next(v for v in rank.variants if v.name == "l1-r16-h1-n8").config
    assert full["model"]["head_dim"] == 16 and full["model"]["heads"] == [1] and full["task"]["n_points"] == 8


@pytest.mark.parametrize("axis,needle", [
    ({"name": "a", "values": [1]}, "scalar values need a `key`"),
    ({"name": "a", "key": "model.n_layers", "label": "{val}", "values": [1]}, "must use only {value}"),
    ({"name": "a", "key": "model.n_layers", "label": "x", "values": [1, 2]}, r"labels \['x'\] repeat"),
    ({"name": "a b", "key": "model.n_layers", "values": [1]}, "axis name 'a b' must start"),
])
def test_bad_axes_are_one_line_errors(axis, needle):
    with pytest.raises(HeadwiseError, match=needle):
        resolve_study(study(axes=[axis]), "test")


def test_variants_carry_the_plan_they_resolve_to():
    study = load_study("progression", preset="quick")
    plans = {v.name: v.plan for v in study.variants}
    assert plans["ascending-h90"].heads == (6, 12, 24, 48) and plans["ascending-h90"].scheme is Scheme.ASCENDING
    assert plans["constant-h90"].total == 96 and not plans["constant-h90"].exact


def test_dry_run_shows_each_variants_heads_per_layer(capsys):
    assert main(["study", "progression", "--preset", "quick", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "heads 6,12,24,48 (total 90, ascending)" in out and "heads 48,24,12,6 (total 90, descending)" in out
    assert "heads 24,24,24,24 (total 96, constant)" in out and "nearest is 96" in out


def test_parsing_a_study_does_not_load_matplotlib():
    # the [report] table is checked against the layouts, whose plotting loads only when drawn
    import subprocess
    import sys

    code = ("import sys; from headwise.study import load_study; load_study('vit', preset='tiny'); "
            "assert 'matplotlib' not in sys.modules, 'matplotlib was imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
