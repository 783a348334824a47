"""``headwise heads prune``: the pruned model computes what the original computes with those heads'
outputs gated off (and with their output-projection columns zeroed, which needs no gate), its
parameters are the closed form's, hand-made scores give the allocations worked out by hand for
each scope and budget, and the command on a tiny trained run writes a run that generates and
trains (one line, exit 2, nothing written on bad input)."""

from __future__ import annotations

import copy
import hashlib
import json
import re
import shlex
import shutil
from pathlib import Path

import pytest
import torch

from conftest import REPO, shared_data_dir
from headwise.analysis.head_importance import (HeadScores, LayerScores, gradient_scores, head_gates, head_shapes,
                                               validation_sample)
from headwise.analysis.head_pruning import plan_pruning, prune_model, pruned_spec
from headwise.cli import main
from headwise.model import Transformer, save_pretrained
from headwise.params import count_params, plan_budget
from headwise.spec import ModelSpec
from headwise.train.config import resolve_run_model
from headwise.train.generate import load_run_model, run_config
from helpers import LM_TINY, one_line_error, one_thread, train_lm_tiny  # noqa: F401  (one torch thread)

LLAMA = dict(norm="rmsnorm_pre", positions="rope", activation="swiglu", score_scale="inv_sqrt", qkv_bias=False,
             out_bias=False, mlp_bias=False, qk_norm="rmsnorm")
#: heads 2, 4, 4 (widths 16, 8, 8) and the heads each case removes: in the grouped layers (Llama's
#: and Laguna's first and last: key/value heads 1 and 2) one query head of every group
SPECS = {
    "gpt-neo": (dict(), ((1,), (0, 2), (3,))),
    "llama-gqa": (dict(**LLAMA, kv_heads=[1, 4, 2]), ((0,), (1, 3), (1, 2))),
    "laguna": (dict(**LLAMA, kv_heads=[1, 4, 2], output_gate="softplus_head"), ((0,), (1, 3), (1, 2))),
    "biased-element-gate": (dict(qkv_bias=True, output_gate="softplus_element"), ((0,), (3,), (0, 1, 2))),
}
#: Laguna's gate is computed in float32 (as transformers' Laguna does): a gate projection with fewer
#: rows rounds its float64 logits differently, and float32 shows it
TOL = {"laguna": 1e-6}


def _model(name: str) -> Transformer:
    spec = ModelSpec(vocab_size=40, d_model=32, n_layers=3, heads=[2, 4, 4], max_seq_len=16, **SPECS[name][0])
    torch.manual_seed(0)
    model = Transformer(spec).double().eval()
    with torch.no_grad():  # weights far from the initialisation's, so that every head matters
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * (1.0 if p.dim() == 1 else 0.3))
    return model


def _ids() -> torch.Tensor:
    return torch.randint(0, 40, (3, 12), generator=torch.Generator().manual_seed(1))


def _gates(model: Transformer, removed) -> list[torch.Tensor]:
    gates = []
    for shape, gone in zip(head_shapes(model), removed):
        gate = torch.ones(shape.heads, dtype=next(model.parameters()).dtype)
        gate[list(gone)] = 0
        gates.append(gate)
    return gates


def _zeroed(model: Transformer, removed) -> Transformer:
    """A copy whose output projection reads nothing of the ``removed`` heads."""
    edited = copy.deepcopy(model)
    with torch.no_grad():
        for block, shape, gone in zip(edited.blocks, head_shapes(model), removed):
            for h in gone:
                block.attn.out.weight[:, h * shape.head_dim:(h + 1) * shape.head_dim] = 0
    return edited


def _removed_params(spec: ModelSpec, removed) -> int:
    """What removing heads saves, by hand: per query head its q rows and output columns (2 d hd),
    its q bias (hd) and its output gate (d, or d hd per channel); per key/value head that goes
    (a head of a layer without groups) its k and v rows (2 d hd) and biases (2 hd)."""
    d, total = spec.d_model, 0
    for shape, gone in zip(spec.layers(), removed):
        hd, n = shape.head_dim, len(gone)
        total += n * (2 * d * hd + (hd if spec.qkv_bias else 0))
        if spec.output_gate is not None:
            total += n * (d if spec.output_gate == "softplus_head" else d * hd)
        if shape.kv_heads == shape.heads:
            total += n * (2 * d * hd + (2 * hd if spec.qkv_bias else 0))
    return total


