"""The ``nystrom`` section of ``headwise bench`` at tiny sizes: the three layers compute what they
should with shared weights, the result document, and the ratio arithmetic (checked by hand from
the raw seconds: two rounds, so every median is the mean of the two); no timing is asserted."""

import dataclasses

import pytest
import torch

from headwise.bench.sections import SECTIONS
from headwise.bench.settings import BenchConfig
from headwise.bench.nystrom import _layers, compare_nystrom, nystrom_spec
from headwise.bench.report import evaluate_targets, render_markdown
from helpers import one_thread, quiet_basis, run_sections, two_round_ratio  # noqa: F401  (one_thread: autouse, one torch thread)

transformers = pytest.importorskip("transformers", reason="the section compares against transformers' Nystromformer")

TINY = dataclasses.replace(
    BenchConfig.quick_config(), nystrom_seq_lens=(32, 64), nystrom_d_model=16, nystrom_heads=2,
    nystrom_landmarks=8, nystrom_batch=2, nystrom_rounds=2, nystrom_warmup=1, nystrom_sample_s=0.002,
    nystrom_idle_wait=0.0, nystrom_softmax_target_from=64,
)


@pytest.fixture(scope="module")
def nystrom_result():
    return run_sections(TINY, {"nystrom"})


def test_default_section_is_the_briefs_layer():
    cfg = BenchConfig()
    spec = nystrom_spec(cfg)
    shape = spec.layer(0)
    assert (spec.d_model, shape.heads, shape.head_dim, shape.attention) == (64, 2, 32, "nystrom")
    assert (spec.landmarks, spec.nystrom_conv, spec.causal, spec.score_scale) == (64, None, False, "inv_sqrt")
    assert nystrom_spec(cfg, "global").layer(0).attention == "global"
    assert cfg.nystrom_seq_lens == (1024, 2048, 4096) and cfg.nystrom_softmax_target_from == 2048
    assert "nystrom" in SECTIONS


