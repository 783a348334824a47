"""The ``encoder`` section of ``headwise bench`` on a tiny Crammed BERT: the default shape and its
HF twin's size, shared weights, the same masked batch for both sides, the result document and
the ratio arithmetic (checked by hand from the raw seconds: two rounds, so every median is the mean
of the two); no timing is asserted."""

import dataclasses
import math

import pytest
import torch

from headwise.bench.report import evaluate_targets, render_markdown
from headwise.bench.sections import SECTIONS, section_names
from headwise.bench.settings import BenchConfig
from headwise.cli import main
from headwise.families.encoder.bench import (
    _models, compare_encoder, encoder_plans, encoder_spec, hf_intermediate, hf_model, masked_batch,
)
from headwise.params import count_params
from headwise.text.masked_vocab import CLS_ID, SEP_ID
from helpers import one_thread, quiet_basis, run_sections, two_round_ratio  # noqa: F401  (one_thread: autouse, one torch thread)

transformers = pytest.importorskip("transformers", reason="the section compares against transformers' BERT")

TINY = dataclasses.replace(
    BenchConfig.quick_config(), encoder_layers=2, encoder_d_model=32, encoder_mlp_hidden=64, encoder_vocab_size=64,
    encoder_seq_len=16, encoder_batch=2, encoder_heads=(2, 4), encoder_ramps=(4.0, 0.25), encoder_rounds=2,
    encoder_warmup=1, encoder_idle_wait=0.0,
)


@pytest.fixture(scope="module")
def encoder_result():
    return run_sections(TINY, {"encoder"})


def test_default_section_is_crammed_bert_and_its_hf_twin_has_its_size():
    cfg = BenchConfig()
    plans = encoder_plans(cfg)
    assert [p.heads for p in plans[:2]] == [(12,) * 16, (24,) * 16] and len(plans) == 4
    assert all(p.total == sum(p.heads) and p.n_layers == 16 for p in plans)
    spec = encoder_spec(cfg, plans[0].heads)
    assert (spec.d_model, spec.vocab_size, spec.max_seq_len, spec.output_head) == (768, 32768, 128, "mlm")
    # every plan's parameters are the preset's (head_dim = d_model / heads)
    assert {count_params(encoder_spec(cfg, p.heads)) for p in plans} == {119_589_889}
    assert hf_intermediate(spec) == 2304 and (cfg.encoder_batch, cfg.encoder_mask_rate) == (8, 0.25)
    with torch.device("meta"):
        hf = hf_model(cfg, spec, 12)
    hf_params = sum(p.numel() for p in hf.parameters())
    assert abs(hf_params / 119_589_889 - 1) < 0.01 and hf.config._attn_implementation == "sdpa"
    assert "encoder" in SECTIONS


def test_both_sides_see_one_masked_batch_and_share_their_weights():
    inputs, labels = masked_batch(TINY)
    assert inputs.shape == labels.shape == (2, 16)
    assert (inputs[:, 0] == CLS_ID).all() and (inputs[:, -1] == SEP_ID).all()
    assert ((labels != -100).sum(1) == 4).all()  # round(0.25 * 14)
    assert torch.equal(masked_batch(TINY)[1], labels)  # seeded
    plans = encoder_plans(TINY)
    ours, theirs, (opt, hf_opt) = _models(TINY, plans, torch.device("cpu"))
    assert list(ours) == ["2x2", "2x4", "line 1,4", "line 4,1"]
    assert ours["2x4"].blocks[0].attn.qkv.weight is ours["2x2"].blocks[0].attn.qkv.weight
    assert ours["2x4"].blocks[0].attn.heads == 4 and ours["line 1,4"].blocks[1].attn.heads == 4
    hf_weight = lambda m: m.bert.encoder.layer[0].attention.self.query.weight  # noqa: E731
    assert hf_weight(theirs[4]) is hf_weight(theirs[2]) and theirs[4].config.num_attention_heads == 4
    assert {id(p) for g in opt.param_groups for p in g["params"]} == {id(p) for p in ours["2x2"].parameters()}
    assert {id(p) for g in hf_opt.param_groups for p in g["params"]} == {id(p) for p in theirs[2].parameters()}


