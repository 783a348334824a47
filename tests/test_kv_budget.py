"""The KV cache as a budget: :func:`headwise.params.kv_cache_bytes_per_token` against hand-computed
values (2 x KV heads x head_dim x bytes per element, summed over a causal model's layers), its lines
in ``headwise plan`` and its field in run summaries, and the ``kv-heads`` study's presets."""

from __future__ import annotations

import json

import pytest

from headwise.cli import main
from headwise.params import count_params, kv_cache_budget, kv_cache_bytes_per_token
from headwise.plans import Plan
from headwise.presets import spec_from_preset
from headwise.run.summary import RunStatus, RunSummary
from headwise.spec import ModelSpec
from headwise.study import load_study


def test_gpt_neo_blog_model_caches_every_head():
    # 4 layers x 12 heads x head_dim 64 = 768 per layer, key and value, 4 bytes: local layers
    # are counted at full context, as headwise's cache keeps them
    spec = spec_from_preset("blog-gpt-neo")
    assert kv_cache_bytes_per_token(spec) == 2 * 4 * 768 * 4 == 24_576
    assert kv_cache_bytes_per_token(spec, "bf16") == 12_288 == kv_cache_bytes_per_token(spec, "fp16")


def test_grouped_query_attention_caches_only_kv_heads():
    # llama-tiny: 4 layers, 4 query heads sharing 2 KV heads of width 32
    spec = spec_from_preset("llama-tiny")
    assert kv_cache_budget(spec) == {"fp32": 2 * 4 * 2 * 32 * 4, "bf16": 2 * 4 * 2 * 32 * 2} == {"fp32": 2048,
                                                                                                    "bf16": 1024}
    mha = spec_from_preset("llama-tiny", kv_heads=None)
    assert kv_cache_bytes_per_token(mha) == 2 * kv_cache_bytes_per_token(spec)
    per_layer = spec_from_preset("llama-tiny", kv_heads=[1, 1, 2, 4])  # the same 8 KV heads, moved
    assert kv_cache_bytes_per_token(per_layer) == kv_cache_bytes_per_token(spec)


def test_openelm_270m_per_layer_kv_heads():
    # KV heads 3 -> 5 over 16 layers (3 x 5 + 4 x 7 + 5 x 4 = 63), head_dim 64, 2 bytes in bf16
    spec = spec_from_preset("openelm-270m")
    kv = [3] * 5 + [4] * 7 + [5] * 4
    assert spec.kv_heads_per_layer == kv
    assert kv_cache_bytes_per_token(spec, "bf16") == sum(2 * k * 64 * 2 for k in kv) == 16_128
    assert kv_cache_bytes_per_token(spec, "fp32") == 32_256


def test_bidirectional_models_keep_no_cache_and_unknown_dtypes_are_refused():
    spec = spec_from_preset("blog-gpt-neo", causal=False, attention=None)
    assert kv_cache_budget(spec) == {"fp32": 0, "bf16": 0}
    with pytest.raises(ValueError, match="unknown cache dtype 'int3'"):
        kv_cache_bytes_per_token(spec_from_preset("llama-tiny"), "int3")


def test_plan_prints_the_kv_cache(capsys):
    assert main(["plan", "--d-model", "768", "--layers", "4", "--scheme", "constant", "--total-heads", "48"]) == 0
    assert "KV cache: 24,576 bytes per token (fp32), 12,288 (bf16)" in capsys.readouterr().out
    assert main(["plan", "--d-model", "128", "--layers", "4", "--scheme", "explicit", "--heads", "4,4,4,4",
                 "--head-dim", "32", "--kv-heads", "1,1,2,4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kv_cache_bytes_per_token"] == {"fp32": 2048, "bf16": 1024}


def test_run_summary_carries_the_kv_cache():
    spec = spec_from_preset("llama-tiny")
    plan = Plan.explicit((4,) * 4, (32,) * 4)
    summary = RunSummary(status=RunStatus.COMPLETED, params=count_params(spec), plan=plan,
                         kv_cache_bytes_per_token=kv_cache_budget(spec))
    back = RunSummary.from_json(summary.to_json())
    assert back.kv_cache_bytes_per_token == {"fp32": 2048, "bf16": 1024}
    bidirectional = RunSummary(status=RunStatus.RUNNING, params=1, plan=plan)
    assert bidirectional.kv_cache_bytes_per_token is None
    assert "kv_cache_bytes_per_token" not in json.loads(bidirectional.to_json())  # its summary stays as it was


def _spec(model: dict) -> ModelSpec:
    """A variant's model spec from its ``[model]`` table (a preset and its overrides)."""
    model = dict(model)
    return spec_from_preset(model.pop("preset"), **model)


@pytest.mark.parametrize("preset", ["quick", "tiny", "verdict"])
def test_kv_heads_study_presets_resolve_at_their_budgets(preset):
    study = load_study("kv-heads", preset=preset)
    assert study.preset == preset and study.preset_summary
    names = [v.name for v in study.variants]
    assert {"q4-kv2", "q4-kv-asc", "q5-kv1"} <= set(names) and len(set(names)) == len(names)
    specs = {v.name: _spec(v.config["model"]) for v in study.variants}
    base = specs["q4-kv2"]
    # moving KV heads between layers keeps the cache and the parameters; MQA 5 x 1 keeps the parameters
    assert kv_cache_bytes_per_token(specs["q4-kv-asc"]) == kv_cache_bytes_per_token(base) == 2048
    assert count_params(specs["q4-kv-asc"]) == count_params(base) == count_params(specs["q5-kv1"])
    assert kv_cache_bytes_per_token(specs["q5-kv1"]) == 1024
    if preset == "tiny":
        assert kv_cache_bytes_per_token(specs["q2-kv2"]) == 2048 and count_params(specs["q3-kv3"]) == count_params(base)
    if preset == "verdict":
        assert study.seeds == 5 and study.config.nuisance is not None
        assert {c.test for c in study.config.claims} == {"as_good", "better"}
