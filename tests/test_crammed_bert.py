"""Crammed BERT as options of headwise's blocks: gated GELU, scaled sinusoidal positions, the
embedding LayerNorm, the masked-LM head and loss, and the presets' exact parameter counts.

The references are the formulas of cramming (``cramming/architectures/crammed_bert.py``,
``components.py``, ``embeddings.py``) written out here in plain torch, torch's own
``F.cross_entropy(ignore_index=-100)``, hand-computed values, and the parameter arithmetic of the
issue 25 research brief.
"""

import math

import pytest
import torch
import torch.nn.functional as F

import headwise.model.outputs as heads_module
from headwise.errors import HeadwiseError
from headwise.families.encoder.model import MASKED_LM_PAD_ID
from headwise.hf.gpt_neo import GPT_NEO
from headwise.hf.vit import VIT
from headwise.model import Transformer, load_pretrained, save_pretrained
from headwise.model.features import ACTIVATIONS
from headwise.model.feature_modules import ScaledSinusoid
from headwise.model.loss import masked_lm_loss
from headwise.params import count_params, param_breakdown
from headwise.presets import spec_from_preset
from headwise.spec import ModelSpec
from headwise.text.masked_vocab import PAD_ID

V, D, I = 32768, 768, 3072  # cramming's vocabulary, width and intermediate size


