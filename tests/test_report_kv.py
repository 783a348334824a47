"""The KV cache in the ``depth`` layout's headline table (issue 34): KV heads per layer and KV-cache
bytes per token against the baseline, from fake study folders whose summaries carry what the
trainer records (:func:`headwise.params.kv_cache_budget` of each variant's spec), checked against
2 x KV heads x head_dim x bytes per element summed over the layers, written out by hand."""

from __future__ import annotations

from pathlib import Path

from headwise.params import count_params, kv_cache_budget
from headwise.plans import plan_heads
from headwise.presets import spec_from_preset
from headwise.report import write_report
from headwise.run import RunStatus, RunSummary
from headwise.spec import ModelSpec
from headwise.study import load_study
from headwise.study.layout import run_dir, save_study

from helpers import read_csv, write_run_dir

#: the kv-heads study's KV heads per layer (4 layers at head_dim 32), by variant
KV_HEADS = {"q4-kv2": [2, 2, 2, 2], "q4-kv-asc": [1, 1, 2, 4], "q4-kv-desc": [4, 2, 1, 1], "q5-kv1": [1, 1, 1, 1],
            "q3-kv3": [3, 3, 3, 3], "q2-kv2": [2, 2, 2, 2]}
#: their cache per token in fp32, by hand: 2 (key and value) x KV heads x 32 x 4 bytes, summed
FP32 = {"q4-kv2": 2 * 8 * 32 * 4, "q4-kv-asc": 2 * (1 + 1 + 2 + 4) * 32 * 4, "q4-kv-desc": 2 * (4 + 2 + 1 + 1) * 32 * 4,
        "q5-kv1": 2 * 4 * 32 * 4, "q3-kv3": 2 * 12 * 32 * 4, "q2-kv2": 2 * 8 * 32 * 4}
LOSSES = {"q4-kv2": 3.00, "q4-kv-asc": 3.03, "q4-kv-desc": 2.97, "q5-kv1": 2.94, "q3-kv3": 3.06, "q2-kv2": 3.15}


def _spec(model: dict) -> ModelSpec:
    model = dict(model)
    return spec_from_preset(model.pop("preset"), **model)


def _fill(study, out: Path, *, recorded=lambda name: True, precision: str = "fp32") -> dict[str, int]:
    """Completed runs of ``study`` in ``out``, their summaries as the trainer writes them (the KV
    record only where ``recorded(variant)``); returns each variant's parameters."""
    save_study(study, out, 1)
    params = {}
    for v in study.variants:
        m, spec = v.config["model"], _spec(v.config["model"])
        params[v.name] = count_params(spec)
        plan = plan_heads("explicit", spec.n_layers, spec.d_model, heads=m["heads"], head_dim=spec.head_dims[0])
        loss = LOSSES.get(v.name, 3.0)
        kv = kv_cache_budget(spec) if recorded(v.name) else None
        summary = RunSummary(status=RunStatus.COMPLETED, final_eval_loss=loss, last_eval_loss=loss, plan=plan,
                             params=params[v.name], d_model=spec.d_model, precision=precision,
                             peak_memory_bytes=100 * 2**20, kv_cache_bytes_per_token=kv)
        write_run_dir(run_dir(out, v.name, 0), v.config, summary, [{"step": 10, "eval_loss": loss}])
    return params


def _table(out: Path) -> dict[str, list[str]]:
    """The headline table's rows of ``out``'s report, by variant: its cells."""
    text = write_report(out, samples=False, conditioning=False, echo=lambda _: None).read_text()
    section = text[text.index("## Table 2"):text.index("## Loss vs heads per layer")]
    rows = [line.strip("|").split(" | ") for line in section.splitlines() if line.startswith("| ")]
    return {"header": [c.strip() for c in rows[0]], **{r[0].split("`")[1]: [c.strip() for c in r] for r in rows[1:]}}


def test_kv_heads_table_shows_the_cache_against_the_baseline(tmp_path):
    study = load_study("kv-heads", preset="tiny")
    out = tmp_path / "kv"
    params = _fill(study, out)
    assert set(KV_HEADS) == {v.name for v in study.variants}
    for v in study.variants:  # the study's specs are the hand-written ones
        assert _spec(v.config["model"]).kv_heads_per_layer == KV_HEADS[v.name]
    table = _table(out)
    assert table["header"] == ["model", "shape", "KV heads per layer", "val. loss", "parameters",
                               "KV cache / token (fp32)", "peak memory"]
    base = FP32["q4-kv2"]
    assert base == 2048  # the study file's budget: 8 KV heads over the layers, 2,048 bytes in fp32
    for name, kv in KV_HEADS.items():
        row = table[name]
        assert row[2] == (str(kv[0]) if len(set(kv)) == 1 else ", ".join(map(str, kv))), row
        ratio = "" if name == "q4-kv2" else f" ({100 * (FP32[name] - base) / base:+.0f}%)"
        assert row[5] == f"{FP32[name]:,} B{ratio}", row
    assert table["q4-kv2"][5] == "2,048 B" and table["q4-kv2"][0] == "`q4-kv2` (baseline)"
    assert table["q4-kv-asc"][5] == "2,048 B (+0%)" and table["q4-kv-desc"][2] == "4, 2, 1, 1"
    assert table["q5-kv1"][5] == "1,024 B (-50%)" and table["q3-kv3"][5] == "3,072 B (+50%)"
    # MQA 5 x 1 keeps the parameters (query + KV heads = 6 per layer), MHA 2 x 2 has fewer
    assert params["q5-kv1"] == params["q4-kv2"] and table["q5-kv1"][4].endswith("(+0%)")
    assert params["q2-kv2"] < params["q4-kv2"]
    text = (out / "report" / "report.md").read_text()
    assert "in fp32, the runs' training precision; the CSV has bf16 too." in text and "n/a" not in text
    assert ("`q5-kv1` (4 layers x 5 heads, head_dim 32): eval loss 2.9400 vs 3.0000 for the baseline (lower, -2.00%), "
            "with +0% parameters, -50% KV-cache bytes per token and +0% peak memory.") in text
    rows = {r["variant"]: r for r in read_csv(out / "report" / "headline_table.csv")}
    assert list(rows) == list(KV_HEADS)  # the table's order
    for name, kv in KV_HEADS.items():
        r = rows[name]
        assert r["kv_heads"] == " ".join(map(str, kv)) and r["heads"] == " ".join([name[1]] * 4)
        assert int(r["kv_cache_fp32_bytes"]) == FP32[name] and int(r["kv_cache_bf16_bytes"]) == FP32[name] // 2
        assert int(r["params"]) == params[name]
    assert rows["q4-kv2"]["baseline"] == "True" and rows["q4-kv2"]["kv_cache_vs_baseline_pct"] == ""
    assert float(rows["q3-kv3"]["kv_cache_vs_baseline_pct"]) == 50.0
    assert float(rows["q5-kv1"]["loss_vs_baseline_pct"]) == -2.0


