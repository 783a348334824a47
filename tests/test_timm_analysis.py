"""Attention analysis of timm models: the recomputed probabilities against the attention matrix timm
itself computes (the input of its attention dropout, or DaViT's softmax), the condition numbers and
effective ranks against numpy on the projection's input captured here, a hand-made layer in closed
form, and the metrics of a small model of each family."""

from __future__ import annotations

import math

import numpy as np
import pytest

timm = pytest.importorskip("timm", reason="timm (with torch >= 2.14 and torchvision) is not installed")

import torch  # noqa: E402
from timm.layers import Attention  # noqa: E402
from timm.models import cait, davit  # noqa: E402
from torch import nn  # noqa: E402

from headwise.errors import HeadwiseError  # noqa: E402
from headwise.families.vision.timm_analysis import (  # noqa: E402
    analyze_timm_model,
    timm_attention_layers,
)
from headwise.families.vision.timm_models import TimmChanges, build_timm_model  # noqa: E402
from headwise.model_sources import MODEL_SOURCES  # noqa: E402

# scaled-down models of each family (as in test_timm_models.py), held head width where it can be
SMALL = {
    "vit-held": ("vit_base_patch16_224", TimmChanges(depth=2, heads=6, mlp_ratio=2.0, embed_dim=48, head_dim=16)),
    "vit": ("vit_base_patch16_224", TimmChanges(depth=2, heads=4, mlp_ratio=2.0, embed_dim=48)),
    "xcit-held": ("xcit_medium_24_p16_224", TimmChanges(depth=2, heads=4, embed_dim=32, head_dim=16)),
    "xcit": ("xcit_nano_12_p16_224", TimmChanges(depth=2)),
    "tnt": ("tnt_b_patch16_224", TimmChanges(depth=2, heads=4, mlp_ratio=2.0, embed_dim=64)),
    "volo": ("volo_d3_224", TimmChanges(depth=(1, 1, 1, 1), heads=(2, 4, 4, 4), embed_dim=(32, 64, 64, 64),
                                        mlp_ratio=(2.0, 3.0, 3.0, 3.0))),
    "davit": ("davit_base", TimmChanges(depth=(1, 1, 2, 1), heads=(1, 2, 8, 8), embed_dim=(16, 32, 64, 128))),
}


def small(key: str, image_size: int = 32, std: float | None = 0.6) -> nn.Module:
    """A small float64 model whose score-making weights have this ``std`` (None: timm's), to make
    its attention far from uniform, and whose biases are not zero (at timm's zero biases a
    layer-normed input leaves A rank deficient where it is as wide as the model: its rows sum to zero)."""
    torch.manual_seed(0)
    name, changes = SMALL[key]
    return perturbed(build_timm_model(name, changes, num_classes=5, image_size=image_size, in_chans=1), std)


def perturbed(model: nn.Module, std: float | None) -> nn.Module:
    """``model`` in float64, eval mode, with :func:`small`'s weights and biases."""
    model = model.double().eval()
    for param_name, param in model.named_parameters():
        if param_name.endswith("bias"):
            nn.init.normal_(param, std=0.1)
    for layer in timm_attention_layers(model):
        if layer.source and std is not None:
            nn.init.normal_(getattr(layer.module, layer.source).weight, std=std)
        if hasattr(layer.module, "temperature"):  # XCiT's per-head temperature
            layer.module.temperature.data.uniform_(0.5, 3.0)
    return model


def images(n: int = 2, size: int = 32) -> torch.Tensor:
    return torch.randn(n, 1, size, size, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def keep(store: dict, key: str, value) -> None:
    """Store ``value`` under ``key`` once; returns None, as a hook that changes nothing must."""
    store.setdefault(key, value)


def timms_own(model: nn.Module, x: torch.Tensor) -> list[tuple[object, torch.Tensor, torch.Tensor]]:
    """(layer, our probabilities, timm's own attention matrix) for every analysed layer that has one:
    timm's unfused path, its matrix taken at the input of ``attn_drop`` (after the softmax) or the
    output of DaViT's ``softmax`` module."""
    for module in model.modules():
        if hasattr(module, "fused_attn"):
            module.fused_attn = False
    layers = [layer for layer in timm_attention_layers(model) if not layer.skipped]
    ours, theirs, handles = {}, {}, []
    for layer in layers:
        m = layer.module
        handles.append(getattr(m, layer.source).register_forward_hook(
            lambda _m, _a, out, layer=layer: keep(ours, layer.label, layer.probabilities(out))))
        if hasattr(m, "attn_drop"):
            handles.append(m.attn_drop.register_forward_pre_hook(
                lambda _m, args, layer=layer: keep(theirs, layer.label, args[0].clone())))
        elif hasattr(m, "softmax"):
            handles.append(m.softmax.register_forward_hook(
                lambda _m, _a, out, layer=layer: keep(theirs, layer.label, out.clone())))
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    return [(layer, ours[layer.label], theirs[layer.label]) for layer in layers if layer.label in theirs]


@pytest.mark.parametrize("key, kinds", [
    ("vit-held", {"tokens"}), ("vit", {"tokens"}), ("xcit-held", {"channels"}), ("xcit", {"channels"}),
    ("tnt", {"inner", "tokens"}), ("volo", {"outlook", "tokens"}), ("davit", {"window"}),
])
def test_recomputed_probabilities_are_timms_own_attention_matrix(key, kinds):
    compared = timms_own(small(key), images())
    assert {layer.kind for layer, _, _ in compared} == kinds
    for layer, ours, theirs in compared:
        assert ours.shape == theirs.shape, layer.label
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-13, msg=layer.label)
        keys = theirs.shape[-1]
        assert theirs.max() > 2 / keys, f"{layer.label}: attention is near uniform, the comparison is weak"
        if layer.kind == "channels":  # channel x channel per head, not tokens
            assert theirs.shape[-2:] == (layer.head_dim, layer.head_dim)