@pytest.mark.parametrize("name", SPECS)
def test_the_pruned_model_is_the_original_with_those_heads_masked(name):
    model, removed, ids = _model(name), SPECS[name][1], _ids()
    pruned = prune_model(model, removed)
    with torch.no_grad():
        with head_gates(model, _gates(model, removed)):
            gated = model(ids)
        zeroed, smaller = _zeroed(model, removed)(ids), pruned(ids)
    tol = TOL.get(name, 1e-12)
    torch.testing.assert_close(smaller, gated, rtol=tol, atol=tol * gated.abs().max().item())
    torch.testing.assert_close(smaller, zeroed, rtol=tol, atol=tol * zeroed.abs().max().item())
    assert (smaller - model(ids).detach()).abs().max() > 1e-2  # the heads mattered: masking changed the logits
    # the heads that stay, the key/value heads of the grouped layers kept, the head widths kept
    spec = pruned.spec
    assert spec.heads == [2 - len(removed[0]), 4 - len(removed[1]), 4 - len(removed[2])]
    assert spec.head_dims == [16, 8, 8]
    assert spec.kv_heads_per_layer == ([1, 2, 2] if name in ("llama-gqa", "laguna") else spec.heads)
    n = sum(p.numel() for p in pruned.parameters())
    assert n == count_params(spec) == count_params(model.spec) - _removed_params(model.spec, removed)
    assert pruned_spec(model.spec, removed) == spec and not pruned.training and next(pruned.parameters()).dtype == \
        torch.float64


# ------------------------------------------------------------------- allocations by hand


def _scores(*layers: list[float]) -> HeadScores:
    return HeadScores("gradient", tuple(LayerScores(tuple(layer)) for layer in layers))


def _measure(metric: str):
    return lambda spec: plan_budget(spec, 16)[metric]


MHA = ModelSpec(vocab_size=40, d_model=32, n_layers=3, heads=[4, 4, 2], max_seq_len=16)
MHA_SCORES = _scores([0.1, 5, 6, 7], [0.2, 0.3, 0.4, 8], [9, 0.05])
#: layer 0 groups its 4 query heads over 2 key/value heads (heads 0, 1 and 2, 3); layer 1 does not
GQA = ModelSpec(vocab_size=40, d_model=32, n_layers=2, heads=[4, 4], kv_heads=[2, 4], max_seq_len=16)
GQA_SCORES = _scores([1, 0.1, 0.2, 3], [0.25, 0.12, 4, 5])


@pytest.mark.parametrize("spec, scores, scope, metric, limit, want", [
    # globally the four lowest heads anywhere (0.05, 0.1, 0.2, 0.3); layer 2 keeps its last head
    (MHA, MHA_SCORES, "global", "total_heads", 6, ((0,), (0, 1), (1,))),
    # per layer: one from each is 7 heads, two from each (layer 2 keeping one) 5
    (MHA, MHA_SCORES, "per-layer", "total_heads", 6, ((0, 1), (0, 1), (1,))),
    # one parameter under: the single lowest head goes, and pruning stops
    (MHA, MHA_SCORES, "global", "params", count_params(MHA) - 1, ((), (), (1,))),
    # layer 0's unit is one query head of each group (its lowest: 0.1 and 0.2, whose mean 0.15, not
    # their sum, ranks it), after layer 1's 0.12 and before its 0.25
    (GQA, GQA_SCORES, "global", "total_heads", 6, ((1, 2), (1,))),
    (GQA, GQA_SCORES, "per-layer", "total_heads", 5, ((1, 2), (1,))),
    # a grouped layer keeps its key/value heads: under a KV budget its unit is passed over, and
    # layer 1 gives two heads (its 0.12 and 0.25): 384 - 2 x 64 bytes
    (GQA, GQA_SCORES, "global", "kv_bytes_per_token", 256, ((), (0, 1))),
])
def test_global_and_per_layer_allocations_on_hand_made_scores(spec, scores, scope, metric, limit, want):
    removed = plan_pruning(spec, scores, scope, _measure(metric), limit, f"{metric} <= {limit}")
    assert removed == want
    assert _measure(metric)(pruned_spec(spec, removed)) <= limit


