"""``headwise heads score``: each head's score against an independent computation (a finite
difference of the loss in the head's output scale, the loss of a copy with the head's weights
removed, the head's output recomputed by the reference model), gates at 1 change nothing, and the
command on a tiny trained run (its files, and one line, exit 2, nothing written on bad input)."""

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
import torch.nn.functional as F

from conftest import REPO
from headwise.analysis.head_importance import (activation_scores, ablation_scores, gradient_scores, groups_of,
                                               head_gates, head_shapes, score_heads)
from headwise.cli import main
from headwise.model import Transformer
from headwise.spec import ModelSpec
from helpers import one_line_error, one_thread, train_lm_tiny  # noqa: F401  (one torch thread)
from reference_model import attention as reference_attention

LLAMA = dict(norm="rmsnorm_pre", positions="rope", activation="swiglu", score_scale="inv_sqrt", qkv_bias=False,
             out_bias=False, mlp_bias=False, qk_norm="rmsnorm")
#: per-layer heads 2, 4, 4 (widths 16, 8, 8); the last layer groups its query heads in pairs, and the
#: first of the two grouped ones its two heads in one
SPECS = {
    "gpt-neo": dict(kv_heads=[2, 4, 2]),
    "llama": dict(**LLAMA, kv_heads=[1, 4, 2]),
    "laguna": dict(**LLAMA, kv_heads=[1, 4, 2], output_gate="softplus_head"),
}
#: (finite-difference step, relative tolerance) by spec: Laguna's output gate is computed in float32
#: (as transformers' Laguna does), so its loss is float32-noisy: a longer step, a looser match
STEP = {"laguna": (1e-3, 2e-3)}
#: the relative tolerance of a head's output norm against the reference model's, which computes in
#: float64 throughout: headwise's rotary angles are float32 (as Llama's), Laguna's gate too
NORM_TOL = {"llama": 1e-7, "laguna": 1e-6}


def _model(name: str) -> Transformer:
    spec = ModelSpec(vocab_size=40, d_model=32, n_layers=3, heads=[2, 4, 4], max_seq_len=16, **SPECS[name])
    torch.manual_seed(0)
    model = Transformer(spec).double().eval()
    with torch.no_grad():  # weights far from the initialisation's, so that heads differ clearly
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * (1.0 if p.dim() == 1 else 0.3))
    return model


def _data(n: int = 3, t: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 40, (n, t + 1), generator=torch.Generator().manual_seed(1))
    return ids[:, :-1], ids[:, 1:]


def _loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _scaled(model: Transformer, layer: int, heads: list[int], scale: float) -> Transformer:
    """A copy whose output projection's columns for ``heads`` of ``layer`` are multiplied by ``scale``."""
    edited = copy.deepcopy(model)
    d = head_shapes(model)[layer].head_dim
    with torch.no_grad():
        weight = edited.blocks[layer].attn.out.weight
        for h in heads:
            weight[:, h * d:(h + 1) * d] *= scale
    return edited


def _losses(model: Transformer, inputs, targets) -> torch.Tensor:
    """Each sequence's loss, [N]."""
    with torch.no_grad():
        logits = model(inputs)
    return torch.stack([_loss(logits[r:r + 1], targets[r:r + 1]) for r in range(inputs.shape[0])])


@pytest.mark.parametrize("name", SPECS)
def test_gradient_is_the_finite_difference_of_each_sequences_loss(name):
    model, (inputs, targets) = _model(name), _data()
    eps, tol = STEP.get(name, (1e-4, 1e-6))
    scores = gradient_scores(model, inputs, targets, _loss)
    for i, shape in enumerate(head_shapes(model)):
        want = []
        for h in range(shape.heads):
            up, down = (_losses(_scaled(model, i, [h], 1 + s), inputs, targets) for s in (eps, -eps))
            want.append(((up - down) / (2 * eps)).abs().mean().item())
        assert scores.layers[i].heads == pytest.approx(want, rel=tol)
        assert min(want) > 1e-4  # every head matters a little: the comparison is not of zeros
        groups = groups_of(shape)
        assert scores.layers[i].groups == (None if groups is None else
                                           pytest.approx([sum(want[h] for h in g) for g in groups], rel=tol))
    assert [layer.groups is not None for layer in scores.layers] == [name != "gpt-neo", False, True]