def test_qk_normed_attention_is_timms_own():
    torch.manual_seed(0)
    model = nn.Sequential(Attention(16, num_heads=2, qk_norm=True, norm_layer=nn.LayerNorm)).double().eval()
    nn.init.normal_(model[0].q_norm.weight, 1.0, 0.5)
    nn.init.normal_(model[0].k_norm.bias, 0.0, 0.5)
    [(layer, ours, theirs)] = timms_own(model, torch.randn(3, 7, 16, dtype=torch.float64))
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-13)
    assert (layer.label, layer.kind, layer.heads, layer.head_dim) == ("0", "tokens", 2, 8)


@pytest.mark.parametrize("cls, value", [(davit.ChannelAttention, "q"), (davit.ChannelAttentionV2, "v")])
def test_davit_channel_probabilities_rebuild_the_projection_input(cls, value):
    """DaViT's channel attention has no dropout or softmax module to read: its matrix A is rebuilt
    from our probabilities and the part timm weighs with them (q, or v in the second version)."""
    torch.manual_seed(0)
    model = nn.Sequential(cls(24, num_heads=3)).double().eval()
    [layer] = timm_attention_layers(model)
    seen = {}
    model[0].qkv.register_forward_hook(lambda _m, _a, out: keep(seen, "qkv", out))
    model[0].proj.register_forward_pre_hook(lambda _m, args: keep(seen, "a", args[0]))
    with torch.no_grad():
        model(torch.randn(2, 10, 24, dtype=torch.float64))
    probs = layer.probabilities(seen["qkv"])  # [B, heads, 8, 8]
    q, k, v = seen["qkv"].reshape(2, 10, 3, 3, 8).permute(2, 0, 3, 1, 4)
    weighed = (probs @ dict(q=q, v=v)[value].transpose(-1, -2)).permute(0, 3, 1, 2).reshape(2, 10, 24)
    assert layer.kind == "channels" and probs.shape == (2, 3, 8, 8)
    torch.testing.assert_close(weighed, seen["a"], rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("key", SMALL)
def test_condition_numbers_and_ranks_are_those_of_the_projection_input(key):
    """Against numpy's singular values of the input of every analysed layer's ``proj``, captured
    here by name; the model (float64) is analysed in place, in train mode, and left as it was."""
    model = small(key)
    layers = [layer for layer in timm_attention_layers(model) if not layer.skipped]
    modules = dict(model.named_modules())
    captured, handles = {}, []
    for layer in layers:
        handles.append(modules[layer.label + ".proj"].register_forward_pre_hook(
            lambda _m, args, label=layer.label: keep(captured, label, args[0].numpy().copy())))
    x = images()
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    model.train()
    result = analyze_timm_model(model, [x[:1], x[1:]], chunk=1)
    assert model.training
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    assert [s.index for s in result.layers] == list(range(len(layers)))
    assert result.sequences == 2
    for stats, layer in zip(result.layers, layers):
        a = captured[layer.label]
        a = a.reshape(a.shape[0], -1, a.shape[-1])
        sigma = np.linalg.svd(a, compute_uv=False)
        cond = sigma[:, 0] / sigma[:, -1]
        finite = np.isfinite(stats.cond)
        assert stats.attention == f"{layer.kind}:{layer.label}"
        np.testing.assert_allclose(stats.cond[finite], cond[finite], rtol=1e-7)
        assert (cond[~finite] > 1e12).all()  # read as rank deficient: numerically so
        heads = a.reshape(a.shape[0], a.shape[1], layer.heads, layer.head_dim).transpose(0, 2, 1, 3)
        s = np.linalg.svd(heads, compute_uv=False)
        p = s / s.sum(-1, keepdims=True)
        erank = np.exp(-(p * np.log(np.where(p > 0, p, 1))).sum(-1)).mean(0)
        np.testing.assert_allclose(stats.erank, erank, rtol=1e-9)


def test_a_hand_made_layer_in_closed_form():
    """One head of width 2, two orthonormal tokens, q = k = c x, v = x: the probabilities are
    [[a, b], [b, a]] with a = e^s / (e^s + 1), s = c^2 / sqrt(2), and A is that matrix: singular
    values 1 and 2a - 1, condition number coth(s / 2). At e^s = 9: a = 0.9, cond = 10 / 8."""
    attn = Attention(2, num_heads=1)
    c = math.sqrt(math.sqrt(2) * math.log(9))
    with torch.no_grad():
        attn.qkv.weight.copy_(torch.cat([c * torch.eye(2), c * torch.eye(2), torch.eye(2)]))
    model = nn.Sequential(attn)
    # what the trainer logs (``Trainer._analyse``): the run's spec's analysis of one batch
    spec = MODEL_SOURCES["timm"].parse({"name": "vit_tiny_patch16_224"})
    metrics = spec.analyze(model, [torch.eye(2)[None]]).metrics()
    entropy = -(0.9 * math.log(0.9) + 0.1 * math.log(0.1))
    p = np.array([1.0, 0.8]) / 1.8
    assert metrics == pytest.approx({
        "cond_mean": 1.25, "cond_median": 1.25, "cond_layer0_mean": 1.25, "cond_layer0_median": 1.25,
        "rankdef_layer0": 0.0, "entropy_layer0": entropy, "erank_layer0": math.exp(-(p * np.log(p)).sum()),
    }, rel=1e-6)  # c is rounded to float32 in the weights
    assert next(model.parameters()).dtype == torch.float32  # measured on a float64 copy


@pytest.mark.parametrize("key", SMALL)
def test_metrics_of_a_small_model_of_each_family(key):
    # timm's weights (larger ones can saturate DaViT's channel attention: one-hot rows, A rank deficient)
    size = 32
    if key == "davit":
        # DaViT pads a 32 px image's stages to its 7 x 7 windows, whose padded rows of A are all alike
        # (rank deficient where few positions are real); 2 x 2 windows on 64 px pad none
        size = 64
        torch.manual_seed(0)
        model = perturbed(timm.create_model("davit_tiny", depths=(1, 1, 2, 1), num_heads=(1, 2, 8, 8),
                                            embed_dims=(16, 32, 64, 128), window_size=2, num_classes=5,
                                            in_chans=1), None).float()
    else:
        model = small(key, size, std=None).float()
    result = analyze_timm_model(model, [images(1, size)])
    metrics = result.metrics()  # what the trainer logs (the closed-form test goes through the spec)
    n = len(result.layers)
    assert n == sum(not layer.skipped for layer in timm_attention_layers(model))
    assert set(metrics) == {"cond_mean", "cond_median"} | {
        f"{what}_layer{i}{end}" for i in range(n)
        for what, end in (("cond", "_mean"), ("cond", "_median"), ("rankdef", ""), ("entropy", ""), ("erank", ""))}
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    for stats in result.layers:
        assert (stats.entropy <= stats.entropy_uniform + 1e-12).all() and (stats.entropy > 0).all()
        assert ((stats.erank >= 1 - 1e-9) & (stats.erank <= stats.head_dim + 1e-9)).all()


def test_layers_not_analysed_are_listed_with_the_reason():
    xcit = small("xcit")
    skipped = {layer.label: layer for layer in timm_attention_layers(xcit) if layer.skipped}
    assert set(skipped) == {"cls_attn_blocks.0.attn", "cls_attn_blocks.1.attn"}
    assert {layer.kind for layer in skipped.values()} == {"class"}
    assert "one query" in skipped["cls_attn_blocks.0.attn"].skipped
    model = nn.Sequential(Attention(16, num_heads=2, gated=True), cait.TalkingHeadAttn(16, num_heads=2))
    gated, talking = timm_attention_layers(model)
    assert (gated.kind, talking.kind) == ("tokens", "unknown")
    assert "gated" in gated.skipped and "TalkingHeadAttn" in talking.skipped
    with pytest.raises(HeadwiseError, match="no attention layer this analysis can read"):
        analyze_timm_model(model, [torch.randn(1, 4, 16)])


def test_empty_inputs_are_refused():
    model = small("vit")
    with pytest.raises(HeadwiseError, match=r"non-empty batch \[B, ...\], got \(0, 1, 32, 32\)"):
        analyze_timm_model(model, [torch.randn(0, 1, 32, 32)])
    with pytest.raises(HeadwiseError, match="evaluation set is empty"):
        analyze_timm_model(model, [])