def test_budgets_no_pruning_can_meet_and_bad_scores_are_refused():
    heads = _measure("total_heads")
    assert "give a budget of at least 3" in one_line_error(plan_pruning, MHA, MHA_SCORES, "global", heads, 2, "h")
    assert "give a budget of at least 3" in one_line_error(plan_pruning, MHA, MHA_SCORES, "per-layer", heads, 2, "h")
    # the grouped layer's key/value heads stay: 128 + 1 x 64 bytes at least
    kv = _measure("kv_bytes_per_token")
    assert "at least 192" in one_line_error(plan_pruning, GQA, GQA_SCORES, "global", kv, 191, "kv")
    assert "nothing to prune" in one_line_error(plan_pruning, MHA, MHA_SCORES, "global", heads, 10, "h")
    assert "unknown scope 'sideways'" in one_line_error(plan_pruning, MHA, MHA_SCORES, "sideways", heads, 6, "h")
    assert "score this model" in one_line_error(plan_pruning, GQA, MHA_SCORES, "global", heads, 6, "h")


# --------------------------------------------------------------------------------- the command

@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    """A 2-step lm-tiny run: GPT-Neo-style, heads 4, 2."""
    return train_lm_tiny(tmp_path_factory.mktemp("prune"), 2)


def _scores_file(path: Path, heads: list[list[float]], model: Path) -> Path:
    """Ablation scores ``heads`` as headwise heads score records them for the weights in ``model``."""
    layers = [{"layer": i, "heads": h, "groups": None} for i, h in enumerate(heads)]
    sha = hashlib.sha256((model / "model.safetensors").read_bytes()).hexdigest()
    path.write_text(json.dumps({"model": str(model), "weights_sha256": sha,
                                "methods": {"ablation": {"method": "ablation", "layers": layers}}}))
    return path


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("scope, removed, heads", [("global", [[0, 1], []], [2, 2]), ("per-layer", [[1], [0]], [3, 1])])
def test_the_command_writes_a_smaller_run_that_generates_and_trains(lm_run, tmp_path, capsys, monkeypatch, scope,
                                                                      removed, heads):
    monkeypatch.setenv("HEADWISE_DATA", str(shared_data_dir()))
    scores = _scores_file(tmp_path / "scores.json", [[0.3, 0.1, 0.9, 0.8], [0.6, 0.7]], lm_run / "model")
    new = tmp_path / "pruned"
    assert main(["heads", "prune", str(lm_run), "--to", "heads:4", "--out", str(new), "--method", "ablation",
                 "--scope", scope, "--scores", str(scores)]) == 0
    assert "heads [4, 2] -> heads " + str(heads) in capsys.readouterr().out
    record = json.loads((new / "pruned.json").read_text())
    assert record["removed"] == removed and record["budget"] == "total_heads <= 4" and record["scope"] == scope
    assert [layer["heads"] for layer in record["after"]["layers"]] == heads
    # the saved model: the original's with those heads gated off, counted as a search counts it
    original, _ = load_run_model(lm_run)
    model, _ = load_run_model(new)
    cfg = run_config(new)
    assert model.spec.heads == heads and resolve_run_model(cfg.to_dict())[0] == model.spec
    assert {k: record["after"][k] for k in plan_budget(model.spec, 32)} == plan_budget(model.spec, 32)
    assert record["after"]["params"] == sum(p.numel() for p in model.parameters())
    assert record["before"]["params"] == count_params(original.spec) > record["after"]["params"]
    ids = torch.randint(0, original.spec.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), head_gates(original, _gates(original, removed)):
        gated = original(ids)
    with torch.no_grad():
        torch.testing.assert_close(model(ids), gated, rtol=1e-5, atol=1e-5)
    if scope == "per-layer":
        return  # the run's use, once
    assert main(["generate", str(new), "--prompt", "Once upon a time", "--max-new-tokens", "4", "--seed", "0"]) == 0
    healed = tmp_path / "healed"
    assert main(["train", str(new / "config.toml"), "--out", str(healed), "--set", f"train.init_from={new}",
                 "--set", "train.steps=1", *LM_TINY]) == 0
    assert load_run_model(healed)[0].spec == model.spec