@pytest.mark.parametrize("name", SPECS)
def test_ablation_is_the_loss_of_a_copy_without_the_heads_weights(name):
    model, (inputs, targets) = _model(name), _data()
    scores = ablation_scores(model, inputs, targets, _loss)
    base = _losses(model, inputs, targets).mean().item()
    for i, shape in enumerate(head_shapes(model)):
        want = [_losses(_scaled(model, i, [h], 0.0), inputs, targets).mean().item() - base for h in range(shape.heads)]
        assert scores.layers[i].heads == pytest.approx(want, rel=1e-9, abs=1e-12)
        groups = groups_of(shape)
        if groups is not None:
            assert scores.layers[i].groups == pytest.approx(
                [_losses(_scaled(model, i, g, 0.0), inputs, targets).mean().item() - base for g in groups],
                rel=1e-9, abs=1e-12)
            # a group's loss is not the sum of its heads' (the heads share the residual stream)
            assert scores.layers[i].groups != pytest.approx([sum(want[h] for h in g) for g in groups], rel=1e-3)


@pytest.mark.parametrize("name", SPECS)
def test_activation_is_the_mean_norm_of_the_reference_models_head_outputs(name):
    model, (inputs, _) = _model(name), _data()
    scores = activation_scores(model, inputs)
    # each layer's input, then its head outputs by the reference model's own attention (the
    # output projection replaced by the identity, so its result is the heads side by side)
    captured = []
    hooks = [b.attn.register_forward_pre_hook(lambda m, args: captured.append(args[0])) for b in model.blocks]
    with torch.no_grad():
        model(inputs)
    for hook in hooks:
        hook.remove()
    state = model.state_dict()
    for i, shape in enumerate(head_shapes(model)):
        sd = {**state, f"blocks.{i}.attn.out.weight": torch.eye(shape.width, dtype=torch.float64)}
        sd.pop(f"blocks.{i}.attn.out.bias", None)
        heads = reference_attention(captured[i], sd, f"blocks.{i}.attn", shape, model.spec, None)
        heads = heads.view(*inputs.shape, shape.heads, shape.head_dim)
        want = heads.norm(dim=-1).mean((0, 1))
        tol = NORM_TOL.get(name, 1e-9)
        assert scores.layers[i].heads == pytest.approx(want.tolist(), rel=tol)
        groups = groups_of(shape)
        if groups is not None:
            assert scores.layers[i].groups == pytest.approx([want[g].sum().item() for g in groups], rel=tol)


def test_gates_at_one_change_nothing_and_a_gate_scales_its_head():
    model, (inputs, _) = _model("laguna"), _data()
    shapes = head_shapes(model)
    with torch.no_grad():
        plain = model(inputs)
        with head_gates(model, [torch.ones(s.heads, dtype=torch.float64) for s in shapes]):
            shared = model(inputs)
        with head_gates(model, [torch.ones(inputs.shape[0], s.heads, dtype=torch.float64) for s in shapes]):
            per_sequence = model(inputs)
        half = torch.ones(4, dtype=torch.float64)
        half[1] = 0.5
        with head_gates(model, [None, half, None]):
            gated = model(inputs)
        after = model(inputs)
    assert torch.equal(plain, shared) and torch.equal(plain, per_sequence) and torch.equal(plain, after)
    torch.testing.assert_close(gated, _scaled(model, 1, [1], 0.5)(inputs).detach(), rtol=1e-12, atol=1e-12)


def test_a_model_without_per_head_outputs_and_an_unknown_method_are_refused():
    model, (inputs, targets) = _model("gpt-neo"), _data()
    assert "unknown method 'magnitude'" in one_line_error(score_heads, model, inputs, targets, _loss, ("magnitude",))
    model.blocks[1].attn.out = torch.nn.Identity()
    assert "layer 1" in one_line_error(score_heads, model, inputs, targets, _loss, ("activation",))
    assert "no headwise attention layers" in one_line_error(head_shapes, torch.nn.Linear(2, 2))


