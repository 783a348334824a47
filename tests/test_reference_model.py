"""headwise's Transformer against a reference model written from the definitions
(``tests/reference_model.py``: plain matmuls and softmax in float64 over the same state dict), for
a table of attention layouts: its float32 logits, of a whole sequence and decoded one position at a
time through the KV cache, equal the reference's."""

import pytest
import torch

from headwise.model import Transformer
from headwise.spec import ModelSpec
from helpers import one_thread  # noqa: F401  (one torch thread for this module)
from reference_model import logits as reference_logits

BASE = dict(vocab_size=61, max_seq_len=320, d_model=32, n_layers=2, heads=[4, 4])
LLAMA = dict(norm="rmsnorm_pre", positions="rope", activation="swiglu", score_scale="inv_sqrt", qkv_bias=False,
             out_bias=False, mlp_bias=False)
SPECS = {
    "mha-causal": dict(qkv_bias=True),
    "gqa": dict(kv_heads=[2, 1], score_scale="inv_sqrt"),
    "rope": dict(**LLAMA, kv_heads=2),
    "rope-partial": dict(**LLAMA, partial_rotary_factor=0.5, rope_theta=50.0),
    "local-window": dict(attention=["local", "global"], window=3),
    "qk-norm": dict(**LLAMA, qk_norm="rmsnorm", kv_heads=[2, 4], attention=["global", "local"], window=4),
    "gate-per-head": dict(output_gate="softplus_head", kv_heads=[1, 2]),
    "gate-per-element": dict(**LLAMA, output_gate="softplus_element"),
    "per-layer-shapes": dict(n_layers=3, heads=[2, 6, 3], head_dim=[16, 4, 8], kv_heads=[1, 3, 3], positions="rope"),
    "bidirectional-padding": dict(causal=False, pad_id=0, activation="gelu", score_scale="inv_sqrt"),
}
T = {"local-window": 300}  # 300: the CPU kernel's causal queries split in halves (with heads of 8)


def _model(name):
    spec = ModelSpec(**{**BASE, **SPECS[name]})
    torch.manual_seed(0)
    model = Transformer(spec).eval()
    with torch.no_grad():  # weights far from the initialisation's, so that attention is far from uniform
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * (1.0 if p.dim() == 1 else 0.3))
    return model


@pytest.mark.parametrize("name", SPECS)
def test_logits_equal_the_reference_models(name):
    model = _model(name)
    ids = torch.randint(1, model.spec.vocab_size, (2, T.get(name, 12)), generator=torch.Generator().manual_seed(1))
    if model.spec.pad_id is not None:
        ids[1, -4:] = model.spec.pad_id
    want = reference_logits(model.spec, model.state_dict(), ids)
    with torch.no_grad():
        got = model(ids)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=2e-5 * want.abs().max().item())
    if model.spec.causal:  # the same logits decoded through the cache: a prefill, then one position at a time
        cache = model.new_cache()
        with torch.no_grad():
            steps = [model(ids[:, :5], cache)] + [model(ids[:, i : i + 1], cache) for i in range(5, 9)]
        torch.testing.assert_close(torch.cat(steps, dim=1).double(), want[:, :9], rtol=1e-5,
                                   atol=2e-5 * want.abs().max().item())
