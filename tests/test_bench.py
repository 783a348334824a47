"""``headwise bench`` on a tiny configuration: the suite's plumbing, sharing and arithmetic.

No timing is asserted (timings are what the benchmark measures); the numbers it derives from
its timings are checked against recomputation from the raw seconds and independent formulas.
"""

import dataclasses
import json

import pytest
import torch

from headwise.bench import core
from headwise.bench.sections import default_section_names
from headwise.bench.cases import grid_plans, model_spec, plan_label, share_parameters
from headwise.bench.settings import BenchConfig
from headwise.bench.report import evaluate_targets, render_markdown, write_results
from headwise.families.lm.bench import bench_tokenize
from headwise.families.lm.bench import main as tokenize_main
from headwise.cli import main
from headwise.model import Transformer
from headwise.params import flops_per_token
from headwise.plans import Plan, Scheme
from helpers import one_thread, run_sections  # noqa: F401  (one_thread: autouse, one torch thread)

transformers = pytest.importorskip("transformers", reason="the suite compares against transformers' GPT-Neo")

TINY = dataclasses.replace(
    BenchConfig.quick_config(), d_model=64, vocab_size=97, seq_lens=(16, 24), tokens_per_step=48, rounds=2,
    warmup=1, totals=(8, 30), bf16_totals=(8,), peak_n=64, gen_new_tokens=12, gen_prompt_tokens=4, idle_wait=0.0,
    vision_image_size=8, vision_patch_size=4, vision_d_model=24, vision_layers=2, vision_heads=(2, 6),
    vision_mlp_hidden=32, vision_classes=5, vision_batch=4, vision_rounds=2, vision_idle_wait=0.0,
    encoder_layers=2, encoder_d_model=32, encoder_mlp_hidden=64, encoder_vocab_size=64, encoder_seq_len=16,
    encoder_batch=2, encoder_heads=(2, 4), encoder_rounds=2, encoder_idle_wait=0.0,
)



def test_interleave_warms_up_then_runs_each_case_once_per_shuffled_round():
    calls = []
    cases = {name: (lambda n=name: calls.append(n)) for name in "abcd"}
    rounds_seen = []
    timings = core.interleave(cases, rounds=4, warmup=1, device=torch.device("cpu"),
                              before_round=rounds_seen.append, seed=3)
    assert calls[:4] == list("abcd")  # warm-up in order
    timed = [calls[4 + 4 * r: 8 + 4 * r] for r in range(4)]
    assert all(sorted(r) == list("abcd") for r in timed)
    assert len({tuple(r) for r in timed}) > 1  # the order changes between rounds
    assert rounds_seen == [0, 1, 2, 3]
    assert {k: len(v) for k, v in timings.seconds.items()} == dict.fromkeys("abcd", 4)
    assert all(len(timings.quiet(k)) == 4 for k in "abcd")
    again = []
    core.interleave({n: (lambda n=n: again.append(n)) for n in "abcd"}, 4, 1, torch.device("cpu"), seed=3)
    assert again == calls  # seeded: the same schedule


def test_ratio_stats_by_hand():
    r = core.ratio_stats([2.0, 4.0, 9.0], [1.0, 2.0, 3.0])
    assert r["paired"] == pytest.approx([2.0, 2.0, 3.0]) and r["ratio"] == pytest.approx(2.0)
    assert r["ratio_of_medians"] == pytest.approx(4.0 / 2.0)  # medians 4 and 2
    # only the quiet rounds count when there are two or more of them
    q = core.ratio_stats([2.0, 4.0, 9.0, 1.0], [1.0, 2.0, 3.0, 1.0], quiet=[False, True, True, False])
    assert q["ratio"] == pytest.approx(2.5) and q["ratio_of_medians"] == pytest.approx(6.5 / 2.5)
    assert q["basis"] == "2/4 quiet"
    assert core.ratio_stats([2.0, 4.0], [1.0, 1.0], quiet=[True, False])["ratio"] == pytest.approx(3.0)


class _FakeProc:
    """Stands in for pathlib.Path in headwise.bench.core: each read of a path gives that path's
    next text, and a path it lacks reads as missing, as on a kernel without it."""

    def __init__(self, texts: dict[str, list[str]]):
        self.texts = {path: list(reads) for path, reads in texts.items()}

    def __call__(self, path: str) -> "_FakeProc":
        self.path = path
        return self

    def read_text(self) -> str:
        if not self.texts.get(self.path):
            raise FileNotFoundError(self.path)
        return self.texts[self.path].pop(0)


