"""headwise's ViT against Hugging Face ViTForImageClassification: logits both ways, parameter
counts, config round trips, and the specs ViT cannot express."""

import pytest
import torch
import torch.nn.functional as F

from headwise.errors import HeadwiseError
from headwise.hf.vit import from_hf_vit, spec_from_vit_config, to_hf_vit, to_vit_config, vit_incompatibility
from headwise.model import Transformer
from headwise.params import count_params
from headwise.presets import spec_from_preset
from headwise.spec import ModelSpec

transformers = pytest.importorskip("transformers",
                                   reason="transformers is the parity reference (pip install -e .[dev])")

SMALL = dict(image_size=16, patch_size=4, channels=3, num_classes=7)
CONFIGS = {
    "tiny-28-preset": ("vit-tiny-28", {}),
    "2-layer-12-heads": ("vit-small-32", dict(d_model=48, n_layers=2, heads=[12] * 2, mlp_hidden=96)),
    "grey-patch2-no-qkv-bias": ("vit-tiny-28", dict(d_model=32, n_layers=3, heads=[2] * 3, mlp_hidden=40, image_size=8,
                                                    patch_size=2, qkv_bias=False)),
    "colour-patch8-one-head": ("vit-small-32", dict(d_model=24, n_layers=1, heads=[1], mlp_hidden=64, patch_size=8,
                                                    num_classes=3)),
    "rgb-16px-gelu_new-eps1e-5": ("vit-small-32", dict(**SMALL, d_model=64, n_layers=2, heads=[8] * 2, mlp_hidden=128,
                                                       activation="gelu_new", layer_norm_eps=1e-5)),
    "relu-head-dim-6": ("vit-small-32", dict(**SMALL, d_model=36, n_layers=2, heads=[6] * 2, mlp_hidden=50,
                                             activation="relu")),
    # Leaner's shape in small: attention wider than d_model (ViTConfig.head_dim)
    "leaner-decoupled-head-dim": ("vit-leaner-7x16", dict(**SMALL, d_model=32, n_layers=2, heads=[4] * 2, head_dim=16,
                                                          mlp_hidden=48)),
}
IMPLEMENTATIONS = ["eager", "sdpa"]


def _spec(name: str) -> ModelSpec:
    preset, fields = CONFIGS[name]
    return spec_from_preset(preset, **fields)


def _random_weights(model: torch.nn.Module, seed: int) -> None:
    # Perturb every parameter (biases, norms, class token, positions too) so the comparison cannot
    # pass on zeros and ones.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))


def _pixels(spec: ModelSpec, batch: int = 3, seed: int = 5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, spec.channels, spec.image_size, spec.image_size, generator=g)


def _same_model(a: ModelSpec, b: ModelSpec) -> bool:
    """Equal specs up to how the MLP width is written (mlp_hidden 256 or mlp_ratio 4 at d 64)."""
    skip = {"mlp_hidden", "mlp_ratio"}
    return a.layers() == b.layers() and a.model_dump(exclude=skip) == b.model_dump(exclude=skip)


def _n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_and_loss_match_hf_vit(name, impl):
    torch.manual_seed(0)
    spec = _spec(name)
    ours = Transformer(spec).eval()
    _random_weights(ours, seed=1)
    theirs = to_hf_vit(ours, attn_implementation=impl)
    assert theirs.config._attn_implementation == impl and not theirs.training
    x = _pixels(spec)
    labels = torch.arange(3) % spec.num_classes
    with torch.no_grad():
        a = ours(x)
        out = theirs(x, labels=labels)
    assert a.shape == (3, spec.num_classes)
    assert (a - out.logits).abs().max().item() < 1e-5
    assert abs(F.cross_entropy(a, labels).item() - out.loss.item()) < 1e-5
    assert count_params(spec) == _n_params(ours) == _n_params(theirs)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_conversion_from_hf_vit(name, impl):
    torch.manual_seed(0)
    spec = _spec(name)
    config = to_vit_config(spec)
    hf = transformers.ViTForImageClassification(config)
    hf.set_attn_implementation(impl)
    hf.eval()
    _random_weights(hf, seed=2)
    ours = from_hf_vit(hf)
    assert not ours.training
    assert ours.spec.heads == spec.heads and ours.spec.head_dims == spec.head_dims
    assert count_params(ours.spec) == _n_params(ours) == _n_params(hf)
    x = _pixels(spec, batch=2, seed=6)
    with torch.no_grad():
        assert (ours(x) - hf(x).logits).abs().max().item() < 1e-5