def test_layers_share_weights_and_match_hf_at_every_length():
    ours, softmax, theirs = _layers(TINY, torch.device("cpu"))
    assert softmax.qkv.weight is ours.qkv.weight and softmax.out.bias is ours.out.bias
    assert (ours.kind.name, softmax.kind.name) == ("nystrom", "global") and ours.conv is None
    assert theirs[64].attention.query.weight is theirs[32].attention.query.weight
    assert theirs[64].attention.seq_len == 64 and theirs[32].attention.conv_kernel_size is None
    torch.testing.assert_close(theirs[32].attention.value.weight, ours.qkv.weight[32:48], atol=0, rtol=0)
    for t in (32, 64):
        x = torch.randn(3, t, 16, requires_grad=True)
        a, b = ours(x), theirs[t](x)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
        # and their gradients: of the input, and of the weights (the fused qkv rows vs q/k/v)
        g = torch.randn_like(a)
        ga = torch.autograd.grad(a, [x, ours.qkv.weight, ours.out.weight], g)
        gb = torch.autograd.grad(b, [x, theirs[t].attention.key.weight, theirs[t].dense.weight], g)
        torch.testing.assert_close(ga[0], gb[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(ga[1][16:32], gb[1], atol=1e-5, rtol=0)
        torch.testing.assert_close(ga[2], gb[2], atol=1e-5, rtol=0)


def test_nystrom_only_run_has_the_expected_document(nystrom_result):
    r = nystrom_result
    assert r["sections"] == ["nystrom"] and r["training"] == [] and "vision" not in r
    n = r["nystrom"]
    for key in ("device", "precision", "batch", "seq_lens", "d_model", "heads", "head_dim", "landmarks",
                "pinv_iterations", "conv", "rounds", "warmup", "sample_s", "softmax_target_from", "params",
                "hf_params", "max_abs_diff", "idle_wait_s", "cases", "comparisons"):
        assert key in n, key
    assert n["params"] == n["hf_params"] == 16 * 48 + 48 + 16 * 16 + 16
    assert n["seq_lens"] == [32, 64] and n["head_dim"] == 8
    assert set(n["cases"]) == {f"{impl} T={t}" for impl in ("headwise nystrom", "headwise softmax", "hf nystrom")
                               for t in (32, 64)}
    for t in ("32", "64"):
        assert n["max_abs_diff"][t]["hf"] < 1e-5
    for c in n["cases"].values():
        assert len(c["seconds"]) == TINY.nystrom_rounds == 2 and c["repeats"] >= 1
        rates = [TINY.nystrom_batch * c["seq_len"] * c["repeats"] / s for s in c["seconds"]]
        assert c["tokens_per_s"] == pytest.approx(rates)
        assert c["basis"] == quiet_basis(c["cpu_stall"])
        assert c["tokens_per_s_median"] == pytest.approx((rates[0] + rates[1]) / 2)
    assert any("round 2/2" in line for line in r["log"])


def test_nystrom_ratios_by_hand_from_the_rates(nystrom_result):
    n = nystrom_result["nystrom"]
    c = n["cases"]

    def expect(a, b):
        return two_round_ratio(c[a]["tokens_per_s"], c[b]["tokens_per_s"], c[a]["cpu_stall"], c[b]["cpu_stall"])

    assert n["comparisons"] == [
        {"seq_len": t,
         "vs_hf": {"reference": f"hf nystrom T={t}", **expect(f"headwise nystrom T={t}", f"hf nystrom T={t}")},
         "vs_softmax": {"reference": f"headwise softmax T={t}",
                        **expect(f"headwise nystrom T={t}", f"headwise softmax T={t}")}}
        for t in (32, 64)]
    ours, hf = c["headwise nystrom T=64"]["tokens_per_s"], c["hf nystrom T=64"]["tokens_per_s"]
    assert n["comparisons"][1]["vs_hf"]["paired"] == pytest.approx([a / b for a, b in zip(ours, hf)])


def test_nystrom_targets_and_table(nystrom_result):
    targets = [t for t in evaluate_targets(nystrom_result) if "Nyström" in t["target"]]
    # vs HF at both lengths; vs softmax from softmax_target_from (64) on only
    assert len(targets) == 3
    assert [("HF" in t["target"], "T=64" in t["target"]) for t in targets] == [(True, False), (True, True),
                                                                             (False, True)]
    text = render_markdown(nystrom_result | {"wall_time_s": 1.0})
    assert "## Nyström attention layer" in text and "| 64 |" in text and "nyström / HF" in text


def _case(t, rates):
    return {"seq_len": t, "tokens_per_s": rates, "cpu_stall": [0.0] * len(rates)}


def test_nystrom_targets_by_hand():
    cases = {"headwise nystrom T=1024": _case(1024, [100.0, 110.0, 90.0]),
             "headwise softmax T=1024": _case(1024, [200.0, 100.0, 100.0]),
             "hf nystrom T=1024": _case(1024, [100.0, 100.0, 100.0]),
             "headwise nystrom T=2048": _case(2048, [60.0, 50.0, 70.0]),
             "headwise softmax T=2048": _case(2048, [50.0, 50.0, 50.0]),
             "hf nystrom T=2048": _case(2048, [40.0, 100.0, 70.0])}
    section = {"seq_lens": [1024, 2048], "cases": cases, "softmax_target_from": 2048}
    comp = compare_nystrom(section)
    # medians of the per-round ratios
    assert [r["vs_hf"]["ratio"] for r in comp] == pytest.approx([1.0, 1.0])  # (1, 1.1, .9), (1.5, .5, 1)
    assert [r["vs_softmax"]["ratio"] for r in comp] == pytest.approx([0.9, 1.2])  # (.5, 1.1, .9), (1.2, 1, 1.4)
    targets = evaluate_targets({"nystrom": {**section, "comparisons": comp}})
    assert [(t["goal"], t["met"]) for t in targets] == [(">= 1.0x", True), (">= 1.0x", True), ("> 1.0x", True)]
