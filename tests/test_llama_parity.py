"""headwise's Llama-style block against ``transformers``' ``LlamaForCausalLM`` and
``Qwen3ForCausalLM``: random weights copied one to one, logits within 1e-5 in float32, and
greedy generation with the KV cache giving the same tokens; the cache holds the KV heads alone."""

from __future__ import annotations

import random

import pytest
import torch

from headwise.errors import HeadwiseError
from headwise.hf.llama import LLAMA, QWEN3, from_hf, incompatibility, to_config, to_hf
from headwise.model import Transformer
from headwise.params import count_params
from headwise.spec import ModelSpec
from decoder_parity import assert_logits_match, assert_same_greedy_tokens, perturbed
from helpers import one_thread  # noqa: F401  (one torch thread for this module)

transformers = pytest.importorskip("transformers", reason="transformers is the parity reference (pip install .[dev])")

VOCAB = 97
#: a small Llama: 3 layers of 4 query heads of 8 over d_model 32, SwiGLU 32 -> 48, RoPE, RMSNorm
LLAMA_STYLE = dict(vocab_size=VOCAB, d_model=32, n_layers=3, heads=[4] * 3, max_seq_len=64, mlp_hidden=96,
                   activation="swiglu", norm="rmsnorm_pre", layer_norm_eps=1e-6, positions="rope",
                   rope_theta=500.0, score_scale="inv_sqrt", qkv_bias=False, out_bias=False, mlp_bias=False)
CASES = {
    # (architecture, spec fields over LLAMA_STYLE)
    "llama-mha-tied": (LLAMA, dict()),
    "llama-gqa-4q-2kv-untied": (LLAMA, dict(kv_heads=2, tie_embeddings=False)),
    "llama-mqa-wide-heads-biases": (LLAMA, dict(kv_heads=1, head_dim=16, qkv_bias=True, out_bias=True,
                                                mlp_bias=True)),
    "qwen3-gqa-qk-norm": (QWEN3, dict(kv_heads=2, qk_norm="rmsnorm", tie_embeddings=False)),
    # window 6 < T: the sliding-window layer really cuts keys off, in the forward and when decoding
    "qwen3-sliding-window": (QWEN3, dict(kv_heads=2, qk_norm="rmsnorm", attention=["global", "local", "global"],
                                         window=6)),
}


def _pair(name: str) -> tuple[Transformer, torch.nn.Module]:
    arch, fields = CASES[name]
    torch.manual_seed(0)
    ours = Transformer(ModelSpec(**{**LLAMA_STYLE, **fields})).eval()
    perturbed(ours, seed=1)
    theirs = to_hf(ours, arch)
    return ours, theirs


@pytest.mark.parametrize("name", list(CASES))
def test_logits_match(name):
    assert_logits_match(name, *_pair(name), VOCAB)


@pytest.mark.parametrize("name", list(CASES))
def test_cached_greedy_generation_matches(name):
    assert_same_greedy_tokens(*_pair(name))


