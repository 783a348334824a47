"""headwise's ViT equals timm's VisionTransformer at the same weights, both ways (issue 43's
parity): logits within 1e-5 in fp32 and training gradients alike, computed by timm's own model
code; a round trip keeps every weight bit for bit; what cannot be converted is refused in one line."""

from __future__ import annotations

import pytest

timm = pytest.importorskip("timm", reason="timm (with torch >= 2.14 and torchvision) is not installed")

import torch  # noqa: E402
from timm.layers import RmsNorm  # noqa: E402
from timm.models.vision_transformer import VisionTransformer  # noqa: E402

from headwise.errors import HeadwiseError  # noqa: E402
from headwise.families.vision.timm_models import TimmChanges, build_timm_model  # noqa: E402
from headwise.families.vision.timm_vit import TIMM_VIT, from_timm, spec_from_timm, to_timm  # noqa: E402
from headwise.model.transformer import Transformer  # noqa: E402
from headwise.presets import spec_from_preset  # noqa: E402

# small ViTs of the presets' kind: 28 px grayscale and 32 px colour, 10 classes
SPECS = {
    "uniform-28": dict(preset="vit-tiny-28", d_model=32, n_layers=2, heads=[4] * 2),
    # Leaner's held head width: 8 heads of 8 at width 32 (attention 64 wide), MLP at 2x
    "held-width-32": dict(preset="vit-small-32", patch_size=8, d_model=32, n_layers=3, heads=[8] * 3, head_dim=8,
                          mlp_ratio=2.0, drop_path=0.1),
    "mean-pooled-28": dict(preset="vit-tiny-28", patch_size=7, d_model=24, n_layers=2, heads=[3] * 2, pooling="mean",
                           qkv_bias=False, activation="gelu_new", layer_norm_eps=1e-5, mlp_hidden=40),
}


def _spec(name: str):
    fields = dict(SPECS[name])
    return spec_from_preset(fields.pop("preset"), **fields)