def test_gradients_match_hf_vit():
    # Training parity, not just inference: the same loss gives the same gradients, layout aside.
    spec = _spec("2-layer-12-heads")
    ours = Transformer(spec).train()
    _random_weights(ours, seed=3)
    theirs = to_hf_vit(ours).train()
    x, labels = _pixels(spec), torch.tensor([0, 3, 9])
    F.cross_entropy(ours(x), labels).backward()
    theirs(x, labels=labels).loss.backward()
    hf = {n: p.grad for n, p in theirs.named_parameters()}
    width = spec.layer(0).width
    pairs = [(ours.blocks[1].mlp.fc.weight.grad, hf["vit.layers.1.mlp.fc1.weight"]),
             (ours.patch_emb.weight.grad, hf["vit.embeddings.patch_embeddings.projection.weight"]),
             (ours.cls_token.weight.grad, hf["vit.embeddings.cls_token"]),
             (ours.pos_emb.weight.grad, hf["vit.embeddings.position_embeddings"][0]),
             (ours.blocks[0].attn.qkv.weight.grad[width:2 * width], hf["vit.layers.0.attention.k_proj.weight"]),
             (ours.blocks[0].attn.qkv.bias.grad[:width], hf["vit.layers.0.attention.q_proj.bias"])]
    for a, b in pairs:
        assert (a - b).abs().max().item() < 1e-5


@pytest.mark.parametrize("name", list(CONFIGS))
def test_spec_round_trips_through_vit_config(name):
    spec = _spec(name)
    assert _same_model(spec_from_vit_config(to_vit_config(spec)), spec)


def test_vit_config_round_trips_through_spec():
    config = transformers.ViTConfig(hidden_size=48, num_hidden_layers=3, num_attention_heads=6, intermediate_size=100,
                                    image_size=20, patch_size=5, num_channels=1, num_labels=4, qkv_bias=False,
                                    layer_norm_eps=1e-6, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    spec = spec_from_vit_config(config)
    assert spec.max_seq_len == 17 and spec.dropout == 0.1 and spec.layer(0).head_dim == 8
    back = to_vit_config(spec).to_dict()
    for key, value in config.to_dict().items():
        if key not in ("transformers_version", "architectures"):
            assert back[key] == value, key


def test_vit_b16_preset_counts_match_hf():
    spec = spec_from_preset("vit-b16")
    with torch.device("meta"):
        hf = transformers.ViTForImageClassification(to_vit_config(spec))
    assert count_params(spec) == _n_params(hf) == 86_567_656
    assert _same_model(spec_from_vit_config(hf.config), spec)


@pytest.mark.parametrize("fields,needle", [
    (dict(pooling="mean"), "classifies the class token only"),
    (dict(heads=[4, 2]), "different head counts"),
    (dict(heads=[4, 4], head_dim=[8, 16]), "different head widths"),
    (dict(mlp_hidden=[32, 64]), "different MLP widths"),
    (dict(score_scale="none"), "score_scale"),
    (dict(norm="unitnorm_post"), "norm"),
    (dict(positions="none"), "positions"),
    (dict(out_bias=False), "out_bias"),
    (dict(mlp_bias=False), "mlp_bias"),
    (dict(classifier_hidden=16), "classifier is one linear map"),
    (dict(attention=["global", "nystrom"]), "it has nystrom attention layers"),
])
def test_inexpressible_specs_refuse_conversion(fields, needle):
    spec = spec_from_preset("vit-tiny-28", **{"d_model": 32, "n_layers": 2, "heads": [4, 4], **fields})
    reason = vit_incompatibility(spec)
    assert needle in reason and "\n" not in reason
    with pytest.raises(HeadwiseError, match="cannot convert to ViT") as err:
        to_hf_vit(Transformer(spec))
    assert "\n" not in str(err.value)


def test_non_image_specs_refuse_conversion():
    assert "ViT reads images" in vit_incompatibility(ModelSpec(vocab_size=50, d_model=32, n_layers=2, heads=[4, 4]))
    with pytest.raises(HeadwiseError, match="hidden_act"):
        spec_from_vit_config(transformers.ViTConfig(hidden_act="silu", num_labels=3))
    with pytest.raises(HeadwiseError, match="not square"):
        spec_from_vit_config(transformers.ViTConfig(image_size=[32, 16], patch_size=4, num_labels=3))
