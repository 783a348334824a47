"""The ViT search (``vit-depth-for-heads``, Leaner Transformers' vision question): it is built in
under its own name, every preset resolves with top-1 accuracy maximized under the baseline's
parameters (an objective the image task does not report is refused), its space holds exactly the
plans under that cap (brute force, parameters counted on each plan's own spec and, for a few
plans, on the built model), its report ranks by the highest accuracy, and a small search on
hand-made IDX images ends with its confirmation in the vision layout."""

from __future__ import annotations

import dataclasses
import itertools
import random
import re
import struct
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
import tomli_w

from headwise.cli import main
from headwise.config import read_toml
from headwise.errors import HeadwiseError
from headwise.families import family_files
from headwise.params import count_params
from headwise.plans import Plan, Scheme
from headwise.search import load_search
from headwise.search.confirm import Top, confirm_raw, confirm_study
from headwise.search.definition import SEARCH_PREFIX, builtin_searches, resolve_search
from headwise.search.report import write_search_report
from headwise.search.trials import read_record
from headwise.study.definition import builtin_studies
from headwise.train.config import resolve_run_model
from helpers import one_thread, read_csv  # noqa: F401  (one_thread: one torch thread)
from test_search_report import trial, write_search

NAME = "vit-depth-for-heads"
#: the vit study's CPU baselines: (layers, heads, MLP ratio) of each preset's named baseline
BASELINES = {"quick": ("l4-h4-m4", 4, 4, 4.0), "tiny": ("l6-h4-m4", 6, 4, 4.0), "verdict": ("l6-h4-m4", 6, 4, 4.0)}
D_MODEL, HEAD_DIM = 64, 16


def built_params(config: dict) -> int:
    """The parameters of the model a run config builds, counted on the model itself."""
    from headwise.model import Transformer

    spec, _ = resolve_run_model(config)
    return sum(p.numel() for p in Transformer(spec).parameters())


def shape_config(search, layers: int, heads: list[int], mlp: list[float]) -> dict:
    """The search's base run config with these layers set directly (not through the space)."""
    return search.run_config({"model.n_layers": layers, "model.heads": heads, "model.head_dim": [HEAD_DIM] * layers,
                              "model.mlp_hidden": [int(r * D_MODEL) for r in mlp]})


# --------------------------------------------------------------------------- the file


def test_it_is_built_in_under_its_own_name_beside_the_lm_search():
    found = builtin_searches()
    assert found[NAME].name == f"{SEARCH_PREFIX}{NAME}.toml" and "vision" in str(found[NAME])
    assert "lm" in str(found["depth-for-heads"])  # the LM's keeps its name
    assert NAME not in builtin_studies() and "vit" in builtin_studies()
    # one name per built-in search: two family folders' files of one name would shadow each other
    names = [p.name for p in family_files(".toml") if p.name.startswith(SEARCH_PREFIX)]
    assert len(names) == len(set(names)), names
    for preset in BASELINES:  # the search's own name is its built-in name (its default folder is named by it)
        assert load_search(NAME, preset=preset).name == NAME


@pytest.mark.parametrize("preset", sorted(BASELINES))
def test_each_preset_maximizes_accuracy_under_its_baseline_s_built_parameters(preset):
    search = load_search(NAME, preset=preset)
    assert [(o.metric, o.direction) for o in search.config.objectives] == [("accuracy", "maximize")]
    assert search.config.base["task"]["kind"] == "images"
    name, layers, heads, ratio = BASELINES[preset]
    cap = built_params(shape_config(search, layers, [heads] * layers, [ratio] * layers))
    assert search.config.budget.metric == "params" and search.config.budget.max == cap  # the cap is the baseline's
    baseline = next(n for n in search.named if n.name == name)
    assert baseline.in_space and search.budget_of(baseline.plan)["params"] == cap
    assert search.space.count() > 0 and search.space.feasible_depths
    twice = dataclasses.replace(baseline.plan.layers[0], heads=2 * heads, kv_heads=2 * heads)
    with pytest.raises(HeadwiseError, match="the space and the budget leave"):  # twice the heads: over the cap
        search.space.encode(Plan(Scheme.EXPLICIT, (twice,) * layers))