def test_cpu_stall_and_busy_share_read_by_hand(monkeypatch):
    psi = "some avg10=1.00 avg60=2.00 avg300=3.00 total=2500000\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=7\n"
    # /proc/stat's first line: user nice system idle iowait irq softirq steal guest guest_nice (jiffies)
    stat = ["cpu  100 5 50 800 20 3 2 0 0 0\ncpu0 1 2 3\n", "cpu  160 5 70 880 40 8 2 0 0 0\ncpu0 1 2 3\n"]
    monkeypatch.setattr(core, "Path", _FakeProc({"/proc/pressure/cpu": [psi], "/proc/stat": stat}))
    assert core.cpu_stall_seconds() == 2.5            # the "some" line's total, in microseconds
    # between the reads: 60 user + 20 system + 5 irq busy, 80 idle + 20 iowait not: 85 / 185
    assert core.cpu_busy_share(0.0) == pytest.approx(17 / 37, rel=1e-15)
    monkeypatch.setattr(core, "Path", _FakeProc({}))  # a kernel without PSI or /proc/stat
    assert core.cpu_stall_seconds() is None and core.cpu_busy_share(0.0) is None


def test_cpu_stall_is_a_cumulative_counter():
    stall = core.cpu_stall_seconds()
    if stall is None:
        pytest.skip("this kernel has no /proc/pressure/cpu (PSI)")
    assert core.cpu_stall_seconds() >= stall


def test_matmul_peak_is_a_flop_rate():
    peak = core.matmul_peak(torch.float32, torch.device("cpu"), 64)
    assert peak > 1e6  # 2 * 64^3 flops in well under 0.5 s


def test_grid_is_the_blogs():
    plans = grid_plans(BenchConfig())
    assert [p.heads for p in plans if p.requested_total == 180] == [(48,) * 4, (12, 24, 48, 96), (96, 48, 24, 12)]
    assert [plan_label(p) for p in plans[:4]] == ["4x12", "4x24", "4x48", "asce 3,6,12,24"]
    assert plan_label(Plan.of(Scheme.DESCENDING, (96, 48, 24, 12))) == "desc 96,48,24,12"


def test_shared_models_compute_what_separate_models_compute():
    torch.manual_seed(0)
    base = Transformer(model_spec(TINY, [2] * 4))
    spec = model_spec(TINY, [16, 8, 4, 2])
    with torch.device("meta"):
        shared = Transformer(spec)
    share_parameters(shared, base)
    assert shared.lm_head.weight is base.tok_emb.weight  # still tied, to the base's embedding
    separate = Transformer(spec)
    separate.load_state_dict(base.state_dict())
    x = torch.randint(0, TINY.vocab_size, (2, 20))
    with torch.no_grad():
        assert torch.equal(shared(x), separate(x))
        # Hugging Face side: a meta-built GPT-Neo sharing another HF model's weights and masks.
        from headwise.hf.gpt_neo import GPT_NEO

        hf_base = GPT_NEO.to_hf(base)
        constant = model_spec(TINY, [8] * 4)
        with torch.device("meta"):
            hf_shared = transformers.GPTNeoForCausalLM(GPT_NEO.to_config(constant))
        share_parameters(hf_shared, hf_base)
        reference = Transformer(constant)
        reference.load_state_dict(base.state_dict())
        assert (hf_shared(x).logits - reference(x)).abs().max().item() < 1e-5


@pytest.fixture(scope="module")
def tiny_result():
    return run_sections(TINY, set(default_section_names()) - {"tokenize"})