def test_bf16_runs_show_the_bf16_cache(tmp_path):
    study = load_study("kv-heads", preset="quick")
    out = tmp_path / "bf16"
    _fill(study, out, precision="bf16")
    table = _table(out)
    assert table["header"][5] == "KV cache / token (bf16)"
    # 2 x KV heads x 32 x 2 bytes: half the fp32 bytes, the same differences
    assert table["q4-kv2"][5] == f"{2 * 8 * 32 * 2:,} B" == "1,024 B"
    assert table["q5-kv1"][5] == "512 B (-50%)" and table["q4-kv-asc"][5] == "1,024 B (+0%)"


def test_summaries_without_the_kv_record_render_n_a(tmp_path):
    # runs of a headwise older than the record: the KV heads still come from the run config
    study = load_study("kv-heads", preset="quick")
    out = tmp_path / "old"
    _fill(study, out, recorded=lambda name: False)
    table = _table(out)
    assert table["header"][5] == "KV cache / token (fp32)"
    assert table["q4-kv2"][2] == "2" and table["q4-kv-asc"][2] == "1, 1, 2, 4" and table["q5-kv1"][2] == "1"
    assert all(table[name][5] == "n/a" for name in ("q4-kv2", "q4-kv-asc", "q5-kv1"))
    rows = read_csv(out / "report" / "headline_table.csv")
    assert all(r["kv_cache_fp32_bytes"] == r["kv_cache_bf16_bytes"] == "" for r in rows)
    # an old baseline: the others show their bytes, with no difference to draw
    out = tmp_path / "mixed"
    _fill(study, out, recorded=lambda name: name != "q4-kv2")
    table = _table(out)
    assert table["q4-kv2"][5] == "n/a" and table["q5-kv1"][5] == "1,024 B" and table["q4-kv-asc"][5] == "2,048 B"
    text = (out / "report" / "report.md").read_text()
    assert "n/a: the run's summary predates the record." in text
    assert "KV-cache bytes" not in text.split("## Findings")[1].split("##")[0]  # no difference to state


def _fill_depth(out: Path, kv: dict[str, dict[str, int]] | None) -> None:
    """The depth-for-heads quick study's runs (multi-head attention), with these KV records."""
    study = load_study("depth-for-heads", preset="quick")
    save_study(study, out, 1)
    for v in study.variants:
        m = v.config["model"]
        plan = plan_heads("explicit", m["n_layers"], 96, heads=m["heads"], head_dim=m.get("head_dim"))
        summary = RunSummary(status=RunStatus.COMPLETED, final_eval_loss=2.5, params=1_000_000, d_model=96, plan=plan,
                             kv_cache_bytes_per_token=None if kv is None else kv[v.name])
        write_run_dir(run_dir(out, v.name, 0), v.config, summary, [{"step": 10, "eval_loss": 2.5}])


def test_multi_head_tables_show_the_cache_only_where_it_differs(tmp_path):
    # fewer layers cache fewer heads: 12 x 12 at head_dim 8 against 4 x 16 at head_dims 8 and 6 (96 / 16)
    fp32 = {"l12-h12-hd8": 2 * 12 * 12 * 8 * 4, "l4-h16-hd8": 2 * 4 * 16 * 8 * 4, "l4-h16-dfixed": 2 * 4 * 16 * 6 * 4}
    _fill_depth(tmp_path / "differ", {k: {"fp32": b, "bf16": b // 2} for k, b in fp32.items()})
    table = _table(tmp_path / "differ")
    assert table["l12-h12-hd8"][2] == "12" and table["l12-h12-hd8"][5] == "9,216 B"
    assert table["l4-h16-hd8"][5] == f"{fp32['l4-h16-hd8']:,} B (-56%)" == "4,096 B (-56%)"
    assert table["l4-h16-dfixed"][5] == "3,072 B (-67%)"
    # the same cache everywhere, or none recorded: the table of multi-head models stays as it was
    for name, kv in (("same", {k: {"fp32": 4096, "bf16": 2048} for k in fp32}), ("none", None)):
        _fill_depth(tmp_path / name, kv)
        table = _table(tmp_path / name)
        assert table["header"] == ["model", "shape", "val. loss", "parameters", "peak memory"], name
        assert "KV cache" not in (tmp_path / name / "report" / "report.md").read_text().split("## Loss vs heads")[0]
        assert (tmp_path / name / "report" / "headline_table.csv").is_file()