def _randomised(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every weight drawn at random: biases and norms away from zero and one, so a misplaced one shows."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.3)
    return model.eval()


def _images(spec, batch: int = 5) -> torch.Tensor:
    return torch.randn(batch, spec.channels, spec.image_size, spec.image_size, generator=torch.Generator().manual_seed(1))


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


@pytest.mark.parametrize("name", SPECS)
def test_headwise_to_timm_gives_the_same_logits(name):
    spec = _spec(name)
    ours = _randomised(Transformer(spec))
    theirs = to_timm(ours)
    assert type(theirs) is VisionTransformer and not theirs.training
    x = _images(spec)
    with torch.no_grad():
        expected, got = ours(x), theirs(x)
    assert expected.shape == (5, 10) and expected.std() > 0.1
    assert _max_diff(expected, got) < 1e-5


@pytest.mark.parametrize("name", SPECS)
def test_the_round_trip_keeps_every_weight_and_the_spec(name):
    spec = _spec(name)
    ours = _randomised(Transformer(spec))
    back = from_timm(to_timm(ours))
    assert back.spec == spec
    a, b = ours.state_dict(), back.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_the_held_width_is_timms_attn_head_dim():
    theirs = to_timm(Transformer(_spec("held-width-32")))
    attn = theirs.blocks[0].attn
    assert (attn.num_heads, attn.head_dim, attn.qkv.out_features, attn.proj.in_features) == (8, 8, 3 * 64, 64)
    assert [b.drop_path1.drop_prob for b in theirs.blocks[1:]] == pytest.approx([0.05, 0.1])


# timm's own models, built as timm builds them (not through to_timm), 28 px grayscale or 32 px colour
TIMM_MODELS = {
    "timm-defaults": lambda: VisionTransformer(img_size=28, patch_size=7, in_chans=1, num_classes=10, embed_dim=32,
                                               depth=2, num_heads=4, mlp_ratio=2.0),
    # Leaner's construction through the builder: ViT-B's attention held at head_dim 16 while heads grow
    "leaner-builder": lambda: build_timm_model("vit_base_patch16_224", TimmChanges(depth=2, heads=4, mlp_ratio=1.5,
                                                                                   embed_dim=32, head_dim=16),
                                               num_classes=10, image_size=32, in_chans=3),
    "mean-no-fc-norm": lambda: VisionTransformer(img_size=32, patch_size=8, in_chans=3, num_classes=10, embed_dim=24,
                                                 depth=2, num_heads=2, class_token=False, global_pool="avg",
                                                 fc_norm=False, qkv_bias=False, act_layer="gelu_tanh"),
}


@pytest.mark.parametrize("name", TIMM_MODELS)
def test_timm_to_headwise_gives_the_same_logits(name):
    theirs = _randomised(TIMM_MODELS[name]())
    ours = from_timm(theirs)
    x = _images(ours.spec)
    with torch.no_grad():
        expected, got = theirs(x), ours(x)
    assert expected.std() > 0.1
    assert _max_diff(expected, got) < 1e-5
    again = to_timm(ours).state_dict()
    assert all(torch.equal(v, again[k]) for k, v in theirs.state_dict().items())


def test_what_is_read_from_timms_leaner_model():
    spec = spec_from_timm(TIMM_MODELS["leaner-builder"]())
    assert (spec.d_model, spec.n_layers, spec.heads, spec.head_dim, spec.layer(0).mlp_hidden) == (32, 2, [4, 4], 16, 48)
    assert (spec.image_size, spec.patch_size, spec.channels, spec.num_classes, spec.pooling) == (32, 16, 3, 10, "cls")
    assert (spec.activation, spec.layer_norm_eps, spec.qkv_bias, spec.drop_path) == ("gelu", 1e-6, True, None)


@pytest.mark.parametrize("name", ["uniform-28", "held-width-32"])
def test_training_gradients_match_with_drop_path(name):
    """In training, with timm's and headwise's drop path drawing the same masks from one seed."""
    spec = _spec(name).model_copy(update={"drop_path": 0.2})
    ours = _randomised(Transformer(spec)).train()
    theirs = to_timm(ours).train()
    x, labels = _images(spec), torch.arange(5) % 10
    for model in (ours, theirs):
        torch.manual_seed(7)
        torch.nn.functional.cross_entropy(model(x), labels).backward()
    grads = dict(theirs.named_parameters())
    pairs = TIMM_VIT.layout.pairs(spec) + [(f"blocks.{i}.attn.qkv.{p}",) * 2
                                           for i in range(spec.n_layers) for p in ("weight", "bias")]
    assert len(pairs) == len(grads)
    for a, b in pairs:
        g = ours.get_parameter(a).grad
        assert _max_diff(g.reshape(grads[b].shape), grads[b].grad) < 1e-5, a
    assert ours.get_parameter("classifier.weight").grad.abs().max() > 1e-3


def test_the_papers_vits_are_expressible_at_their_counts():
    """ViT-B/16 and Leaner's 7x16 at head_dim 64 as timm builds them (on the meta device): the same
    parameter counts as headwise's presets record."""
    for name, count in (("vit-b16", 86_567_656), ("vit-leaner-7x16", 40_112_872)):
        spec = spec_from_preset(name)
        with torch.device("meta"):
            theirs = VisionTransformer(**TIMM_VIT.to_config(spec))
        assert sum(p.numel() for p in theirs.parameters()) == count, name


def _one_line_refusal(call, match: str) -> None:
    with pytest.raises(HeadwiseError, match=match) as caught:
        call()
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("change,match", [
    (dict(heads=[2, 4]), r"different head counts \[2, 4\]; timm's VisionTransformer has one num_heads"),
    (dict(head_dim=[8, 16]), "different head widths"),
    (dict(kv_heads=2), "key/value heads"),
    (dict(activation="geglu"), "gated"),
    (dict(dropout=0.1), "dropout = 0.1: timm's MLP also drops after its activation"),
    (dict(classifier_hidden=16), "classifier_hidden"),
    (dict(norm="rmsnorm_pre"), "norm = 'rmsnorm_pre'"),
    (dict(attention="nystrom", landmarks=7), "nystrom attention layers"),
])
def test_headwise_specs_timm_cannot_express_are_refused_in_one_line(change, match):
    spec = spec_from_preset("vit-tiny-28", **{**dict(d_model=32, n_layers=2, heads=[4] * 2), **change})
    _one_line_refusal(lambda: to_timm(Transformer(spec)), f"cannot convert to timm's VisionTransformer: .*{match}")


_SMALL = dict(img_size=28, patch_size=7, in_chans=1, num_classes=10, embed_dim=32, depth=2, num_heads=4)


@pytest.mark.parametrize("change,match", [
    (dict(global_pool="max"), "global_pool = 'max'"),
    (dict(global_pool="avg", fc_norm=False), "with a class or register token"),
    (dict(global_pool="avg", class_token=False), "fc_norm: timm norms after pooling"),
    (dict(final_norm=False), "final_norm=False"),
    (dict(no_embed_class=True), "no_embed_class"),
    (dict(pos_embed="none"), "no position embedding"),
    (dict(num_classes=0), "no classifier"),
    (dict(img_size=(28, 14)), r"img_size \(28, 14\)"),
    (dict(block_fn=timm.models.vision_transformer.ResPostBlock), "block 0 is ResPostBlock"),
    (dict(norm_layer=RmsNorm), "its norms are .*RmsNorm"),
    (dict(drop_rate=0.1), r"dropout \[\('head_drop', 0.1\)\]"),
    (dict(proj_drop_rate=0.1), "dropout"),
    (dict(act_layer="quick_gelu"), "activation QuickGELU is none of headwise's"),
    (dict(init_values=1e-5), "no place for its weights blocks.0.ls1.gamma"),
    (dict(reg_tokens=2), "no place for its weights reg_token"),
    (dict(qk_norm=True), "no place for its weights blocks.0.attn.k_norm"),
    (dict(pre_norm=True), "no place for its weights norm_pre"),
])
def test_timm_models_headwise_cannot_express_are_refused_in_one_line(change, match):
    theirs = VisionTransformer(**{**_SMALL, **change})
    _one_line_refusal(lambda: from_timm(theirs), f"cannot convert from timm's VisionTransformer: .*{match}")


def test_a_timm_subclass_is_refused():
    distilled = timm.models.deit.VisionTransformerDistilled(**_SMALL)
    _one_line_refusal(lambda: from_timm(distilled), "VisionTransformerDistilled is not timm's VisionTransformer")