def test_tiny_run_measures_every_case_and_derives_consistent_numbers(tiny_result):
    r = tiny_result
    assert [s["seq_len"] for s in r["training"]] == [16, 24]
    s = r["training"][1]
    assert s["batch"] == 2 and s["tokens_per_step"] == 48
    names = set(s["cases"])
    assert {"headwise 4x2", "headwise 4x8", "hf 4x2", "hf 4x8", "headwise 4x2 bf16"} <= names
    assert len([n for n in names if n.startswith("headwise") and "bf16" not in n]) == len(grid_plans(TINY))
    for name, c in s["cases"].items():
        assert len(c["seconds"]) == TINY.rounds == 2
        spec = model_spec(TINY, c["heads"])
        assert c["flops_per_token"] == flops_per_token(spec, 24)
        rates = [48 / sec for sec in c["seconds"]]
        assert c["tokens_per_s"] == pytest.approx(rates)
        # two rounds: the quiet ones are used only when both are quiet, so always both
        quiet = sum(x is None or x < 0.10 for x in c["cpu_stall"])
        assert c["basis"] == ("2/2 quiet" if quiet == 2 else f"all 2 ({quiet} quiet)")
        assert c["tokens_per_s_median"] == pytest.approx((rates[0] + rates[1]) / 2)
        peak = s["peak_flops_median"][c["precision"]]
        assert min(s["peak_flops"][c["precision"]]) <= peak <= max(s["peak_flops"][c["precision"]])
        assert c["mfu"] == pytest.approx([c["flops_per_token"] * x / peak for x in rates])
        assert c["mfu_median"] == pytest.approx(c["flops_per_token"] * c["tokens_per_s_median"] / peak)
    vs = {row["plan"]: row for row in s["comparisons"]["vs_hf"]}
    assert vs["desc 16,8,4,2"]["reference"] == "hf 4x8"  # same budget, same parameters
    hw, hf = s["cases"]["headwise 4x8"], s["cases"]["hf 4x8"]
    quiet = sum((a is None or a < 0.10) and (b is None or b < 0.10) for a, b in zip(hw["cpu_stall"], hf["cpu_stall"]))
    paired = [a / b for a, b in zip(hw["tokens_per_s"], hf["tokens_per_s"])]
    assert {k: vs["4x8"][k] for k in ("plan", "heads", "reference", "basis")} == {
        "plan": "4x8", "heads": [8] * 4, "reference": "hf 4x8",
        "basis": "2/2 quiet" if quiet == 2 else f"all 2 ({quiet} quiet)"}
    assert vs["4x8"]["paired"] == pytest.approx(paired) and vs["4x8"]["ratio"] == pytest.approx(sum(paired) / 2)
    assert vs["4x8"]["ratio_of_medians"] == pytest.approx(sum(hw["tokens_per_s"]) / sum(hf["tokens_per_s"]))
    assert {row["plan"] for row in s["comparisons"]["penalty"]} == {plan_label(p) for p in grid_plans(TINY)} - {"4x2"}
    assert any("round 2/2" in line for line in r["log"])


def test_tiny_run_generation_agrees_with_and_without_cache(tiny_result):
    (gen,) = tiny_result["generation"]
    assert gen["new_tokens"] == 12 and gen["greedy_tokens_agree"] == 12
    assert set(gen["tokens_per_s_median"]) == {"kv-cache", "no-cache"}


def test_report_names_machine_and_targets(tiny_result, tmp_path):
    js, md = write_results(dict(tiny_result), tmp_path)
    text = md.read_text()
    for needle in ("Machine:", "torch 2", "Dtype: float32", "Load:", "## Targets", "vs HF", "MFU", "KV cache",
                   "## Encoder masked-LM training step"):
        assert needle in text
    saved = json.loads(js.read_text())
    assert saved["machine"]["torch"] == torch.__version__ and saved["targets"]


def _section(seq_len, vs_hf, penalty, bf16, mfu):
    cases = {"headwise 4x12": dict(impl="headwise", scheme="constant", total=45, plan="4x12", precision="fp32",
                                   mfu_median=mfu),
             "headwise desc 96,48,24,12": dict(impl="headwise", scheme="descending", total=180,
                                               plan="desc 96,48,24,12", precision="fp32", mfu_median=mfu),
             "headwise 4x48": dict(impl="headwise", scheme="constant", total=180, plan="4x48", precision="fp32",
                                   mfu_median=mfu)}
    row = lambda plan, ratio, **kw: dict(plan=plan, ratio=ratio, ratio_of_medians=ratio, **kw)  # noqa: E731
    return {"device": "cpu", "precision": "fp32", "seq_len": seq_len, "params": 68_514_048, "cases": cases,
            "comparisons": {
                "vs_hf": [row("4x48", vs_hf[0], reference="hf 4x48"),
                          row("desc 96,48,24,12", vs_hf[1], reference="hf 4x48"),
                          row("4x12", vs_hf[2], reference="hf 4x12")],
                "penalty": [row("4x48", penalty[0], baseline="headwise 4x12"),
                            row("desc 96,48,24,12", penalty[1], baseline="headwise 4x12")],
                "bf16": [row("4x12", bf16)]}}


