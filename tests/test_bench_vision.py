"""The ``vision`` section of ``headwise bench`` on a tiny ViT: shared weights, the result
document, and the ratio arithmetic (checked by hand from the raw seconds: two rounds, so every
median is the mean of the two); no timing is asserted."""

import dataclasses

import pytest
import torch

from headwise.bench.sections import SECTIONS
from headwise.bench.settings import BenchConfig
from headwise.bench.report import evaluate_targets, render_markdown
from headwise.families.vision.bench import _models, compare_vision, vision_spec
from headwise.params import count_params
from helpers import one_thread, quiet_basis, run_sections, two_round_ratio  # noqa: F401  (one_thread: autouse, one torch thread)

transformers = pytest.importorskip("transformers", reason="the section compares against transformers' ViT")

TINY = dataclasses.replace(
    BenchConfig.quick_config(), vision_image_size=8, vision_patch_size=4, vision_d_model=24, vision_layers=2,
    vision_heads=(2, 6), vision_mlp_hidden=32, vision_classes=5, vision_batch=4, vision_rounds=2, vision_warmup=1,
    vision_idle_wait=0.0,
)


@pytest.fixture(scope="module")
def vision_result():
    return run_sections(TINY, {"vision"})


def test_default_section_is_the_briefs_model():
    cfg = BenchConfig()
    spec = vision_spec(cfg, 12)
    assert (spec.image_size, spec.patch_size, spec.channels, spec.d_model, spec.n_layers) == (32, 4, 3, 192, 6)
    assert spec.max_seq_len == 65 and spec.layer(0).mlp_hidden == 768 and spec.num_classes == 10
    assert cfg.vision_heads == (3, 12) and spec.layer(0).head_dim == 16 and vision_spec(cfg, 3).layer(0).head_dim == 64
    assert count_params(spec) == count_params(vision_spec(cfg, 3))
    assert "vision" in SECTIONS


def test_models_share_weights_and_match_hf_at_every_head_count():
    ours, theirs, (opt, hf_opt) = _models(TINY, torch.device("cpu"))
    assert ours[6].blocks[0].attn.qkv.weight is ours[2].blocks[0].attn.qkv.weight
    assert theirs[6].vit.layers[0].attention.q_proj.weight is theirs[2].vit.layers[0].attention.q_proj.weight
    assert theirs[6].config._attn_implementation == "sdpa"
    x = torch.randn(3, 3, 8, 8)
    with torch.no_grad():
        for h in (2, 6):
            ours[h].eval(), theirs[h].eval()
            assert ours[h].blocks[0].attn.heads == h
            assert (ours[h](x) - theirs[h](pixel_values=x).logits).abs().max().item() < 1e-5
    # one optimiser per side, over that side's parameters only
    assert {id(p) for g in opt.param_groups for p in g["params"]} == {id(p) for p in ours[2].parameters()}
    assert {id(p) for g in hf_opt.param_groups for p in g["params"]} == {id(p) for p in theirs[2].parameters()}


def test_vision_only_run_has_the_expected_document(vision_result):
    r = vision_result
    assert r["sections"] == ["vision"] and r["training"] == [] and "generation" not in r
    v = r["vision"]
    for key in ("device", "precision", "batch", "image_size", "patch_size", "channels", "d_model", "n_layers",
                "mlp_hidden", "num_classes", "positions", "heads", "rounds", "warmup", "params", "hf_params",
                "hf_attn_implementation", "optimizer", "idle_wait_s", "cases", "comparisons"):
        assert key in v, key
    assert v["params"] == v["hf_params"] == count_params(vision_spec(TINY, 2))
    assert v["hf_attn_implementation"] == "sdpa" and v["positions"] == 5 and v["heads"] == [2, 6]
    assert set(v["cases"]) == {"headwise 2x2", "hf 2x2", "headwise 2x6", "hf 2x6"}
    for c in v["cases"].values():
        assert len(c["seconds"]) == TINY.vision_rounds == 2
        rates = [TINY.vision_batch / s for s in c["seconds"]]
        assert c["images_per_s"] == pytest.approx(rates)
        assert c["basis"] == quiet_basis(c["cpu_stall"])
        assert c["images_per_s_median"] == pytest.approx((rates[0] + rates[1]) / 2)
    assert v["cases"]["hf 2x6"]["attn_implementation"] == "sdpa"
    assert any("round 2/2" in line for line in r["log"])


def test_vision_ratios_by_hand_from_the_rates(vision_result):
    v = vision_result["vision"]
    c = v["cases"]

    def expect(a, b):
        return two_round_ratio(c[a]["images_per_s"], c[b]["images_per_s"], c[a]["cpu_stall"], c[b]["cpu_stall"])

    comp = v["comparisons"]
    assert comp["vs_hf"] == [{"plan": f"2x{h}", "heads": h, "reference": f"hf 2x{h}",
                              **expect(f"headwise 2x{h}", f"hf 2x{h}")} for h in (2, 6)]
    assert comp["penalty"] == {"plan": "2x6", "heads": 6, "baseline": "headwise 2x2",
                               **expect("headwise 2x6", "headwise 2x2")}
    assert comp["hf_penalty"]["baseline"] == "hf 2x2"
    paired = [a / b for a, b in zip(c["headwise 2x6"]["images_per_s"], c["headwise 2x2"]["images_per_s"])]
    assert comp["penalty"]["paired"] == pytest.approx(paired)


def _case(impl, heads, rates):
    return {"impl": impl, "plan": f"6x{heads}", "heads": heads, "images_per_s": rates,
            "cpu_stall": [0.0] * len(rates), "images_per_s_median": sorted(rates)[len(rates) // 2]}


def test_vision_targets_by_hand():
    cases = {"headwise 6x3": _case("headwise", 3, [100.0, 110.0, 90.0]),
             "hf 6x3": _case("hf", 3, [100.0, 100.0, 100.0]),
             "headwise 6x12": _case("headwise", 12, [95.0, 88.0, 99.0]),
             "hf 6x12": _case("hf", 12, [80.0, 80.0, 100.0])}
    section = {"heads": [3, 12], "cases": cases, "hf_attn_implementation": "sdpa"}
    comp = compare_vision(section)
    # medians of the per-round ratios (1, 1.1, .9) and (1.1875, 1.1, .99)
    assert [r["ratio"] for r in comp["vs_hf"]] == pytest.approx([1.0, 1.1])
    assert comp["penalty"]["ratio"] == pytest.approx(0.95)  # median of (0.95, 0.8, 1.1)
    assert comp["hf_penalty"]["ratio"] == pytest.approx(0.8)
    targets = evaluate_targets({"vision": {**section, "comparisons": comp}})
    got = {t["target"]: (t["measured"], t["met"]) for t in targets}
    vs = "ViT vs HF ViTForImageClassification (sdpa), training images/s: headwise"
    assert got == {f"{vs} 6x3 / hf 6x3": (pytest.approx(1.0), True),
                   f"{vs} 6x12 / hf 6x12": (pytest.approx(1.1), True),
                   "ViT head-count penalty: headwise 6x12 / 6x3": (pytest.approx(0.95), True)}


def test_vision_report_table(vision_result):
    text = render_markdown({**vision_result, "wall_time_s": 1.0})
    assert "## Vision training step (cpu, fp32, B=4 images)" in text
    assert "| 2x2 |" in text and "| 2x6 |" in text and "ViT head-count penalty" in text
    assert "sdpa attention" in text
