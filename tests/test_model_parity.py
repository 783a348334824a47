"""headwise's model against Hugging Face GPT-Neo, plus save/load and the KV cache."""

import pytest
import torch
import torch.nn.functional as F

from headwise.errors import HeadwiseError
from headwise.hf.gpt_neo import from_hf, gpt_neo_incompatibility, to_hf
from headwise.model import SequenceTooLong, Transformer, load_pretrained, save_pretrained
from headwise.presets import spec_from_preset
from headwise.spec import ModelSpec

transformers = pytest.importorskip("transformers", reason="transformers is the parity reference (pip install -e .[dev])")

SMALL = dict(vocab_size=97, max_seq_len=64)
CONFIGS = {
    # window 8 < T = 40: local layers really cut off keys
    "glgl-window8": dict(d_model=32, n_layers=4, heads=[4] * 4, attention=["global", "local"] * 2, window=8),
    "all-local-window1": dict(d_model=24, n_layers=2, heads=[3] * 2, attention=["local"] * 2, window=1),
    "one-head-gelu": dict(d_model=16, n_layers=3, heads=[1] * 3, activation="gelu", attention=None),
    "16-heads-relu-untied-mlp40": dict(d_model=32, n_layers=2, heads=[16] * 2, activation="relu",
                                       tie_embeddings=False, mlp_hidden=40, attention=["local", "global"]),
}


def _random_weights(model: torch.nn.Module, seed: int) -> None:
    # Perturb every parameter (biases and norms too) so the comparison cannot pass on zeros/ones.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_and_loss_match_gpt_neo(name):
    torch.manual_seed(0)
    spec = spec_from_preset("blog-gpt-neo", **SMALL, **CONFIGS[name])
    ours = Transformer(spec).eval()
    _random_weights(ours, seed=1)
    theirs = to_hf(ours)
    x = torch.randint(0, 97, (3, 40))
    with torch.no_grad():
        a = ours(x)
        out = theirs(x, labels=x)
    assert (a - out.logits).abs().max().item() < 1e-5
    # HF shifts labels internally: compare with our next-token loss
    ours_loss = F.cross_entropy(a[:, :-1].reshape(-1, 97), x[:, 1:].reshape(-1))
    assert abs(ours_loss.item() - out.loss.item()) < 1e-5


@pytest.mark.parametrize("name", list(CONFIGS))
def test_conversion_from_gpt_neo(name):
    torch.manual_seed(0)
    spec = spec_from_preset("blog-gpt-neo", **SMALL, **CONFIGS[name])
    hf = transformers.GPTNeoForCausalLM(__import__("headwise.hf.gpt_neo", fromlist=["x"]).to_gpt_neo_config(spec)).eval()
    _random_weights(hf, seed=2)
    ours = from_hf(hf)
    assert ours.spec.heads == spec.heads and ours.spec.attention == [s.attention for s in spec.layers()]
    x = torch.randint(0, 97, (2, 33))
    with torch.no_grad():
        assert (ours(x) - hf(x).logits).abs().max().item() < 1e-5


@pytest.mark.parametrize("fields,needle", [
    (dict(heads=[4, 2]), "different head counts"),
    (dict(heads=[4, 4], head_dim=16), "decoupled"),
    (dict(heads=[4, 4], score_scale="inv_sqrt"), "score_scale"),
    (dict(heads=[4, 4], norm="unitnorm_post"), "norm"),
])
def test_inexpressible_specs_refuse_conversion(fields, needle):
    spec = ModelSpec(vocab_size=50, d_model=32, n_layers=2, **fields)
    assert needle in gpt_neo_incompatibility(spec)
    with pytest.raises(HeadwiseError, match="cannot convert to GPT-Neo"):
        to_hf(Transformer(spec))