@pytest.mark.parametrize("metric, why", [("top5_accuracy", "report only the loss, accuracy"),
                                          ("acuracy", "did you mean 'accuracy'?")])
def test_an_objective_the_image_task_does_not_report_is_refused(metric, why):
    with resources.as_file(builtin_searches()[NAME]) as path:
        raw = read_toml(path)
    raw["objectives"] = [{"metric": metric, "direction": "maximize"}]  # top-5 only above 10 classes
    with pytest.raises(HeadwiseError, match=re.escape(why)):
        resolve_search(raw, "test", preset="tiny")


def test_the_verdict_confirms_against_the_baseline_on_fresh_seeds_at_tuned_rates_in_the_vision_layout():
    search = load_search(NAME, preset="verdict")
    confirm = search.config.confirm
    assert confirm.enabled and confirm.baseline == "l6-h4-m4" and confirm.seeds == 5
    top = [Top("best-1", next(search.space.plans(limit=1)))]
    raw = confirm_raw(search, top)
    assert raw["report"]["kind"] == "vision" and raw["nuisance"]["values"] == {"optim.lr": [5e-4, 1e-3, 2e-3]}
    (claim,) = confirm_study(search, top).config.claims
    assert (claim.metric, claim.better, claim.percent) == ("accuracy", "higher", True)  # in points, higher wins
    assert claim.pairs == [("best-1", "l6-h4-m4")]
    assert not load_search(NAME, preset="quick").config.confirm.enabled


# --------------------------------------------------------------------------- the space against the cap


def test_the_quick_space_holds_exactly_the_plans_under_the_cap():
    """Brute force: every shape of the quick space, its parameters counted on its own spec."""
    search = load_search(NAME, preset="quick")
    cap, space = search.config.budget.max, search.config.space
    options = list(itertools.product(space.heads, space.mlp_ratio))
    feasible = set()
    for depth in range(space.depth[0], space.depth[1] + 1):
        for layers in itertools.product(options, repeat=depth):
            heads, mlp = [h for h, _ in layers], [r for _, r in layers]
            spec, _ = resolve_run_model(shape_config(search, depth, heads, mlp))
            if count_params(spec) <= cap:
                feasible.add((tuple(heads), tuple(int(r * D_MODEL) for r in mlp)))
    plans = list(search.space.plans())
    assert {(tuple(p.heads), tuple(p.mlp_hidden)) for p in plans} == feasible and len(plans) == len(feasible)
    # the model each trial builds has the parameters its spec says, under the cap: the largest plan and a mixed one
    largest = max(plans, key=search.space.predicted)
    mixed = next(p for p in plans if len(set(p.heads)) > 1 and len(set(p.mlp_hidden)) > 1)
    for plan in (largest, mixed):
        assert built_params(search.trial_config(plan)) == search.budget_of(plan)["params"] <= cap
    assert search.budget_of(largest)["params"] == cap  # the cap is reached, not just approached


def test_every_plan_the_tiny_search_draws_keeps_the_cap():
    search = load_search(NAME, preset="tiny")
    rng, cap = random.Random(0), search.config.budget.max
    plans = [search.space.decode(lambda name: rng.uniform(search.space.choices(name)[0], search.space.choices(name)[-1]))
             for _ in range(300)]
    assert {p.n_layers for p in plans} == set(range(2, 9))  # every depth is drawn
    assert all(search.budget_of(p)["params"] <= cap for p in plans)
    deepest = max(plans, key=lambda p: (p.n_layers, search.budget_of(p)["params"]))
    assert built_params(search.trial_config(deepest)) == search.budget_of(deepest)["params"] <= cap


# --------------------------------------------------------------------------- the report


def best_rows(report: str) -> list[list[str]]:
    """The rows of the report's best-plans table, cells stripped."""
    section = report.split("## Best plans", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines() if line.startswith("| ")]
    return rows[1:]  # after the header


