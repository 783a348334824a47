"""What the parity table (tests/test_parity.py) leaves to headwise's own model: layers GPT-Neo
cannot express against a hand-written attention, the KV cache against the full forward, save and
load, GPT-Neo's initialisation, RoPE layers kept in place, exact parameter counts over random
specs, and a Llama preset trained from a config and exported."""

import random

import pytest
import torch

from headwise.errors import HeadwiseError
from headwise.model import SequenceTooLong, Transformer, load_pretrained, save_pretrained
from headwise.params import count_params
from headwise.presets import spec_from_preset
from headwise.spec import ModelSpec
from decoder_parity import perturbed
from helpers import one_thread  # noqa: F401  (one torch thread for this module)

#: llama-tiny in small: 3 layers of 4 query heads of 8 over 2 KV heads, RoPE, SwiGLU
LLAMA_SMALL = dict(vocab_size=97, d_model=32, n_layers=3, heads=[4] * 3, max_seq_len=64, mlp_hidden=96)


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
    perturbed(model, 3, scale=0.1)
    x = torch.randn(2, 17, 24)
    t = torch.arange(17)
    for block, kind in zip(model.blocks, spec.attention):
        mask = t[None, :] <= t[:, None]
        if kind == "local":
            mask &= t[None, :] > t[:, None] - 5
        with torch.no_grad():
            assert torch.allclose(block.attn(x), _manual_attention(x, block.attn, mask), atol=1e-5)


@pytest.mark.parametrize("spec", [
    ModelSpec(vocab_size=50, d_model=24, n_layers=2, heads=[4, 2], attention=["global", "local"], window=4,
              max_seq_len=32),
    # grouped-query attention: the cache holds each layer's 2 key/value heads alone
    spec_from_preset("llama-tiny", **LLAMA_SMALL),
], ids=["local-window4", "llama-gqa"])
def test_kv_cache_matches_full_forward(spec):
    model = Transformer(spec).eval()
    perturbed(model, 4, scale=0.1)
    x = torch.randint(0, 50, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(x)
        cache = model.new_cache()
        steps = [model(x[:, :7], cache), model(x[:, 7:12], cache)] + [model(x[:, i:i + 1], cache) for i in range(12, 20)]
    assert (torch.cat(steps, dim=1) - full).abs().max().item() < 1e-5
    assert [tuple(layer.k.shape) for layer in cache.layers] == [(2, s.kv_heads or s.heads, 20, s.head_dim)
                                                                for s in spec.layers()]


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


def test_a_rope_layer_is_not_reorderable():
    # the masked LM's shortcut reorders positions before the last block: RoPE would see them moved
    spec = spec_from_preset("llama-tiny", **LLAMA_SMALL, causal=False, outputs="mlm", pad_id=0)
    assert not any(block.attn.reorderable for block in Transformer(spec).blocks)
    assert all(block.attn.reorderable for block in Transformer(spec.model_copy(update={"positions": "learned"})).blocks)


def test_counts_are_exact_across_the_options():
    # headwise.params against the built model, with grouped KV heads (one count or per layer), q/k
    # norms, output gates, RMSNorm, SwiGLU, RoPE, local layers and bias-free projections mixed
    rng = random.Random(0)
    for _ in range(100):
        n = rng.randint(1, 3)
        heads = [rng.choice([1, 2, 4, 6]) for _ in range(n)]
        kv = rng.choice([None, 1, [rng.choice([k for k in (1, 2, 3, 6) if h % k == 0]) for h in heads]])
        spec = ModelSpec(
            vocab_size=rng.randint(5, 40), d_model=12, n_layers=n, heads=heads, head_dim=rng.choice([2, 4, [4] * n]),
            kv_heads=kv, max_seq_len=8, norm=rng.choice(["rmsnorm_pre", "layernorm_pre", "unitnorm_post"]),
            activation=rng.choice(["swiglu", "gelu"]), mlp_hidden=2 * rng.randint(1, 12),
            positions=rng.choice(["rope", "learned"]), qk_norm=rng.choice([None, "rmsnorm"]),
            output_gate=rng.choice([None, "softplus_head", "softplus_element"]),
            attention=rng.choice(["global", "local"]), window=3, qkv_bias=rng.random() < 0.5,
            out_bias=rng.random() < 0.5, mlp_bias=rng.random() < 0.5, tie_embeddings=rng.random() < 0.5,
        )
        assert count_params(spec) == Transformer(spec).num_params(), spec


def test_a_llama_preset_trains_from_a_config_and_exports(tmp_path, monkeypatch):
    # the exported folder carries the rotary code with the rest and loads where headwise is not importable
    pytest.importorskip("transformers", reason="the exported folder is loaded with transformers")
    from conftest import REPO, shared_data_dir
    from headwise.cli import main
    from headwise.train.generate import load_run_model
    from test_hf_export import FRESH_PROCESS, _fresh_process

    monkeypatch.setenv("HEADWISE_DATA", str(shared_data_dir()))
    monkeypatch.setenv("HEADWISE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    assert main(["train", str(REPO / "configs" / "lm-tiny.toml"), "--out", str(out), "--set", "model.preset=llama-tiny",
                 "--set", "task.tokenizer=bpe:300", "--set", "train.steps=2", "--set", "eval.every=0",
                 "--set", "checkpoint.every=0", "--set", "task.subset=200"]) == 0
    saved = (out / "config.toml").read_text()
    assert 'positions = "rope"' in saved and "kv_heads = 2" in saved and 'activation = "swiglu"' in saved
    # --native none: headwise's own class (--native auto would write LlamaForCausalLM: test_native_export.py)
    assert main(["export", str(out), "--hf", str(tmp_path / "export"), "--native", "none"]) == 0
    assert (tmp_path / "export" / "rotary.py").is_file()
    got = _fresh_process(FRESH_PROCESS, tmp_path, str(tmp_path / "export"), "Once upon a time")
    model, _ = load_run_model(out)
    with torch.no_grad():
        expected = model(torch.arange(100).view(1, 100) % model.spec.vocab_size)[0]
    assert torch.equal(torch.tensor(got["logits"]), expected)