def _manual_attention(x, attn, mask):
    b, t, _ = x.shape
    q, k, v = attn.qkv(x).view(b, t, 3, attn.heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    scores = (q @ k.transpose(-1, -2)) * attn.scale
    scores = scores.masked_fill(~mask, float("-inf"))
    y = scores.softmax(-1) @ v
    return attn.out(y.transpose(1, 2).reshape(b, t, attn.width))


def test_heterogeneous_layers_match_manual_attention():
    # GPT-Neo cannot express per-layer heads: check each layer against a hand-written attention.
    spec = ModelSpec(vocab_size=50, d_model=24, n_layers=3, heads=[6, 3, 1], head_dim=[2, 5, 24],
                     attention=["global", "local", "local"], window=5, score_scale="inv_sqrt")
    model = Transformer(spec).eval()
    _random_weights(model, 3)
    x = torch.randn(2, 17, 24)
    t = torch.arange(17)
    for block, kind in zip(model.blocks, spec.attention):
        mask = t[None, :] <= t[:, None]
        if kind == "local":
            mask &= t[None, :] > t[:, None] - 5
        with torch.no_grad():
            assert torch.allclose(block.attn(x), _manual_attention(x, block.attn, mask), atol=1e-5)


def test_kv_cache_matches_full_forward():
    spec = ModelSpec(vocab_size=50, d_model=24, n_layers=2, heads=[4, 2], attention=["global", "local"],
                     window=4, max_seq_len=32)
    model = Transformer(spec).eval()
    _random_weights(model, 4)
    x = torch.randint(0, 50, (2, 20))
    with torch.no_grad():
        full = model(x)
        cache = model.new_cache()
        steps = [model(x[:, :7], cache)] + [model(x[:, i:i + 1], cache) for i in range(7, 20)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)


def test_save_load_roundtrip(tmp_path):
    spec = spec_from_preset("tiny-lm", vocab_size=64, d_model=32, heads=[8, 4, 2, 1])
    model = Transformer(spec).eval()
    save_pretrained(model, tmp_path / "m")
    loaded = load_pretrained(tmp_path / "m").eval()
    assert loaded.spec == spec
    x = torch.randint(0, 64, (1, 10))
    with torch.no_grad():
        assert torch.equal(model(x), loaded(x))


def test_load_refuses_weights_of_another_spec(tmp_path):
    a = Transformer(ModelSpec(vocab_size=30, d_model=16, n_layers=2, heads=[2, 2]))
    b = Transformer(ModelSpec(vocab_size=30, d_model=16, n_layers=2, heads=[2, 2], head_dim=4))
    save_pretrained(a, tmp_path / "a")
    save_pretrained(b, tmp_path / "b")
    (tmp_path / "a" / "model.safetensors").replace(tmp_path / "b" / "model.safetensors")
    # b's manifest no longer describes the file that is there
    with pytest.raises(HeadwiseError, match="model.safetensors is damaged: .* manifest.json says"):
        load_pretrained(tmp_path / "b")
    # without a manifest (a folder assembled by hand), the weights are checked against the spec
    (tmp_path / "b" / "manifest.json").unlink()
    with pytest.raises(HeadwiseError, match="does not match"):
        load_pretrained(tmp_path / "b")


def test_init_is_gpt_neo():
    spec = spec_from_preset("blog-gpt-neo", d_model=256, n_layers=2, heads=[4, 4], vocab_size=4000, attention=None)
    model = Transformer(spec)
    w = model.blocks[0].mlp.fc.weight
    assert abs(w.std().item() - 0.02) < 1e-3 and abs(w.mean().item()) < 1e-3
    assert model.blocks[0].attn.out.bias.abs().max().item() == 0
    assert torch.equal(model.blocks[1].norm1.weight, torch.ones(256))
    assert model.lm_head.weight is model.tok_emb.weight


def test_too_long_input_is_refused():
    model = Transformer(ModelSpec(vocab_size=10, d_model=8, n_layers=1, heads=[2], max_seq_len=4))
    with pytest.raises(SequenceTooLong, match="longer than the model's max_seq_len 4"):
        model(torch.zeros(1, 5, dtype=torch.long))