def test_a_search_that_maximizes_accuracy_ranks_and_tracks_the_highest(tmp_path):
    accuracy = [0.71, 0.84, 0.62, 0.90, 0.80]
    heads = [[4] * 6, [4, 4], [8, 2], [2, 8], [1, 1]]  # distinct plans, the first the named baseline
    trials = [trial(n, h, named="l6-h4-m4" if n == 0 else None, values={"accuracy": a})
              for n, (h, a) in enumerate(zip(heads, accuracy))]
    out = write_search(tmp_path, trials, objectives=(("accuracy", "maximize"),))
    text = write_search_report(out).read_text()
    rows = best_rows(text)
    assert [float(r[-2]) for r in rows] == sorted(accuracy, reverse=True)  # highest first
    assert [int(r[1]) for r in rows] == [3, 1, 4, 0, 2]
    assert "Objectives: accuracy (maximize)" in text and "by accuracy (maximize)" in text
    history = read_csv(out / "report" / "history.csv")
    assert [float(r["best_so_far"]) for r in history] == [0.71, 0.84, 0.84, 0.90, 0.90]
    assert not re.search(r"\bloss\b|lower is better", text)


def write_idx(path: Path, array: np.ndarray) -> None:
    """An uncompressed IDX file of uint8 ``array`` (Fashion-MNIST's format, ungzipped)."""
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def fashion_like(folder: Path) -> Path:
    """28 x 28 grey images of 10 classes in Fashion-MNIST's four IDX files: class k's noise is
    brightened by 20 k, so a few steps already learn something."""
    rng = np.random.default_rng(0)
    folder.mkdir()
    for prefix, n in (("train", 320), ("t10k", 100)):
        labels = np.arange(n) % 10
        images = rng.integers(0, 60, size=(n, 28, 28)) + 20 * labels[:, None, None]
        write_idx(folder / f"{prefix}-images-idx3-ubyte", images)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte", labels)
    return folder


def test_a_small_search_on_images_ranks_by_accuracy_and_confirms_in_the_vision_layout(tmp_path):
    """The quick preset on hand-made images, 2 sampled trials of 4 steps, then (unlike quick) its
    confirmation on 2 paired seeds, against a named plan deeper than the space (so no trial: the
    best is a searched plan, and the claim that it wins is made)."""
    images, out = fashion_like(tmp_path / "images"), tmp_path / "out"
    with resources.as_file(builtin_searches()[NAME]) as path:
        raw = read_toml(path)
    quick = raw["presets"]["quick"]
    quick["named"] = [{"name": "l5-h1-m2", "heads": [1] * 5, "head_dim": HEAD_DIM, "mlp_ratio": 2.0}]
    report = {"kind": "vision", "baseline": "l5-h1-m2", "table": ["l5-h1-m2", "best-1"]}
    quick["confirm"] = {"top_k": 1, "seeds": 2, "baseline": "l5-h1-m2", "report": report}
    src = tmp_path / "search.toml"
    src.write_text(tomli_w.dumps(raw))
    sets = {"task.source": str(images), "task.cache_dir": str(tmp_path / "cache"), "task.eval_examples": 50,
            "train.steps": 4, "train.micro_batch": 16, "train.log_every": 2, "eval.every": 2, "checkpoint.every": 0}
    args = ["search", str(src), "--preset", "quick", "--out", str(out), "--trials", "2", "--jobs", "2"]
    assert main(args + [x for k, v in sets.items() for x in ("--set", f"{k}={v}")]) == 0
    trials = read_record(out)["trials"]
    assert [t["state"] for t in trials] == ["complete", "complete"] and not any(t["named"] for t in trials)
    assert all(0.0 <= t["values"]["accuracy"] <= 1.0 and t["budget"]["params"] <= 205066 for t in trials)
    text = (out / "report" / "report.md").read_text()
    rows = best_rows(text)
    assert float(rows[0][-2]) == pytest.approx(max(t["values"]["accuracy"] for t in trials), abs=1e-4)
    assert [float(r[-2]) for r in rows] == sorted((float(r[-2]) for r in rows), reverse=True)
    assert "Objectives: accuracy (maximize)" in text
    # the confirmation is a study in the vision layout; its claim on accuracy is in points, higher winning
    confirmed = (out / "confirm" / "report" / "report.md").read_text()
    assert "## Table 4: depth for heads" in confirmed and "| `best-1` |" in confirmed
    lead = text.split("\n\n")[1]
    assert re.match(r"\*\*Confirmation: `best-1` vs `l5-h1-m2`: gain -?[\d.]+ points .* on 2 paired seeds", lead)