def test_scoring_by_gradient_prunes_the_lowest_heads(lm_run, tmp_path, monkeypatch):
    monkeypatch.setenv("HEADWISE_DATA", str(shared_data_dir()))
    new = tmp_path / "pruned"
    assert main(["heads", "prune", str(lm_run), "--to", "heads:5", "--out", str(new), "--tokens", "64"]) == 0
    record = json.loads((new / "pruned.json").read_text())
    model, _ = load_run_model(lm_run)
    inputs, targets, loss = validation_sample(lm_run, run_config(lm_run), 64)
    want = gradient_scores(model.eval(), inputs, targets, loss)
    assert record["method"] == "gradient" and record["scores"] == {"tokens": 64}
    got = [layer["heads"] for layer in record["head_scores"]["layers"]]
    for layer, mine in zip(want.layers, got):
        assert mine == pytest.approx(layer.heads, rel=1e-6)
    lowest = min((s, i, h) for i, layer in enumerate(want.layers) for h, s in enumerate(layer.heads))
    assert record["removed"] == [[lowest[2]] if i == lowest[1] else [] for i in range(2)]


def test_bad_input_is_one_line_exit_2_and_nothing_written(lm_run, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HEADWISE_DATA", str(shared_data_dir()))
    not_lm = tmp_path / "nearest"
    not_lm.mkdir()
    shutil.copy(REPO / "configs" / "nearest-tiny.toml", not_lm / "config.toml")
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    scores = _scores_file(tmp_path / "scores.json", [[0.3, 0.1, 0.9, 0.8], [0.6, 0.7]], lm_run / "model")
    wrong = _scores_file(tmp_path / "wrong.json", [[0.3, 0.1], [0.6, 0.7]], lm_run / "model")
    before = _listing(lm_run), _listing(tmp_path)
    new = ["--out", str(tmp_path / "new")]
    cases = [
        ([str(lm_run), "--to", "heads:1", *new], "no pruning meets the budget total_heads <= 1"),
        ([str(lm_run), "--to", "heads:6", *new], "nothing to prune"),
        ([str(lm_run), "--to", "heads:4", "--method", "magnitude", *new], "unknown method 'magnitude'"),
        ([str(lm_run), "--to", "heads:4", "--method", "gradient,activation", *new], "name one"),
        ([str(lm_run), "--to", "watts:4", *new], "unknown budget 'watts'"),
        ([str(lm_run), "--to", "params:1.5x", *new], "not a whole number"),
        ([str(lm_run), "--to", "params:0.5", *new], "not a whole number"),
        ([str(not_lm), "--to", "heads:1", *new], "'nearest' run"),
        ([str(tmp_path / "missing"), "--to", "heads:4", *new], "is not a headwise run"),
        ([str(lm_run), "--to", "heads:4", "--out", str(full)], "not empty"),
        ([str(lm_run), "--to", "heads:4", "--scores", str(tmp_path / "none.json"), *new], "does not exist"),
        ([str(lm_run), "--to", "heads:4", "--scores", str(scores), *new], "no 'gradient' scores"),
        ([str(lm_run), "--to", "heads:4", "--method", "ablation", "--scores", str(wrong), *new], "score this run"),
    ]
    for argv, says in cases:
        assert main(["heads", "prune", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err, (argv, err)
    with pytest.raises(SystemExit) as exit_:
        main(["heads", "prune", str(lm_run), "--to", "heads:4", "--scope", "sideways", *new])
    assert exit_.value.code == 2 and capsys.readouterr().err.count("\n") == 1
    assert (_listing(lm_run), _listing(tmp_path)) == before


def test_scores_of_other_weights_or_not_naming_them_are_refused(lm_run, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HEADWISE_DATA", str(shared_data_dir()))
    other = tmp_path / "other"  # another run: lm_run's model with one weight changed
    shutil.copytree(lm_run, other)
    model, _ = load_run_model(lm_run)
    with torch.no_grad():
        model.blocks[0].attn.out.weight[0, 0] += 1
    save_pretrained(model, other / "model")
    assert main(["heads", "score", str(other), "--method", "ablation", "--tokens", "40"]) == 0
    foreign = other / "heads" / "head_scores.json"
    old = tmp_path / "old.json"  # as headwise wrote it before the record named the weights
    old.write_text(json.dumps({k: v for k, v in json.loads(foreign.read_text()).items() if k != "weights_sha256"}))
    capsys.readouterr()
    before = _listing(tmp_path)
    prune = ["heads", "prune", str(lm_run), "--to", "heads:5", "--method", "ablation", "--out", str(tmp_path / "new")]
    for scores, says in ((foreign, f"scored other weights ({other / 'model'}, "), (old, "an older headwise")):
        assert main([*prune, "--scores", str(scores)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err and str(lm_run / "model") in err, err
    assert _listing(tmp_path) == before
    # the command the line names scores these weights, and their scores prune them
    rescore = shlex.split(re.search(r"`(headwise heads score [^`]+)`", err).group(1))
    assert rescore[:4] == ["headwise", "heads", "score", str(lm_run)] and "ablation" in rescore
    assert main([*rescore[1:], "--tokens", "40", "--out", str(tmp_path / "mine")]) == 0
    assert main([*prune, "--scores", str(tmp_path / "mine" / "head_scores.json")]) == 0


def test_a_damaged_final_model_prunes_from_the_checkpoint_its_line_names(lm_run, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HEADWISE_DATA", str(shared_data_dir()))
    run = tmp_path / "run"
    shutil.copytree(lm_run, run)
    with open(run / "model" / "model.safetensors", "r+b") as f:
        f.truncate(20000)
    # the last checkpoint holds the final weights: the intact run's scores are its scores
    scores = _scores_file(tmp_path / "scores.json", [[0.3, 0.1, 0.9, 0.8], [0.6, 0.7]], lm_run / "model")
    prune = ["--to", "heads:4", "--method", "ablation", "--scores", str(scores)]
    assert main(["heads", "prune", str(run), *prune, "--out", str(tmp_path / "new")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and not (tmp_path / "new").exists()
    advice = shlex.split(re.search(r"or (--checkpoint \S+) uses that checkpoint", err).group(1))
    assert main(["heads", "prune", str(run), *prune, "--out", str(tmp_path / "new"), *advice]) == 0
    assert main(["heads", "prune", str(lm_run), *prune, "--out", str(tmp_path / "intact")]) == 0
    record = json.loads((tmp_path / "new" / "pruned.json").read_text())
    assert record["model"] == str(run / "checkpoints" / "step_00000002") == advice[1]
    weights = [(tmp_path / name / "model" / "model.safetensors").read_bytes() for name in ("new", "intact")]
    assert weights[0] == weights[1]


def _kept(heads: int, head_dim: int, removed: list[int]) -> list[int]:
    return [h * head_dim + c for h in range(heads) if h not in removed for c in range(head_dim)]


def test_a_bfloat16_run_prunes_to_bfloat16_weights_equal_to_the_kept_ones(lm_run, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    monkeypatch.setenv("HEADWISE_DATA", str(shared_data_dir()))
    source = tmp_path / "bf16"  # as headwise convert writes a bfloat16 checkpoint's run
    shutil.copytree(lm_run, source)
    save_pretrained(load_run_model(lm_run)[0].to(torch.bfloat16), source / "model")
    scores = _scores_file(tmp_path / "scores.json", [[0.3, 0.1, 0.9, 0.8], [0.6, 0.7]], source / "model")
    new = tmp_path / "pruned"
    assert main(["heads", "prune", str(source), "--to", "heads:4", "--scope", "per-layer", "--method", "ablation",
                 "--scores", str(scores), "--out", str(new)]) == 0
    before = load_file(source / "model" / "model.safetensors")
    for folder in (new / "model", new / "checkpoints" / "step_00000000"):
        after = load_file(folder / "model.safetensors")
        assert after.keys() == before.keys() and {t.dtype for t in after.values()} == {torch.bfloat16}
        # lm-tiny: layer 0 has 4 heads of 16, layer 1 2 of 32 (width 64); per layer: L0.H1 and L1.H0 go
        for i, (heads, dim, gone) in enumerate(((4, 16, [1]), (2, 32, [0]))):
            kept = _kept(heads, dim, gone)
            assert torch.equal(after[f"blocks.{i}.attn.qkv.weight"],
                               before[f"blocks.{i}.attn.qkv.weight"][[p * 64 + k for p in range(3) for k in kept]])
            assert torch.equal(after[f"blocks.{i}.attn.out.weight"], before[f"blocks.{i}.attn.out.weight"][:, kept])
        for name, value in after.items():
            if not name.endswith(("qkv.weight", "out.weight")):
                assert torch.equal(value, before[name]), name


def test_budget_amounts():
    from headwise.budget import parse_budget

    assert (parse_budget("params:1.2M").metric, parse_budget("params:1.2M").max) == ("params", 1_200_000)
    assert (parse_budget("250000").metric, parse_budget("250000").max) == ("params", 250_000)
    assert (parse_budget("kv-bytes:384").metric, parse_budget("kv-bytes:384").max) == ("kv_bytes_per_token", 384)
    assert parse_budget("heads:24").describe() == "total_heads <= 24"
    assert parse_budget("flops:2.5k").max == 2500