@pytest.mark.parametrize("name", ["llama-gqa-4q-2kv-untied", "qwen3-gqa-qk-norm"])
def test_conversion_from_transformers(name):
    arch, fields = CASES[name]
    spec = ModelSpec(**{**LLAMA_STYLE, **fields})
    hf = getattr(transformers, arch.model_class)(to_config(spec, arch)).eval()
    perturbed(hf, seed=3)
    ours = from_hf(hf)
    assert ours.spec.kv_heads_per_layer == spec.kv_heads_per_layer and ours.spec.qk_norm == spec.qk_norm
    x = torch.randint(0, VOCAB, (2, 33), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert (ours(x) - hf(x).logits).abs().max().item() < 1e-5


def test_the_cache_stores_only_the_kv_heads():
    ours, _ = _pair("llama-gqa-4q-2kv-untied")
    cache = ours.new_cache()
    x = torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        prefill = ours(x[:, :7], cache)
        step = ours(x[:, 7:], cache)
        full = ours(x)
    assert [tuple(layer.k.shape) for layer in cache.layers] == [(2, 2, 12, 8)] * 3
    assert (torch.cat([prefill, step], dim=1) - full).abs().max().item() < 1e-5


def test_a_rope_layer_is_not_reorderable():
    # the masked LM's shortcut reorders positions before the last block: RoPE would see them moved
    spec = ModelSpec(**{**LLAMA_STYLE, "causal": False, "outputs": "mlm", "pad_id": 0})
    assert not any(block.attn.reorderable for block in Transformer(spec).blocks)
    assert all(block.attn.reorderable for block in Transformer(spec.model_copy(update={"positions": "learned"})).blocks)


@pytest.mark.parametrize(("fields", "needle"), [
    (dict(heads=[4, 4, 2], head_dim=8), "different heads"),
    (dict(kv_heads=[2, 2, 1]), "different key/value heads"),
    (dict(activation="geglu"), "activation"),
    (dict(positions="learned", rope_theta=10000.0), "positions"),
    (dict(partial_rotary_factor=0.5), "partial_rotary_factor"),
    (dict(qk_norm="rmsnorm"), "qk_norm"),
    (dict(out_bias=True), "attention_bias"),
    (dict(attention=["global", "local", "global"]), "local"),
])
def test_what_llama_cannot_express_is_refused_with_the_reason(fields, needle):
    spec = ModelSpec(**{**LLAMA_STYLE, **fields})
    assert needle in incompatibility(spec, LLAMA)
    with pytest.raises(HeadwiseError, match="cannot convert to Llama"):
        to_config(spec, LLAMA)


def test_training_gradients_match():
    # the backward of the fused projection and of the rotary, norm and grouped-query paths: each
    # weight's gradient is Llama's, laid out as headwise lays out the weight
    from headwise.hf.convert import copy_weights
    from headwise.hf.llama import LAYOUT

    ours, theirs = _pair("qwen3-gqa-qk-norm")
    x = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(5))
    ours.train()
    theirs.train()
    torch.nn.functional.cross_entropy(ours(x)[:, :-1].reshape(-1, VOCAB), x[:, 1:].reshape(-1)).backward()
    theirs(x, labels=x).loss.backward()
    # Llama's gradients in headwise's layout: put in place of its weights, copied across as weights are
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(p.grad)
    grads = Transformer(ours.spec)
    copy_weights(grads, theirs, LAYOUT, to_hf=False)
    for (name, p), (_, g) in zip(ours.named_parameters(), grads.named_parameters()):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-5, msg=name)


def test_a_llama_preset_trains_from_a_config_and_exports(tmp_path, monkeypatch):
    # the exported folder carries the rotary code with the rest and loads where headwise is not importable
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



def test_counts_are_exact_across_the_llama_style_options():
    # headwise.params against the built model, with grouped KV heads (one count or per layer),
    # q/k norms, RMSNorm, SwiGLU, RoPE and bias-free projections mixed with the other options
    rng = random.Random(0)
    for _ in range(60):
        n = rng.randint(1, 3)
        heads = [rng.choice([1, 2, 4, 6]) for _ in range(n)]
        kv = rng.choice([None, 1, [rng.choice([k for k in (1, 2, 3, 6) if h % k == 0]) for h in heads]])
        spec = ModelSpec(
            vocab_size=rng.randint(5, 40), d_model=12, n_layers=n, heads=heads, head_dim=rng.choice([2, 4, [4] * n]),
            kv_heads=kv, max_seq_len=8, norm=rng.choice(["rmsnorm_pre", "layernorm_pre", "unitnorm_post"]),
            activation=rng.choice(["swiglu", "gelu"]), mlp_hidden=2 * rng.randint(1, 12),
            positions=rng.choice(["rope", "learned"]), qk_norm=rng.choice([None, "rmsnorm"]),
            qkv_bias=rng.random() < 0.5, out_bias=rng.random() < 0.5, mlp_bias=rng.random() < 0.5,
            tie_embeddings=rng.random() < 0.5,
        )
        assert count_params(spec) == Transformer(spec).num_params(), spec
