"""headwise's layer-wise scaling against Apple's OpenELM (per-layer query and key/value heads and FFN
widths, computed by the independent reference in tests/parity_openelm.py): the four OpenELM sizes,
corenet's own rounding at other depths (numpy's, recorded from corenet's code), the
``openelm-270m`` preset's exact parameter count, ``headwise plan``, a run config asking for the
scheme, the hub's ``config.json``, and the names of the output layer and q/k norms in corenet's and
the hub's state dicts. The weights, logits and cached generation against the reference are rows of
tests/test_parity.py."""

import numpy as np
import pytest
import torch

from headwise.cli import main
from headwise.errors import HeadwiseError
from headwise.hf.openelm import OPENELM, from_state_dict, to_state_dict
from headwise.model import Transformer
from headwise.params import count_params
from headwise.plans import layerwise_scaling, make_divisible, plan_heads, ramp
from headwise.presets import spec_from_preset
from headwise.tasks.base import TaskShape
from headwise.train.config import ModelConfig, resolve_spec
from parity_openelm import CONFIGS, OPENELM_SIZES, SMALL, OpenELM, _make_divisible, reference_shapes, size_shapes

#: the 270M model's heads per layer: 12 query heads over 3 KV heads for 5 layers, then 16 / 4 and 20 / 5
HEADS_270M, KV_HEADS_270M = [12] * 5 + [16] * 7 + [20] * 4, [3] * 5 + [4] * 7 + [5] * 4


# corenet's own GPTConfig.__post_init__ (apple/corenet 1aa3acd1), run by
# `python tests/record_corenet.py <corenet checkout>`: the layers at depths 2 to 40 whose multiplier
# corenet rounds otherwise than Python's round() (only at 21 layers), and the query heads (width 112,
# 8-wide heads in groups of 2) of depths and query multipliers where that rounding changes some
CORENET_ROUNDING = {((0.5, 1.0), 21): {1: 0.52, 17: 0.92}, ((0.5, 4.0), 21): {13: 2.78}}
CORENET_HEADS = {(21, (0.5, 1.0)): (8, 8, 8, 8, 8, 8, 10, 10, 10, 10, 10, 10, 12, 12, 12, 12, 12, 12, 14, 14, 14),
                 (3, (0.85, 1.0)): (12, 12, 14), (5, (0.3, 1.0)): (4, 8, 10, 12, 14)}


def test_ramp_rounds_as_corenet_at_every_depth():
    for pair in ((0.5, 1.0), (0.5, 4.0)):  # OpenELM's query and FFN multipliers
        for n in range(1, 41):
            # corenet's own expression (GPTConfig.__post_init__): round() of numpy floats
            corenet = [round(v, 2) for v in np.linspace(*pair, num=n, dtype=float)]
            decimal = [round(float(v), 2) for v in np.linspace(*pair, num=n, dtype=float)]
            recorded = {i: CORENET_ROUNDING.get((pair, n), {}).get(i, d) for i, d in enumerate(decimal)}
            assert ramp(*pair, n) == corenet == list(recorded.values()), (pair, n)


def test_numpy_rounds_0_925_to_0_92_and_keeps_12_query_heads():
    # linspace(0.5, 1.0, 21)[17] is the double nearest 0.925, a little above it: Python rounds that
    # value up; numpy rounds it times 100, exactly 92.5, half to even
    assert ramp(0.5, 1.0, 21)[17] == 0.92 and round(float(np.linspace(0.5, 1.0, 21)[17]), 2) == 0.93
    # width 112, 8-wide heads in groups of 2: 0.92 * 112 = 103.04 rounds to 96 (12 heads), 0.93 to 112 (14)
    assert make_divisible(0.92 * 112, 16) == 96 and make_divisible(0.93 * 112, 16) == 112
    assert layerwise_scaling(21, 112, 8, gqa_groups=2).heads[17] == 12
    for (n, pair), heads in CORENET_HEADS.items():
        assert layerwise_scaling(n, 112, 8, qkv_multipliers=pair, gqa_groups=2).heads == heads
    # the parity table's models at width 112 (tests/test_parity.py) have corenet's heads
    assert OPENELM.spec_from_config(CONFIGS["3-layers-defaults-numpy-rounding"]).heads == [12, 12, 14]
    assert OPENELM.spec_from_config(CONFIGS["5-layers-untied-qk-norm-numpy-rounding"]).heads == [4, 8, 10, 12, 14]


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