def test_encoder_only_run_has_the_expected_document(encoder_result):
    r = encoder_result
    assert r["sections"] == ["encoder"] and r["training"] == [] and "vision" not in r
    e = r["encoder"]
    for key in ("device", "precision", "preset", "batch", "seq_len", "tokens_per_step", "masked_tokens", "mask_rate",
                "d_model", "n_layers", "mlp_hidden", "hf_intermediate", "vocab_size", "rounds", "warmup", "params",
                "hf_params", "hf_attn_implementation", "optimizer", "idle_wait_s", "cases", "comparisons"):
        assert key in e, key
    assert (e["tokens_per_step"], e["masked_tokens"], e["hf_intermediate"]) == (32, 8, 48)
    assert e["params"] == count_params(encoder_spec(TINY, (2, 2)))
    assert set(e["cases"]) == {"headwise 2x2", "headwise 2x4", "headwise line 1,4", "headwise line 4,1",
                               "hf 2x2", "hf 2x4"}
    refs = {n: c["reference"] for n, c in e["cases"].items() if c["impl"] == "headwise"}
    # uniform plans meet HF at their head count, the ramps (mean 2.5 heads) the nearest: 2
    assert refs == {"headwise 2x2": "hf 2x2", "headwise 2x4": "hf 2x4", "headwise line 1,4": "hf 2x2",
                    "headwise line 4,1": "hf 2x2"}
    for c in e["cases"].values():
        assert len(c["seconds"]) == TINY.encoder_rounds == 2
        rates = [32 / s for s in c["seconds"]]
        assert c["tokens_per_s"] == pytest.approx(rates) and all(math.isfinite(x) and x > 0 for x in rates)
        assert c["basis"] == quiet_basis(c["cpu_stall"])
        assert c["tokens_per_s_median"] == pytest.approx((rates[0] + rates[1]) / 2)
    assert any("round 2/2" in line for line in r["log"])


def test_encoder_ratios_by_hand_from_the_rates(encoder_result):
    e = encoder_result["encoder"]
    c = e["cases"]

    def expect(a, b):
        return two_round_ratio(c[a]["tokens_per_s"], c[b]["tokens_per_s"], c[a]["cpu_stall"], c[b]["cpu_stall"])

    comp = e["comparisons"]
    assert [r["plan"] for r in comp["vs_hf"]] == ["2x2", "2x4", "line 1,4", "line 4,1"]
    for row in comp["vs_hf"]:
        assert {k: v for k, v in row.items() if k not in ("plan", "heads", "reference")} == expect(
            f"headwise {row['plan']}", row["reference"])
        assert math.isfinite(row["ratio"])
    assert comp["penalty"][0] == {"plan": "2x4", "heads": [4, 4], "baseline": "headwise 2x2",
                                  **expect("headwise 2x4", "headwise 2x2")}


def _case(impl, plan, rates, reference=None):
    case = {"impl": impl, "plan": plan, "heads": [], "tokens_per_s": rates, "cpu_stall": [0.0] * len(rates),
            "tokens_per_s_median": sorted(rates)[len(rates) // 2]}
    return {**case, "reference": reference} if reference else case


def test_encoder_targets_by_hand():
    cases = {"headwise 16x12": _case("headwise", "16x12", [130.0, 120.0, 126.0], "hf 16x12"),
             "headwise 16x24": _case("headwise", "16x24", [99.0, 90.0, 110.0], "hf 16x24"),
             "hf 16x12": _case("hf", "16x12", [100.0, 100.0, 100.0]),
             "hf 16x24": _case("hf", "16x24", [100.0, 100.0, 100.0])}
    section = {"cases": cases, "hf_attn_implementation": "sdpa"}
    comp = compare_encoder(section)
    assert [r["ratio"] for r in comp["vs_hf"]] == pytest.approx([1.26, 0.99])
    assert comp["penalty"][0]["ratio"] == pytest.approx(99.0 / 130.0)  # median of (0.76, 0.75, 0.87)
    targets = evaluate_targets({"encoder": {**section, "comparisons": comp}})
    got = {t["target"]: (t["measured"], t["met"]) for t in targets}
    what = "Crammed BERT vs HF BertForMaskedLM (sdpa), masked-LM training tokens/s"
    assert got == {f"{what}: headwise 16x12 / hf 16x12": (pytest.approx(1.26), True),
                   f"{what}: never slower at any plan (worst plan)": (pytest.approx(0.99), False)}


def test_encoder_report_table(encoder_result):
    text = render_markdown({**encoder_result, "wall_time_s": 1.0})
    assert "## Encoder masked-LM training step (cpu, fp32, B=2 x T=16)" in text
    assert "| 2x2 |" in text and "| line 4,1 |" in text and "intermediate size 48" in text
    assert "masked-LM training tokens/s: never slower at any plan" in text


def test_cli_lists_the_sections(capsys):
    assert main(["bench", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == section_names()
    built_in = ["hf", "penalty", "mfu", "bf16", "generate", "tokenize", "vision", "nystrom", "encoder", "gpu"]
    assert [name for name in section_names() if name in built_in] == built_in  # the suite's order
    assert any(line.startswith("encoder") and "BertForMaskedLM" in line for line in lines)
