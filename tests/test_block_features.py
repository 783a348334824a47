"""The block features' records (:mod:`headwise.model.features`): each setting's parameter count is
what its built module holds, its activation is what torch's formula and ``transformers``' ACT2FN
(under its ``hidden_act``) compute, and the spec's settings and RoPE's options are the records'."""

from __future__ import annotations

import math
import subprocess
import sys
import typing

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from headwise.model.features import ACTIVATIONS, EMBEDDING_NORMS, NORMS, OUTPUT_GATES, POSITIONS, QK_NORMS
from headwise.model.rotary import Rotary
from headwise.model.feature_modules import UnitNorm
from headwise.model.transformer import Transformer
from headwise.spec import READ_ONLY_WITH, ModelSpec

SPEC = ModelSpec(d_model=12, n_layers=2, heads=[2, 3], vocab_size=11, max_seq_len=7, layer_norm_eps=1e-3)


def _numel(module: nn.Module | None) -> int:
    return 0 if module is None else sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("records, name, cls, count, pre", [
    (NORMS, "layernorm_pre", nn.LayerNorm, 2 * 12, True),  # weight and bias
    (NORMS, "rmsnorm_pre", nn.RMSNorm, 12, True),  # a weight
    (NORMS, "unitnorm_post", UnitNorm, 1, False),  # one scalar, after the residual
    (QK_NORMS, "rmsnorm", nn.RMSNorm, 12, True),
    (EMBEDDING_NORMS, "layernorm", nn.LayerNorm, 2 * 12, True),
])
def test_a_norm_counts_what_it_builds(records, name, cls, count, pre):
    norm = records[name]
    module = norm.build(SPEC, 12)
    assert type(module) is cls and norm.params(12) == _numel(module) == count and norm.pre is pre
    assert getattr(module, "eps", 1e-3) == 1e-3


@pytest.mark.parametrize("name, count", [("learned", 7 * 12), ("none", 0), ("scaled_sinusoid", 1), ("rope", 0)])
def test_positions_count_what_they_add_and_only_rope_rotates(name, count):
    positions = POSITIONS[name]
    spec = SPEC.model_copy(update={"positions": name, "partial_rotary_factor": 0.5 if name == "rope" else 1.0})
    assert positions.params(spec) == _numel(positions.embedding(spec)) == count
    rotary = positions.rotary(spec, spec.layer(1))
    assert (rotary is None) is (name != "rope")
    if rotary is not None:  # half of layer 1's 4 channels per head, at the spec's theta
        assert isinstance(rotary, Rotary) and (rotary.dim, rotary.theta) == (2, 10000.0)


def test_gates_count_their_projection():
    # d_model 12 -> one gate per head (2, then 3), or one per channel (12 in either layer)
    for name, per_layer in (("softplus_head", [12 * 2, 12 * 3]), ("softplus_element", [12 * 12, 12 * 12])):
        model = Transformer(SPEC.model_copy(update={"output_gate": name}))
        assert [_numel(b.attn.gate) for b in model.blocks] == per_layer
        assert [OUTPUT_GATES[name].params(SPEC, s) for s in SPEC.layers()] == per_layer


def _tanh_gelu(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def test_activations_compute_their_formulas():
    x = torch.linspace(-3, 3, 8)
    value, gate = x[:4], x[4:]
    expected = {"gelu_new": _tanh_gelu(x), "gelu": 0.5 * x * (1 + torch.erf(x / math.sqrt(2))), "relu": x.clamp(min=0),
                # the value in the first half, the gate in the second
                "geglu": value * 0.5 * gate * (1 + torch.erf(gate / math.sqrt(2))),
                "swiglu": value * gate * torch.sigmoid(gate)}
    assert set(expected) == set(ACTIVATIONS)
    for name, want in expected.items():
        torch.testing.assert_close(ACTIVATIONS[name](x), want)
        assert ACTIVATIONS[name].gated is (name in ("geglu", "swiglu"))


def test_hidden_act_names_what_transformers_computes():
    from transformers.activations import ACT2FN

    x = torch.randn(64)
    named = {name: a for name, a in ACTIVATIONS.items() if a.hidden_act is not None}
    assert sorted(named) == ["gelu", "gelu_new", "relu"]  # the gated ones are no transformers hidden_act
    for a in named.values():
        torch.testing.assert_close(a(x), ACT2FN[a.hidden_act](x))
    assert not torch.allclose(ACTIVATIONS["gelu"](x), F.gelu(x, approximate="tanh"))  # the two GELUs differ


def test_the_spec_settings_and_options_are_the_records():
    settings = {"norm": NORMS, "positions": POSITIONS, "activation": ACTIVATIONS, "qk_norm": QK_NORMS,
                "output_gate": OUTPUT_GATES, "embedding_norm": EMBEDDING_NORMS}
    for field, records in settings.items():
        names = tuple(a for a in typing.get_args(ModelSpec.model_fields[field].annotation) if a is not type(None))
        names = typing.get_args(names[0]) if len(names) == 1 else names  # `Literal[...] | None`
        assert names == tuple(records), field
    assert READ_ONLY_WITH == {"rope_theta": ("positions", "rope"), "partial_rotary_factor": ("positions", "rope")}
    assert ModelSpec.model_fields["rope_theta"].default == 10000.0
    assert ModelSpec.model_fields["partial_rotary_factor"].default == 1.0


def test_the_records_load_no_torch():
    code = "import sys, headwise.model.features, headwise.spec; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_an_exported_model_carries_the_records():
    from headwise.hf.export import bundled_sources

    spec = SPEC.model_copy(update={"norm": "rmsnorm_pre", "positions": "rope", "activation": "swiglu"})
    sources = bundled_sources(Transformer(spec))
    assert "features.py" in sources and "from .attention import Option" in sources["features.py"]
    assert "GATED_ACTIVATIONS" not in sources["spec_view.py"]  # no copy of what the records say