def test_absent_fields_take_corenets_defaults_and_one_multiplier_is_not_rounded():
    # GPTConfig: normalize_qk_projections False, share_input_output_layers False
    cfg = CONFIGS["3-layers-defaults-numpy-rounding"]
    spec = OPENELM.spec_from_config(cfg)
    assert spec.qk_norm is None and not spec.tie_embeddings
    assert OPENELM.spec_from_config({**cfg, "normalize_qk_projections": False}) == spec
    # one query multiplier is used as it is (corenet rounds only a ramp's): 0.1051 * 100 = 10.51 rounds
    # to 10, 5 heads of 2; rounded to 0.11 first it would be 11 -> 12, 6 heads
    one = dict(num_transformer_layers=2, model_dim=100, head_dim=2, qkv_multipliers=0.1051, ffn_multipliers=1.0,
               ffn_dim_divisor=1, vocab_size=11)
    assert OPENELM.spec_from_config(one).heads == reference_shapes(one)["q"] == [5, 5]


def test_output_layer_and_qk_norms_are_named_as_corenet_and_the_hub_name_them():
    cfg = CONFIGS["3-layers-defaults-numpy-rounding"]
    spec = OPENELM.spec_from_config(cfg)
    model = Transformer(spec)
    corenet, hub = to_state_dict(model, prefix=""), to_state_dict(model)
    # general_gpt.py: self.classifier (untied), q_norm / k_norm only with normalize_qk_projections
    assert set(corenet) == set(OpenELM(cfg).state_dict()) and "classifier.weight" in corenet
    assert not any(k.endswith(("q_norm.weight", "k_norm.weight")) for k in corenet)
    # the hub's OpenELMForCausalLM: lm_head beside its transformer
    assert "lm_head.weight" in hub and "transformer.classifier.weight" not in hub
    for state, prefix in ((corenet, ""), (hub, "transformer.")):
        back = from_state_dict(state, spec, prefix=prefix).state_dict()
        assert all(torch.equal(w, back[k]) for k, w in model.state_dict().items())
    with pytest.raises(HeadwiseError, match="no 'classifier.weight'"):
        from_state_dict({k: w for k, w in corenet.items() if k != "classifier.weight"}, spec, prefix="")


def hub_shapes(config: dict) -> dict:
    """What the hub's ``OpenELMConfig`` (``configuration_openelm.py`` of apple/OpenELM-*) makes of a
    ``config.json``: corenet's heads, from ``qkv_multipliers`` and ``num_gqa_groups`` whatever
    ``num_query_heads`` lists, and corenet's FFN widths, where a list of one multiplier per layer
    (what the hub saves) is taken as it is."""
    ffn = config.get("ffn_multipliers", 4.0)
    if not isinstance(ffn, list) or len(ffn) == 2:
        return reference_shapes(config)
    divisor = config.get("ffn_dim_divisor", 256)
    return {**reference_shapes({**config, "ffn_multipliers": 1.0}),
            "ffn": [int(_make_divisible(m * config["model_dim"], divisor)) for m in ffn]}


def _hub_json(n: int, d: int, head_dim: int, groups: int, qkv, ffn, divisor: int) -> dict:
    """A ``config.json`` as the hub saves one: the multipliers, and the per-layer lists its
    ``__post_init__`` made of them (corenet's rounding) beside them."""
    config = dict(num_transformer_layers=n, model_dim=d, head_dim=head_dim, num_gqa_groups=groups, qkv_multipliers=qkv,
                  ffn_multipliers=ffn, ffn_dim_divisor=divisor, vocab_size=97, max_context_length=64,
                  normalize_qk_projections=True, model_type="openelm")
    shapes = reference_shapes(config)
    listed = [round(v, 2) for v in np.linspace(*ffn, num=n, dtype=float)] if isinstance(ffn, tuple) else [ffn] * n
    return {**config, "qkv_multipliers": list(qkv) if isinstance(qkv, tuple) else qkv,
            "num_query_heads": shapes["q"], "num_kv_heads": shapes["kv"], "ffn_multipliers": listed}