def _brief_count(layers: int) -> int:
    """The brief's arithmetic: word embedding, position scale, embedding LN, per-layer (two LNs,
    qkv, out, GLU in 3,072 and out from 1,536), final LN; the tied decoder adds nothing."""
    per_layer = 4 * D + D * 3 * D + D * D + D * I + (I // 2) * D
    assert per_layer == 5_901_312
    return V * D + 1 + 2 * D + layers * per_layer + 2 * D


@pytest.mark.parametrize("name,layers,heads,head_dim,expected,paper", [
    ("crammed-bert", 16, 12, 64, 119_589_889, 119),
    ("crammed-bert-leaner", 10, 24, 32, 84_182_017, 84),
])
def test_presets_have_the_brief_s_exact_counts(name, layers, heads, head_dim, expected, paper):
    spec = spec_from_preset(name)
    assert (spec.n_layers, spec.heads, spec.head_dims) == (layers, [heads] * layers, [head_dim] * layers)
    assert _brief_count(layers) == expected == count_params(spec)
    with torch.device("meta"):  # the built model, without 480 MB of weights
        assert Transformer(spec).num_params() == expected
    # the paper's 119M / 84M are the counts truncated to millions (rounding would give 120M)
    assert expected // 10**6 == paper
    parts = param_breakdown(spec)
    assert parts["token_embedding"] == V * D and parts["position_embedding"] == 1
    assert parts["embedding_norm"] == parts["final_norm"] == 1_536 and parts["lm_head"] == 0
    assert {parts[f"block_{i}"] for i in range(layers)} == {5_901_312}


def test_leaner_is_29_percent_smaller_and_the_tiny_preset_is_cpu_sized():
    big, lean = (count_params(spec_from_preset(n)) for n in ("crammed-bert", "crammed-bert-leaner"))
    assert big - lean == 6 * 5_901_312 and math.floor(100 * (1 - lean / big)) == 29
    tiny = spec_from_preset("crammed-bert-tiny")
    d, v = 128, 4096
    per_layer = 4 * d + 3 * d * d + d * d + d * 512 + 256 * d
    assert count_params(tiny) == Transformer(tiny).num_params() == v * d + 1 + 2 * d + 4 * per_layer + 2 * d == 1_182_209


def test_gated_gelu_gates_with_the_second_half():
    value, gate = torch.tensor([2.0, -3.0]), torch.tensor([1.0, 0.0])
    geglu = ACTIVATIONS["geglu"]
    # gelu(1) = Phi(1) = 0.841344746..., gelu(0) = 0: cramming's GELU(gate) * x, x the first half
    torch.testing.assert_close(geglu(torch.cat([value, gate])), torch.tensor([2 * 0.8413447460685429, 0.0]))
    assert not torch.allclose(geglu(torch.cat([gate, value])), geglu(torch.cat([value, gate])))


def test_scaled_sinusoid_hand_values_and_only_its_scalar_is_saved():
    pos = ScaledSinusoid(max_seq_len=3, d_model=4)
    assert pos.scale.item() == 0.5  # 1 / sqrt(4)
    # d = 4: frequencies 1 and 10000^(-2/4) = 1/100; row p = [sin p, cos p, sin p/100, cos p/100]
    row = torch.tensor([math.sin(2), math.cos(2), math.sin(0.02), math.cos(0.02)])
    torch.testing.assert_close(pos(torch.tensor([2])), 0.5 * row[None])
    torch.testing.assert_close(pos(torch.tensor([0])), torch.tensor([[0.0, 0.5, 0.0, 0.5]]))
    assert list(pos.state_dict()) == ["scale"]


def _layer_norm(x, norm, eps):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * norm.weight + norm.bias


def _reference(model: Transformer, ids: torch.Tensor) -> torch.Tensor:
    """cramming's encoder and MLM decoder from the formulas, one head at a time, with the model's
    weights (headwise's fused qkv rows are [q | k | v], each heads x head_dim)."""
    spec, eps = model.spec, 1e-12
    t, d = ids.shape[1], spec.d_model
    pe = torch.zeros(t, d, dtype=torch.float64)
    for p in range(t):
        for i in range(d // 2):
            angle = p / 10000 ** (2 * i / d)
            pe[p, 2 * i], pe[p, 2 * i + 1] = math.sin(angle), math.cos(angle)
    x = model.tok_emb.weight[ids] + model.pos_emb.scale * pe
    x = _layer_norm(x, model.emb_norm, eps)
    for block in model.blocks:
        h = _layer_norm(x, block.norm1, eps)
        q, k, v = (h @ w.T for w in block.attn.qkv.weight.chunk(3, dim=0))
        hd = d // spec.heads[0]
        heads = []
        for j in range(spec.heads[0]):
            cols = slice(j * hd, (j + 1) * hd)
            scores = q[..., cols] @ k[..., cols].transpose(-1, -2) / math.sqrt(hd)  # no mask: both ways
            heads.append(torch.softmax(scores, dim=-1) @ v[..., cols])
        x = x + torch.cat(heads, dim=-1) @ block.attn.out.weight.T
        u = _layer_norm(x, block.norm2, eps) @ block.mlp.fc.weight.T
        half = u.shape[-1] // 2
        value, gate = u[..., :half], u[..., half:]
        glu = 0.5 * gate * (1 + torch.erf(gate / math.sqrt(2))) * value
        x = x + glu @ block.mlp.proj.weight.T
    return _layer_norm(x, model.norm_f, eps) @ model.tok_emb.weight.T


def _tiny(**overrides) -> Transformer:
    fields = {"vocab_size": 50, "d_model": 16, "mlp_hidden": 48, "n_layers": 1, "heads": [2], "max_seq_len": 12}
    spec = spec_from_preset("crammed-bert-tiny", **{**fields, **overrides})
    torch.manual_seed(0)
    model = Transformer(spec).double()
    with torch.no_grad():  # LayerNorms and the position scale away from their initial 1, 0, 1/sqrt(d),
        for name, p in model.named_parameters():  # and block weights large enough to matter
            if "norm" in name or name == "pos_emb.scale":
                p.add_(torch.randn_like(p) * 0.3)
            elif name.startswith("blocks."):
                p.normal_(0.0, 0.3)
    return model.eval()


@pytest.mark.parametrize("layers,heads", [(1, [2]), (2, [4, 4])])
def test_the_model_is_cramming_s_formulas(layers, heads):
    model = _tiny(n_layers=layers, heads=heads)
    assert not any(name.endswith("bias") and "norm" not in name for name, _ in model.named_parameters())
    ids = torch.randint(0, 50, (3, 12))
    with torch.no_grad():
        # the model is float64 but its fixed sinusoid table was made in float32, as cramming's:
        # its angles and sines are good to ~1e-7, which the logits inherit at ~1e-8
        torch.testing.assert_close(model(ids), _reference(model, ids), rtol=0, atol=1e-7)


def test_masked_lm_loss_is_cross_entropy_over_the_masked_positions_alone(monkeypatch):
    model = _tiny()
    torch.manual_seed(1)
    ids = torch.randint(0, 50, (4, 12))
    labels = torch.full_like(ids, -100)
    masked = torch.rand(4, 12) < 0.25
    masked[0, 0] = True
    labels[masked] = torch.randint(0, 50, (int(masked.sum()),))
    reference = F.cross_entropy(model(ids).flatten(0, 1), labels.flatten(), ignore_index=-100)
    reference.backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    decoded = []
    real = heads_module.padded_logits
    monkeypatch.setattr(heads_module, "padded_logits", lambda h, w: decoded.append(h.shape) or real(h, w))
    loss = masked_lm_loss(model, ids, labels)
    assert decoded == [(int(masked.sum()), 16)]  # only the masked rows reach the decoder
    torch.testing.assert_close(loss, reference.float(), rtol=0, atol=1e-6)
    loss.backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-5, atol=1e-8, msg=name)


def test_the_pad_row_starts_at_zero_and_the_lookup_gives_it_no_gradient():
    """cramming's ``nn.Embedding(..., padding_idx=pad_token_id)``: [PAD]'s row (0) is zero at
    init, in the tied decoder too, and the lookup adds nothing to its gradient; every other weight
    is drawn as without it (a decoder LM of the same shapes, same seed)."""
    fields = {"vocab_size": 50, "d_model": 16, "mlp_hidden": 48, "n_layers": 1, "heads": [2], "max_seq_len": 12}
    torch.manual_seed(0)
    model = Transformer(spec_from_preset("crammed-bert-tiny", **fields))
    torch.manual_seed(0)
    plain = Transformer(spec_from_preset("crammed-bert-tiny", **fields, outputs="lm"))
    assert model.tok_emb.padding_idx == 0 and plain.tok_emb.padding_idx is None
    assert model.lm_head.weight is model.tok_emb.weight and not model.tok_emb.weight[0].any()
    for (name, p), q in zip(model.named_parameters(), plain.parameters(), strict=True):
        expected = q.detach().clone()
        if name == "tok_emb.weight":
            expected[0] = 0
        assert torch.equal(p, expected), name
    ids = torch.tensor([[1, 7, 0, 0], [1, 5, 6, 0]])
    untied = Transformer(spec_from_preset("crammed-bert-tiny", **fields, tie_embeddings=False))
    untied(ids).sum().backward()
    grad = untied.tok_emb.weight.grad
    assert not grad[0].any() and grad[7].any()
    model(ids).sum().backward()  # tied: the decoder's gradient still reaches the row, as in cramming
    assert model.tok_emb.weight.grad[0].any()
    # the fine-tuning pooler keeps its spec's pad_id; other heads (an LRA classifier's) have no such row
    glue = spec_from_preset("crammed-bert-tiny", **fields, outputs="cls_pooler", num_classes=2, pad_id=0)
    lra = spec_from_preset("crammed-bert-tiny", **fields, outputs="classes", num_classes=2, pad_id=0)
    assert Transformer(glue).tok_emb.padding_idx == 0 and Transformer(lra).tok_emb.padding_idx is None
    assert Transformer(spec_from_preset("crammed-bert-tiny", **fields, pad_id=5)).tok_emb.padding_idx == 5
    assert MASKED_LM_PAD_ID == PAD_ID


def test_saved_and_loaded_encoder_computes_the_same(tmp_path):
    model = _tiny().float()
    save_pretrained(model, tmp_path / "m")
    loaded = load_pretrained(tmp_path / "m").eval()
    assert loaded.spec == model.spec
    ids = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        assert torch.equal(loaded(ids), model(ids))


def test_existing_specs_save_and_build_as_before():
    spec = ModelSpec(d_model=8, n_layers=1, heads=[2])
    assert "embedding_norm" not in spec.to_dict() and spec.positions == "learned" and spec.activation == "gelu_new"
    model = Transformer(spec)
    assert isinstance(model.emb_norm, torch.nn.Identity) and "embedding_norm" not in param_breakdown(spec)
    assert model.blocks[0].mlp.proj.in_features == 32


@pytest.mark.parametrize("fields,needle", [
    (dict(outputs="mlm", causal=True), "outputs = 'mlm' needs causal = false: set causal = false"),
    (dict(inputs="vectors", outputs="mlm", causal=False), "outputs = 'mlm' needs token inputs with a vocab_size"),
    (dict(activation="geglu", mlp_hidden=[64, 63]), "layer 1: mlp_hidden = 63 is odd; activation = 'geglu'"),
    (dict(positions="scaled_sinusoid", d_model=15, heads=[3, 3]), "d_model 15 must be even"),
    (dict(positions="sinusoid"), "positions"),
    (dict(embedding_norm="rmsnorm"), "embedding_norm"),
])
def test_bad_encoder_options_are_refused_in_one_line(fields, needle):
    with pytest.raises(HeadwiseError) as exc:
        ModelSpec.parse({"d_model": 16, "n_layers": 2, "heads": [2, 2], **fields}, source="spec")
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_transformers_classes_refuse_what_they_cannot_express():
    assert "outputs = 'mlm'" in GPT_NEO.incompatibility(spec_from_preset("crammed-bert"))
    lm = ModelSpec(d_model=16, n_layers=1, heads=[2])
    assert "gated" in GPT_NEO.incompatibility(lm.model_copy(update={"activation": "geglu"}))
    assert "embedding_norm" in GPT_NEO.incompatibility(lm.model_copy(update={"embedding_norm": "layernorm"}))
    assert "scaled_sinusoid" in GPT_NEO.incompatibility(lm.model_copy(update={"positions": "scaled_sinusoid"}))
    vit = spec_from_preset("vit-tiny-28")
    assert VIT.incompatibility(vit) is None
    assert "embedding_norm" in VIT.incompatibility(vit.model_copy(update={"embedding_norm": "layernorm"}))
