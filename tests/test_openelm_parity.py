"""headwise's layer-wise scaling against Apple's OpenELM (per-layer query and key/value heads and FFN
widths, computed by the independent reference in tests/parity_openelm.py): the four OpenELM sizes,
the ``openelm-270m`` preset's exact parameter count, ``headwise plan``, a run config asking for the
scheme, and the hub's ``config.json``. The weights, logits and cached generation against the
reference are rows of tests/test_parity.py."""

import numpy as np
import pytest

from headwise.cli import main
from headwise.errors import HeadwiseError
from headwise.hf.openelm import OPENELM
from headwise.params import count_params
from headwise.plans import layerwise_scaling, plan_heads
from headwise.presets import spec_from_preset
from headwise.tasks.base import TaskShape
from headwise.train.config import ModelConfig, resolve_spec
from parity_openelm import OPENELM_SIZES, SMALL, reference_shapes, size_shapes

#: the 270M model's heads per layer: 12 query heads over 3 KV heads for 5 layers, then 16 / 4 and 20 / 5
HEADS_270M, KV_HEADS_270M = [12] * 5 + [16] * 7 + [20] * 4, [3] * 5 + [4] * 7 + [5] * 4


@pytest.mark.parametrize("size", list(OPENELM_SIZES))
def test_layerwise_scaling_is_openelms(size):
    ref, ours = size_shapes(size), layerwise_scaling(*OPENELM_SIZES[size])
    assert list(ours.heads) == ref["q"] and list(ours.kv_heads) == ref["kv"]
    assert list(ours.mlp_hidden) == [2 * f for f in ref["ffn"]]


def test_openelm_270m_shape_and_exact_parameter_count():
    spec = spec_from_preset("openelm-270m")
    assert spec.heads == HEADS_270M and spec.kv_heads_per_layer == KV_HEADS_270M
    # OpenELM's own count: tied embeddings, per layer the fused qkv_proj, out_proj, the fused
    # proj_1 (value and gate) and proj_2, two norms of d_model and the q/k norms of head_dim; a final norm
    shapes, d, hd = size_shapes("270M"), 1280, 64
    expected = 32000 * d + d + sum((q + 2 * kv) * hd * d + q * hd * d + 2 * f * d + f * d + 2 * d + 2 * hd
                                   for q, kv, f in zip(shapes["q"], shapes["kv"], shapes["ffn"]))
    assert count_params(spec) == expected == 271_527_168


def test_plan_prints_openelm_270m(capsys):
    assert main(["plan", "--scheme", "layerwise", "--layers", "16", "--d-model", "1280", "--head-dim", "64",
                 "--vocab-size", "32000"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.split() and line.split()[0].isdigit()]
    assert [int(r[1]) for r in rows] == HEADS_270M and [int(r[2]) for r in rows] == KV_HEADS_270M
    assert [int(r[5]) // 2 for r in rows] == size_shapes("270M")["ffn"]
    assert "parameters 271,527,168" in out


def test_layerwise_plan_flags_and_refusals():
    plan = plan_heads("layerwise", 4, 64, head_dim=16,
                      layerwise=dict(qkv_multipliers=(0.5, 1.5), gqa_groups=2, ffn_divisor=16))
    assert plan.heads == (2, 4, 6, 6) and plan.kv_heads == (1, 2, 3, 3)
    assert type(plan).from_dict(plan.to_dict()) == plan
    assert "kv_heads" not in plan_heads("constant", 4, 64, 8).to_dict()  # other schemes' dicts unchanged
    # the parity table's OpenELM (tests/test_parity.py) has these layers
    spec = OPENELM.spec_from_config(SMALL)
    assert spec.heads == [2, 4, 6, 6] and spec.kv_heads_per_layer == [1, 2, 3, 3]
    with pytest.raises(HeadwiseError, match="head_dim"):
        plan_heads("layerwise", 4, 64)
    with pytest.raises(HeadwiseError, match="budget"):
        plan_heads("layerwise", 4, 64, 16, head_dim=16)
    assert main(["plan", "--scheme", "constant", "--total-heads", "8", "--gqa-groups", "2"]) == 2
    assert main(["plan", "--scheme", "layerwise", "--head-dim", "16", "--kv-heads", "2"]) == 2


def test_a_run_config_asks_for_layerwise_scaling():
    shape = TaskShape(inputs="tokens", outputs="lm", vocab_size=32000, seq_len=256)
    spec, plan = resolve_spec(ModelConfig.parse({"preset": "openelm-270m", "plan": {"scheme": "layerwise"}}), shape)
    assert spec.layers() == spec_from_preset("openelm-270m").layers() and plan.kv_heads == tuple(spec.kv_heads)
    small = {"preset": "llama-tiny", "n_layers": 4, "d_model": 64, "head_dim": 16, "kv_heads": None,
             "mlp_hidden": None, "plan": {"scheme": "layerwise", "qkv_multipliers": [0.5, 1.5], "gqa_groups": 2,
                                          "ffn_divisor": 16}}
    shape = TaskShape("tokens", "lm", 97, 64)
    spec, _ = resolve_spec(ModelConfig.parse(small), shape)
    assert spec.heads == [2, 4, 6, 6] and spec.kv_heads_per_layer == [1, 2, 3, 3]
    assert [s.mlp_hidden // 2 for s in spec.layers()] == reference_shapes(SMALL)["ffn"]
    # a saved run config keeps the plan's KV heads and MLP widths beside it: equal ones resolve again
    saved = {**small, "kv_heads": [1, 2, 3, 3], "mlp_hidden": [s.mlp_hidden for s in spec.layers()]}
    assert resolve_spec(ModelConfig.parse(saved), shape)[0].layers() == spec.layers()
    with pytest.raises(HeadwiseError, match="kv_heads .* differ from the layerwise plan"):
        resolve_spec(ModelConfig.parse({**saved, "kv_heads": [1, 1, 1, 1]}), shape)
    with pytest.raises(HeadwiseError, match="applies only to scheme 'layerwise'"):
        resolve_spec(ModelConfig.parse({**small, "plan": {"scheme": "constant", "total_heads": 8, "gqa_groups": 2}}),
                     shape)


def test_the_hubs_config_json_reads_as_the_preset():
    # the hub's config.json lists every layer's heads and FFN multipliers (the rounded ramp)
    hub = dict(num_transformer_layers=16, model_dim=1280, head_dim=64, num_gqa_groups=4, ffn_dim_divisor=256,
               num_query_heads=HEADS_270M, num_kv_heads=KV_HEADS_270M,
               ffn_multipliers=[round(v, 2) for v in np.linspace(0.5, 4.0, 16)], qkv_multipliers=[0.5, 1.0],
               vocab_size=32000, max_context_length=2048, share_input_output_layers=True, rope_freq_constant=10000,
               normalize_qk_projections=True, ffn_with_glu=True, activation_fn_name="swish",
               normalization_layer_name="rms_norm", model_type="openelm")
    assert OPENELM.spec_from_config(hub).layers() == spec_from_preset("openelm-270m").layers()
    assert count_params(OPENELM.spec_from_config(hub)) == 271_527_168