@pytest.mark.parametrize("n, d, head_dim, groups, qkv, ffn, divisor", [
    (21, 112, 8, 2, (0.5, 1.0), (0.5, 4.0), 16),  # corenet's numpy rounding at layers 1, 13 and 17
    (5, 112, 8, 2, (0.3, 1.0), (1.0, 3.0), 8),
    (3, 112, 8, 2, (0.85, 1.0), (0.5, 4.0), 16),
    (7, 64, 16, 1, 0.75, 2.0, 32),  # one multiplier each
    (2, 96, 16, 3, (0.5, 1.0), 1.5, 32),  # two layers of two head counts
])
def test_a_hub_config_with_per_layer_lists_reads_as_openelm_computes_it(n, d, head_dim, groups, qkv, ffn, divisor):
    config = _hub_json(n, d, head_dim, groups, qkv, ffn, divisor)
    spec, hub = OPENELM.spec_from_config(config), hub_shapes(config)
    assert [s.heads for s in spec.layers()] == hub["q"] == config["num_query_heads"]
    assert spec.kv_heads_per_layer == hub["kv"] and [s.mlp_hidden // 2 for s in spec.layers()] == hub["ffn"]
    assert [s.mlp_hidden // 2 for s in spec.layers()] == reference_shapes({**config, "ffn_multipliers": ffn})["ffn"]
    # written back, OpenELM's own code reads the same layers from it
    written = OPENELM.to_config(spec)
    assert hub_shapes(written) == hub and OPENELM.spec_from_config(written).layers() == spec.layers()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_written_configs_give_openelms_code_the_same_layers(name):
    spec = OPENELM.spec_from_config(CONFIGS[name])
    written = OPENELM.to_config(spec)
    # OpenELM computes the heads from the multipliers: the lists beside them are not what it reads
    assert hub_shapes(written) == reference_shapes(CONFIGS[name])
    assert hub_shapes({**written, "num_query_heads": None, "num_kv_heads": None}) == reference_shapes(CONFIGS[name])


def test_a_preset_and_uneven_ffn_widths_are_written_as_openelm_reads_them():
    spec = spec_from_preset("openelm-270m")
    written = OPENELM.to_config(spec)
    assert written["num_gqa_groups"] == 4 and hub_shapes(written) == size_shapes("270M")
    # two layers of one FFN width that is no 2-decimal multiplier: written as one multiplier (OpenELM
    # would round two to 1.37, giving 701)
    two = OPENELM.spec_from_config(dict(num_transformer_layers=2, model_dim=512, head_dim=64, ffn_multipliers=700 / 512,
                                        ffn_dim_divisor=1, vocab_size=97))
    written = OPENELM.to_config(two)
    assert written["ffn_multipliers"] == 700 / 512 and written["qkv_multipliers"] == 1.0
    assert hub_shapes(written) == {"q": [8, 8], "kv": [8, 8], "ffn": [700, 700]}
    assert hub_shapes({**written, "ffn_multipliers": [700 / 512] * 2})["ffn"] == [701, 701]


def test_heads_openelm_cannot_compute_and_lists_that_contradict_its_multipliers_are_refused():
    config = _hub_json(4, 64, 16, 2, (0.5, 1.5), (0.5, 4.0), 16)
    spec = OPENELM.spec_from_config(config)
    assert spec.heads == [2, 4, 6, 6]
    # a pruned layer: no ramp of two multipliers gives 2, 2, 6, 6 heads
    pruned = spec.model_copy(update={"heads": [2, 2, 6, 6], "kv_heads": [1, 1, 3, 3]})
    assert "none give these" in OPENELM.incompatibility(pruned)
    assert "none give these" in OPENELM.incompatibility(spec.model_copy(update={"kv_heads": [1, 1, 3, 2]}))
    with pytest.raises(HeadwiseError, match=r"num_query_heads \[2, 2, 6, 6\] differ from the \[2, 4, 6, 6\]"):
        OPENELM.spec_from_config({**config, "num_query_heads": [2, 2, 6, 6]})
    # lists without the multipliers (qkv_multipliers 1.0 by default): OpenELM would give 4 heads per layer
    with pytest.raises(HeadwiseError, match="num_query_heads .* differ from the \\[4, 4, 4, 4\\]"):
        OPENELM.spec_from_config({k: v for k, v in config.items() if k != "qkv_multipliers"})
    with pytest.raises(HeadwiseError, match="qkv_multipliers has 3 values"):
        OPENELM.spec_from_config({**config, "qkv_multipliers": [0.5, 1.0, 1.5]})
