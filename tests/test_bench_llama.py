"""The ``llama`` and ``decode`` bench sections at a tiny size: keys, tables and targets."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("transformers")

from headwise.bench.sections import section_names  # noqa: E402
from headwise.families.lm.bench_llama import (  # noqa: E402
    LlamaSizes, bench_decode, bench_llama, decode_table, decode_targets, llama_plans, llama_table, llama_targets, ramp,
)

TINY = dataclasses.replace(LlamaSizes.quick(), d_model=64, n_layers=2, heads=4, kv_heads=2, mlp_hidden=128,
                           vocab_size=256, seq_len=16, batch=1, rounds=2, warmup=0, idle_wait=0.0,
                           contexts=(32, 64), decode_tokens=2)


def test_sections_registered() -> None:
    names = section_names()
    assert "llama" in names and "decode" in names


def test_ramp_keeps_the_budget_and_multiples() -> None:
    for heads, kv, layers in [(12, 4, 4), (8, 2, 2), (8, 2, 3), (4, 4, 4)]:
        plan = ramp(heads, kv, layers)
        assert sum(plan) == heads * layers and all(h % kv == 0 and h > 0 for h in plan)
    assert ramp(12, 4, 4) == [4, 8, 16, 20]
    assert [label for label, _ in llama_plans(TINY)] == ["2x4", "asc 2,6", "desc 6,2"]


def test_llama_section_runs_and_reports() -> None:
    sec = bench_llama(TINY, torch.device("cpu"), lambda _: None)
    assert set(sec["cases"]) == {"hf", "headwise 2x4", "headwise asc 2,6", "headwise desc 6,2"}
    params = {c["params"] for c in sec["cases"].values() if c["impl"] == "headwise"}
    assert params == {sec["hf_params"]}  # every plan has HF's (the uniform model's) parameters
    assert len(sec["comparisons"]["vs_hf"]) == 3 and len(sec["comparisons"]["penalty"]) == 2
    assert sec["hf_attn_implementation"] == "sdpa"
    result = {"llama": sec}
    assert len(llama_targets(result)) == 3
    assert any("Llama-style training step" in line for line in llama_table(result))


def test_decode_section_runs_and_reports() -> None:
    sec = bench_decode(TINY, 4, 2, torch.device("cpu"), lambda _: None)
    rows = {(r["context"], r["attention"]): r for r in sec["contexts"]}
    assert set(rows) == {(32, "gqa"), (32, "mha"), (64, "gqa"), (64, "mha")}
    # 2 layers x (k, v) x kv heads x 64 wide x fp32 bytes, per cached token
    assert rows[(64, "gqa")]["cache_bytes_per_token"] == 2 * 2 * 2 * 64 * 4
    assert rows[(64, "mha")]["cache_bytes"] == 2 * rows[(64, "gqa")]["cache_bytes"]
    assert sec["speedup"]["ratio"] > 0
    assert any("| 64 | MHA |" in line for line in decode_table({"decode": sec}))


def _ratio(r: float) -> dict:
    return {"ratio": r, "ratio_of_medians": r, "basis": "3/3 quiet", "paired": [r] * 3}


def test_targets_from_given_numbers() -> None:
    sec = {"hf_attn_implementation": "sdpa", "comparisons": {
        "vs_hf": [{"plan": "4x12", **_ratio(1.2)}, {"plan": "asc", **_ratio(0.98)}],
        "penalty": [{"plan": "asc", **_ratio(0.91)}]}}
    met = [t["met"] for t in llama_targets({"llama": sec})]
    assert met == [True, False, True]
    sec["comparisons"]["vs_hf"][0] = {"plan": "4x12", **_ratio(1.05)}
    sec["comparisons"]["penalty"] = [{"plan": "asc", **_ratio(0.85)}]
    assert [t["met"] for t in llama_targets({"llama": sec})] == [False, False, False]
    assert [t["met"] for t in decode_targets({"decode": {"new_tokens": 500, "speedup": _ratio(6.0)}})] == [True]
    assert [t["met"] for t in decode_targets({"decode": {"new_tokens": 500, "speedup": _ratio(4.0)}})] == [False]
    assert llama_targets({}) == [] and decode_targets({}) == []

