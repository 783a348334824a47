"""Attention analysis: condition numbers against numpy, entropies and effective ranks against
closed forms, the captured matrix A against a hand-written attention, and the training hook."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from headwise.analysis.conditioning import (
    analyze_model,
    attention_probabilities,
    capture_attention,
    condition_number,
    effective_rank,
)
from headwise.errors import HeadwiseError
from headwise.model import Transformer
from headwise.spec import ModelSpec


def _spec(**kw) -> ModelSpec:
    base = dict(vocab_size=97, d_model=32, n_layers=2, heads=[2, 4], max_seq_len=64)
    return ModelSpec.parse({**base, **kw})


def _perturb(model: nn.Module, seed: int, scale: float = 0.3) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


# ----------------------------------------------------------------------------- condition number


def test_condition_number_matches_numpy_on_full_rank_matrices():
    rng = np.random.default_rng(0)
    mats = [rng.standard_normal((5, 3)), rng.standard_normal((3, 7)), rng.standard_normal((6, 6)),
            np.diag([1.0, 2.0, 3.0]), np.eye(4), np.diag([1.0, 1e-10])]
    for a in mats:
        assert float(condition_number(a)) == pytest.approx(np.linalg.cond(a), rel=1e-9)
    assert float(condition_number(np.diag([1.0, 2.0, 3.0]))) == pytest.approx(3.0)
    batch = rng.standard_normal((4, 6, 5))
    assert condition_number(batch).numpy() == pytest.approx([np.linalg.cond(m) for m in batch], rel=1e-9)


def test_condition_number_is_inf_for_rank_deficient_matrices():
    rng = np.random.default_rng(1)
    u, v = rng.standard_normal((6, 1)), rng.standard_normal((1, 4))
    dup = rng.standard_normal((5, 8))
    dup[3] = dup[1]
    deficient = [np.array([[1.0, 2.0], [2.0, 4.0]]), u @ v, np.zeros((3, 5)), dup]
    for a in deficient:
        assert np.linalg.matrix_rank(a) < min(a.shape)  # numpy agrees it is rank deficient
        assert math.isinf(float(condition_number(a)))
    # The tolerance follows the precision the matrix was computed in: diag(1, 1e-10) is full rank
    # in float64 (checked above) but indistinguishable from rank 1 in float32.
    assert math.isinf(float(condition_number(torch.tensor([[1.0, 0.0], [0.0, 1e-10]], dtype=torch.float32))))
    low = (torch.randn(6, 2) @ torch.randn(2, 6)).float()  # rank 2, computed in float32
    assert math.isinf(float(condition_number(low)))
    well = torch.randn(6, 6, generator=torch.Generator().manual_seed(2))
    assert float(condition_number(well)) == pytest.approx(np.linalg.cond(well.double().numpy()), rel=1e-9)


def test_effective_rank_closed_forms():
    assert float(effective_rank(np.diag([1.0, 1.0, 1.0, 0.0]))) == pytest.approx(3.0)
    assert float(effective_rank(np.outer([1.0, 2.0, 3.0], [4.0, 5.0]))) == pytest.approx(1.0)
    p = np.array([0.75, 0.25])
    assert float(effective_rank(np.diag([3.0, 1.0]))) == pytest.approx(math.exp(-(p * np.log(p)).sum()))
    assert float(effective_rank(np.zeros((3, 3)))) == 0.0


# ----------------------------------------------------------------------------- captured A


def _manual_attention(attn, x):
    """softmax(q k^T * scale) v per head with a hand-built mask, written independently of the model."""
    qkv = F.linear(x, attn.qkv.weight, attn.qkv.bias)
    t, width, d = x.shape[1], attn.heads * attn.head_dim, attn.head_dim
    window = getattr(attn, "window", None)  # set on local layers by their kind
    allowed = torch.zeros(t, t, dtype=torch.bool)
    for i in range(t):
        for j in range(t):
            allowed[i, j] = (not attn.causal or j <= i) and (window is None or i - j < window)
    outs, probs = [], []
    for h in range(attn.heads):
        q = qkv[..., h * d:(h + 1) * d]
        k = qkv[..., width + h * d:width + (h + 1) * d]
        v = qkv[..., 2 * width + h * d:2 * width + (h + 1) * d]
        scores = (q @ k.transpose(-1, -2)) * attn.scale
        p = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        probs.append(p)
        outs.append(p @ v)
    return torch.cat(outs, dim=-1), torch.stack(probs, dim=1), allowed


@pytest.mark.parametrize("score_scale", ["none", "inv_sqrt"])
def test_captured_A_equals_manual_attention_incl_local_window(score_scale):
    torch.manual_seed(0)
    spec = _spec(n_layers=3, heads=[2, 4, 1], attention=["global", "local", "local"], window=5,
                 qkv_bias=True, score_scale=score_scale)
    model = Transformer(spec).eval()
    _perturb(model, seed=3, scale=0.05)
    x = torch.randint(0, 97, (3, 20))  # T = 20 > window 5: the local layers really cut keys off
    layer_inputs = {}
    hooks = [b.attn.register_forward_pre_hook(lambda _m, a, i=i: layer_inputs.__setitem__(i, a[0]))
             for i, b in enumerate(model.blocks)]
    qkv_out = {}
    hooks += [b.attn.qkv.register_forward_hook(lambda _m, _a, out, i=i: qkv_out.__setitem__(i, out))
              for i, b in enumerate(model.blocks)]
    with torch.no_grad(), capture_attention(model) as captured:
        model(x)
    for h in hooks:
        h.remove()
    assert sorted(captured) == [0, 1, 2]
    for i, block in enumerate(model.blocks):
        manual_a, manual_p, allowed = _manual_attention(block.attn, layer_inputs[i])
        if i > 0:
            assert not allowed[19, 10]  # key 10 is outside query 19's window of 5
        torch.testing.assert_close(captured[i][0], manual_a, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(attention_probabilities(block.attn, qkv_out[i]), manual_p, atol=1e-6, rtol=1e-5)


def test_analyze_model_condition_numbers_are_those_of_the_captured_A():
    torch.manual_seed(1)
    model = Transformer(_spec(attention=["global", "local"], window=6)).eval()
    _perturb(model, seed=4, scale=0.05)
    x = torch.randint(0, 97, (4, 24))
    with torch.no_grad(), capture_attention(model) as captured:
        model(x)
    result = analyze_model(model, [x[:2], x[2:]], dtype=None)
    for layer in result.layers:
        a = captured[layer.index][0].double().numpy()
        expected = [np.linalg.cond(m) for m in a]
        assert layer.cond == pytest.approx(expected, rel=1e-6)
        assert layer.cond_mean == pytest.approx(np.mean(expected), rel=1e-6)
        assert layer.cond_median == pytest.approx(np.median(expected), rel=1e-6)
    assert result.sequences == 4
    assert result.cond_mean == pytest.approx(np.mean([layer.cond_mean for layer in result.layers]))
    # The float64 default agrees with the float32 forward while A is moderately conditioned.
    exact = analyze_model(model, [x])
    for a, b in zip(exact.layers, result.layers):
        assert a.cond == pytest.approx(b.cond, rel=1e-3)


def test_splitting_batches_to_bound_memory_changes_nothing(monkeypatch):
    import headwise.analysis.conditioning as conditioning

    torch.manual_seed(3)
    model = Transformer(_spec(attention=["global", "local"], window=5))
    x = torch.randint(0, 97, (5, 16))
    whole = analyze_model(model, [x]).metrics()
    monkeypatch.setattr(conditioning, "PROBS_BUDGET_BYTES", 1)  # one sequence per forward
    assert analyze_model(model, [x]).metrics() == pytest.approx(whole, rel=1e-12)


# ----------------------------------------------------------------------------- entropy


def test_entropy_of_uniform_attention_follows_the_mask():
    # q = 0 makes every score 0: each query attends uniformly to the keys its mask allows.
    t, window = 12, 4
    model = Transformer(_spec(attention=["global", "local"], window=window)).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight[: block.attn.width].zero_()
    result = analyze_model(model, [torch.randint(0, 97, (2, t))])
    keys_global = np.arange(1, t + 1)
    keys_local = np.minimum(keys_global, window)
    assert result.layers[0].entropy == pytest.approx([np.log(keys_global).mean()] * 2, abs=1e-9)
    assert result.layers[1].entropy == pytest.approx([np.log(keys_local).mean()] * 4, abs=1e-9)
    # ... which is exactly each layer's reference ceiling
    assert result.layers[0].entropy_uniform == pytest.approx(np.log(keys_global).mean())
    assert result.layers[1].entropy_uniform == pytest.approx(np.log(keys_local).mean())


def _vector_model(one_hot: bool) -> Transformer:
    """One head on raw 4-d vectors (post-norm: the attention sees the inputs themselves):
    score_ij = 1000 * x_i[0] * x_j[1], so feature 1 picks the key; or all scores 0."""
    spec = ModelSpec.parse(dict(vocab_size=None, d_model=4, n_layers=1, heads=[1], causal=False,
                                norm="unitnorm_post", positions="none", max_seq_len=16))
    model = Transformer(spec).eval()
    w = torch.zeros(12, 4)
    if one_hot:
        w[0, 0] = 1000.0  # q = 1000 * x[0]
        w[4, 1] = 1.0  # k = x[1]
    w[8:12] = torch.eye(4)  # v = x
    with torch.no_grad():
        model.blocks[0].attn.qkv.weight.copy_(w)
    return model


@pytest.mark.parametrize("one_hot", [False, True])
def test_entropy_of_uniform_and_one_hot_attention_on_a_hand_built_model(one_hot):
    n = 10
    x = torch.zeros(3, n, 4, dtype=torch.float64)
    x[:, :, 0] = 1.0
    x[:, 2, 1] = 1.0  # key 2 is the one every query picks
    x[:, :, 2] = torch.randn(3, n, dtype=torch.float64)
    result = analyze_model(_vector_model(one_hot), [x])
    expected = 0.0 if one_hot else math.log(n)
    assert result.layers[0].entropy == pytest.approx([expected], abs=1e-9)


# ----------------------------------------------------------------------------- training metrics


def _training_metrics(model: Transformer, inputs: torch.Tensor) -> dict[str, float]:
    """What the trainer logs every ``analysis.every`` steps (``Trainer._analyse``)."""
    return model.spec.analyze(model, [inputs]).metrics()


def test_training_metrics_keys_values_and_mode_restored():
    torch.manual_seed(2)
    model = Transformer(_spec(n_layers=3, heads=[2, 4, 8])).train()
    _perturb(model, seed=5, scale=0.05)
    x = torch.randint(0, 97, (4, 16))
    metrics = _training_metrics(model, x)
    per_layer = ["cond_layer{}_mean", "cond_layer{}_median", "rankdef_layer{}", "entropy_layer{}", "erank_layer{}"]
    assert set(metrics) == {"cond_mean", "cond_median"} | {k.format(i) for k in per_layer for i in range(3)}
    assert all(isinstance(v, float) for v in metrics.values())
    assert metrics["cond_mean"] == pytest.approx(np.mean([metrics[f"cond_layer{i}_mean"] for i in range(3)]))
    for i, heads in enumerate([2, 4, 8]):
        assert 1.0 <= metrics[f"cond_layer{i}_median"] < math.inf
        assert 0.0 < metrics[f"entropy_layer{i}"] <= math.log(16)
        assert 1.0 <= metrics[f"erank_layer{i}"] <= 32 // heads
    assert model.training
    assert all(p.grad is None for p in model.parameters())
    model.eval()
    _training_metrics(model, x)
    assert not model.training


def test_single_head_layer_after_layernorm_is_rank_deficient():
    # One head: A = P LN(x) W_v, and LayerNorm (bias 0 at init) leaves rows orthogonal to
    # (1, ..., 1), so rank(A) <= d_model - 1 < width when T >= d_model: reported as inf.
    model = Transformer(_spec(n_layers=1, heads=[1]))
    metrics = _training_metrics(model, torch.randint(0, 97, (2, 40)))
    assert math.isinf(metrics["cond_layer0_mean"]) and metrics["rankdef_layer0"] == 1.0


# ----------------------------------------------------------------------------- bad input


def test_bad_inputs_raise_one_line_errors():
    model = Transformer(_spec(max_seq_len=16))
    with pytest.raises(HeadwiseError, match="longer than the model's context"):
        _training_metrics(model, torch.randint(0, 97, (2, 17)))
    with pytest.raises(HeadwiseError, match="no attention layers"):
        analyze_model(nn.Sequential(nn.Linear(4, 4)), [torch.randn(2, 3, 4)])
    for block in model.blocks:
        block.attn = nn.Identity()  # blocks without attention
    with pytest.raises(HeadwiseError, match="no attention layers"):
        analyze_model(model, [torch.randint(0, 97, (2, 8))])
    with pytest.raises(HeadwiseError, match="no batches"):
        analyze_model(Transformer(_spec()), [])
