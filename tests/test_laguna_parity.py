"""headwise's Llama-style block with per-layer query heads and the softplus output gate against
``transformers``' ``LagunaForCausalLM`` with dense MLPs: random weights copied one to one, logits
within 1e-5 in float32, greedy generation with the KV cache giving the same tokens; the way back
from Laguna; exact parameter counts for the gate; what Laguna cannot express refused with the rule."""

from __future__ import annotations

import random

import pytest
import torch

from headwise.errors import HeadwiseError
from headwise.hf.laguna import from_hf, incompatibility, spec_from_config, to_config, to_hf
from headwise.model import Transformer
from headwise.params import count_params
from headwise.spec import ModelSpec
from decoder_parity import assert_logits_match, assert_same_greedy_tokens, perturbed
from helpers import one_thread  # noqa: F401  (one torch thread for this module)

transformers = pytest.importorskip("transformers", reason="transformers is the parity reference (pip install .[dev])")
if not hasattr(transformers, "LagunaForCausalLM"):
    pytest.skip("this transformers has no Laguna (transformers >= 5.x)", allow_module_level=True)

VOCAB = 97
#: a small Laguna: 3 layers of 8-wide heads over d_model 32, 2 KV heads, q/k norms, SwiGLU 32 -> 48
LAGUNA_STYLE = dict(vocab_size=VOCAB, d_model=32, n_layers=3, heads=[4, 6, 2], head_dim=8, kv_heads=2,
                    max_seq_len=64, mlp_hidden=96, activation="swiglu", norm="rmsnorm_pre", layer_norm_eps=1e-6,
                    positions="rope", rope_theta=500.0, score_scale="inv_sqrt", qk_norm="rmsnorm",
                    output_gate="softplus_head", qkv_bias=False, out_bias=False, mlp_bias=False)
CASES = {
    "per-layer-query-heads-per-head-gate": dict(),
    "per-element-gate-untied-partial-rotary": dict(output_gate="softplus_element", tie_embeddings=False,
                                                   partial_rotary_factor=0.5),
    "mqa-biases": dict(kv_heads=1, heads=[2, 4, 3], qkv_bias=True, out_bias=True),
    # window 6 < T: the sliding-window layer really cuts keys off, in the forward and when decoding
    "sliding-window": dict(attention=["local", "global", "local"], window=6),
}


def _pair(name: str) -> tuple[Transformer, torch.nn.Module]:
    torch.manual_seed(0)
    ours = Transformer(ModelSpec(**{**LAGUNA_STYLE, **CASES[name]})).eval()
    perturbed(ours, seed=1)
    theirs = to_hf(ours)
    return ours, theirs


@pytest.mark.parametrize("name", list(CASES))
def test_logits_match(name):
    assert_logits_match(name, *_pair(name), VOCAB)


@pytest.mark.parametrize("name", list(CASES))
def test_cached_greedy_generation_matches(name):
    assert_same_greedy_tokens(*_pair(name))


@pytest.mark.parametrize("name", ["per-layer-query-heads-per-head-gate", "per-element-gate-untied-partial-rotary"])
def test_conversion_from_transformers(name):
    spec = ModelSpec(**{**LAGUNA_STYLE, **CASES[name]})
    hf = transformers.LagunaForCausalLM(to_config(spec)).eval()
    perturbed(hf, seed=3)
    ours = from_hf(hf)
    assert ours.spec.heads == spec.heads and ours.spec.output_gate == spec.output_gate
    assert ours.spec.partial_rotary_factor == spec.partial_rotary_factor
    x = torch.randint(0, VOCAB, (2, 33), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert (ours(x) - hf(x).logits).abs().max().item() < 1e-5


def test_laguna_configs_headwise_cannot_read_are_refused():
    spec = ModelSpec(**LAGUNA_STYLE)
    config = to_config(spec)
    config.mlp_layer_types = ["dense", "sparse", "sparse"]
    with pytest.raises(HeadwiseError, match=r"layers \[1, 2\] are mixture-of-experts"):
        spec_from_config(config)
    config = to_config(spec.model_copy(update={"attention": ["local", "global", "global"], "window": 4}))
    config.rope_parameters["sliding_attention"]["partial_rotary_factor"] = 0.5
    with pytest.raises(HeadwiseError, match="different RoPE"):
        spec_from_config(config)


@pytest.mark.parametrize(("fields", "needle"), [
    (dict(kv_heads=[2, 2, 1]), "different key/value heads"),
    (dict(head_dim=[8, 8, 4]), "different head widths"),
    (dict(output_gate=None), "output_gate = None"),
    (dict(qk_norm=None), "qk_norm"),
    (dict(mlp_bias=True), "mlp_bias"),
    (dict(out_bias=True), "attention_bias"),
    (dict(positions="learned", rope_theta=10000.0), "positions"),
])
def test_what_laguna_cannot_express_is_refused_with_the_reason(fields, needle):
    spec = ModelSpec(**{**LAGUNA_STYLE, **fields})
    assert needle in incompatibility(spec)
    with pytest.raises(HeadwiseError, match="cannot convert to Laguna"):
        to_config(spec)


def test_gate_counts_are_exact():
    # headwise.params against the built model, with either gate mixed with the other options
    rng = random.Random(0)
    for _ in range(40):
        n = rng.randint(1, 3)
        heads = [rng.choice([1, 2, 4]) for _ in range(n)]
        spec = ModelSpec(
            vocab_size=rng.randint(5, 40), d_model=12, n_layers=n, heads=heads, head_dim=rng.choice([2, 4]),
            kv_heads=rng.choice([None, 1]), max_seq_len=8, norm=rng.choice(["rmsnorm_pre", "layernorm_pre"]),
            activation=rng.choice(["swiglu", "gelu"]), mlp_hidden=2 * rng.randint(1, 12),
            positions=rng.choice(["rope", "learned"]), qk_norm=rng.choice([None, "rmsnorm"]),
            output_gate=rng.choice([None, "softplus_head", "softplus_element"]),
            attention=rng.choice(["global", "local"]), window=3, tie_embeddings=rng.random() < 0.5,
        )
        assert count_params(spec) == Transformer(spec).num_params(), spec