# ---------------------------------------------------------------------------------- the command

@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    """A 2-step lm-tiny run with grouped key/value heads (heads 4, 2; KV heads 2, 1)."""
    return train_lm_tiny(tmp_path_factory.mktemp("heads"), 2, "model.kv_heads=[2, 1]")


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_the_command_writes_the_record_and_the_heat_map(lm_run, tmp_path, capsys):
    out = tmp_path / "scores"
    assert main(["heads", "score", str(lm_run), "--tokens", "80", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    record = json.loads((out / "head_scores.json").read_text())
    assert (out / "head_scores.png").stat().st_size > 1000
    # 80 tokens in sequences of the run's 32: three sequences
    assert (record["sequences"], record["sequence_length"], record["tokens"]) == (3, 32, 96)
    assert [(s["heads"], s["kv_heads"]) for s in record["layers"]] == [(4, 2), (2, 1)]
    assert list(record["methods"]) == ["gradient", "activation", "ablation"]
    for scores in record["methods"].values():
        layers = scores["layers"]
        assert [len(layer["heads"]) for layer in layers] == [4, 2]
        assert [len(layer["groups"]) for layer in layers] == [2, 1]
    # the same sample, the same scores: deterministic
    again = tmp_path / "again"
    assert main(["heads", "score", str(lm_run), "--tokens", "80", "--method", "ablation", "--out", str(again)]) == 0
    assert json.loads((again / "head_scores.json").read_text())["methods"]["ablation"] == record["methods"]["ablation"]
    assert "top:" in printed and "bottom:" in printed and "L0.H" in printed and "head_scores.png" in printed
    sha = hashlib.sha256((lm_run / "model" / "model.safetensors").read_bytes()).hexdigest()
    assert (record["model"], record["weights_sha256"]) == (str(lm_run / "model"), sha)


def test_a_damaged_final_model_is_one_line_whose_checkpoint_advice_the_command_takes(lm_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(lm_run, run)
    with open(run / "model" / "model.safetensors", "r+b") as f:
        f.truncate(20000)
    before = _listing(tmp_path)
    assert main(["heads", "score", str(run), "--tokens", "40", "--method", "gradient"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.safetensors is damaged" in err and _listing(tmp_path) == before
    advice = re.search(r"or (--checkpoint \S+) uses that checkpoint", err).group(1)
    # the advice, taken as it is printed: the last checkpoint, which holds the final weights
    assert main(["heads", "score", str(run), "--tokens", "40", "--method", "gradient", *shlex.split(advice)]) == 0
    assert main(["heads", "score", str(lm_run), "--tokens", "40", "--method", "gradient", "--out",
                 str(tmp_path / "intact")]) == 0
    record = json.loads((run / "heads" / "head_scores.json").read_text())
    intact = json.loads((tmp_path / "intact" / "head_scores.json").read_text())
    assert record["model"] == str(run / "checkpoints" / "step_00000002") == advice.split()[1]
    assert record["methods"] == intact["methods"] and record["weights_sha256"] == intact["weights_sha256"]


def test_bad_input_is_one_line_exit_2_and_nothing_written(lm_run, tmp_path, capsys):
    not_lm = tmp_path / "nearest"
    not_lm.mkdir()
    shutil.copy(REPO / "configs" / "nearest-tiny.toml", not_lm / "config.toml")
    (tmp_path / "file").write_text("x")
    before = _listing(lm_run), _listing(tmp_path)
    cases = [
        ([str(tmp_path / "empty-nothing")], "is not a headwise run"),
        ([str(not_lm)], "'nearest' run"),
        ([str(lm_run), "--method", "gradient,magnitude"], "unknown method 'magnitude'"),
        ([str(lm_run), "--tokens", "0"], "--tokens 0"),
        ([str(lm_run), "--out", str(tmp_path / "file")], "is a file"),
        ([str(lm_run), "--checkpoint", str(tmp_path / "none")], "not a saved headwise model"),
    ]
    for argv, says in cases:
        assert main(["heads", "score", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err, (argv, err)
    assert (_listing(lm_run), _listing(tmp_path)) == before