def test_targets_by_hand():
    result = {"training": [_section(256, (1.1, 1.0, 0.95), (0.95, 0.92), 1.5, 0.5),
                           _section(512, (1.3, 1.19, 1.01), (0.89, 0.93), 2.1, 0.7)],
              "tokenize": {"tokens_per_second_median": 2_000_000},
              "generation": [{"device": "cpu", "new_tokens": 500, "speedup": {"ratio": 6.0}}]}
    got = {t["target"]: (t["measured"], t["met"]) for t in evaluate_targets(result)}
    assert got["vs HF GPT-Neo, T=512: headwise 4x48 / hf 4x48"] == (1.3, True)
    assert got["vs HF GPT-Neo, T=512: headwise desc 96,48,24,12 / hf 4x48"] == (1.19, False)
    assert got["never slower than HF on any plan (worst plan)"] == (0.95, False)  # 4x12 at T=256
    assert got["head-count penalty, T=256: every plan / 4x12 (worst)"] == (0.92, True)
    assert got["head-count penalty, T=512: every plan / 4x12 (worst)"] == (0.89, False)
    assert got["MFU, fp32, headwise 4x12 T=512 (68.5M params)"] == (0.7, True)
    assert got["bf16 autocast / fp32 training (no AMX), 4x12 T=512"] == (2.1, True)
    assert got["GPT-Neo tokenization"] == (2_000_000, True)
    assert got["KV-cache / no-cache generation at 500 new tokens"] == (6.0, True)


def test_bf16_target_on_an_amx_cpu_is_mfu():
    section = _section(512, (1.3, 1.2, 1.01), (0.95, 0.93), 4.0, 0.8)
    section["cases"]["headwise 4x12 bf16"] = dict(impl="headwise", scheme="constant", total=45, plan="4x12",
                                                  precision="bf16", mfu_median=0.5, basis="5/5 quiet")
    result = {"machine": {"cpu": "Intel(R) Xeon(R) Processor (family 6 model 143; avx512f amx_bf16)"},
              "training": [section]}
    got = {t["target"]: t for t in evaluate_targets(result)}
    row = got["bf16 MFU (AMX CPU), headwise 4x12 T=512"]
    assert (row["measured"], row["met"], row["goal"]) == (0.5, False, ">= 55% of bf16 matmul peak")
    assert row["shown"] == "50% (5/5 quiet rounds; 4.00x the fp32 tokens/s)"
    assert not any("no AMX" in name for name in got)


def test_tokenize_section_runs_the_packaged_measurement(shared_data, monkeypatch, tmp_path):
    monkeypatch.setenv("HEADWISE_DATA", str(shared_data))
    monkeypatch.chdir(tmp_path)  # needs no source checkout: only the installed package and the data
    res = bench_tokenize(1, log=lambda m: None)
    assert res["benchmark"] == "tokenize" and res["tokens"] > 0 and res["tokens_per_second_median"] > 0


def test_tokenize_without_the_sample_says_where_it_looked(tmp_path, capsys):
    assert tokenize_main(["--data", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert str(tmp_path / "tinystories-train-sample.txt") in err and len(err.splitlines()) == 1


def test_cli_writes_json_and_markdown(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(BenchConfig, "quick_config", classmethod(lambda cls: TINY))
    import headwise.bench

    tuned = []
    monkeypatch.setattr(headwise.bench, "tune_cpu_allocator", lambda: tuned.append(1))  # not in pytest
    out = tmp_path / "res"
    assert main(["bench", "--quick", "--out", str(out), "--only", "mfu,generate", "--seq-lens", "16"]) == 0
    saved = json.loads((out / "latest.json").read_text())
    assert saved["sections"] == ["generate", "mfu"] and [s["seq_len"] for s in saved["training"]] == [16]
    assert list(saved["training"][0]["cases"]) == ["headwise 4x2"]
    assert (out / "latest.md").read_text() == render_markdown(saved) + "\n"
    assert "wrote" in capsys.readouterr().out and tuned == [1]


@pytest.mark.parametrize("argv, message", [
    (["--only", "penalty,nope"], "unknown section"),
    (["--seq-lens", "512,x"], "not a comma-separated list"),
    (["--rounds", "0"], "not a positive integer"),
    (["--seq-lens", "4096"], "longer than the model's 2048 positions"),
])
def test_cli_bad_input_is_one_line_exit_2(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        code = main(["bench", "--out", str(tmp_path / "r"), *argv])
        raise SystemExit(code)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_cli_refuses_a_file_as_out(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("keep")
    assert main(["bench", "--out", str(f)]) == 2
    assert "not a folder" in capsys.readouterr().err and f.read_text() == "keep"
