"""The ``timm-memory`` section of ``headwise bench``: the paper's numbers, the section's arithmetic
and report on canned measurements, its refusal without timm, and the measure itself on two small
ViTs in fresh processes, held to the 16 bytes per parameter that fp32 training with AdamW must hold."""

import dataclasses
import json

import pytest
import torch

from headwise.bench.report import evaluate_targets, render_markdown
from headwise.bench.sections import SuiteRun, default_section_names, section_names
from headwise.bench.settings import BenchConfig
from headwise.errors import HeadwiseError
from headwise.families.vision import bench_timm_memory as tm
from headwise.families.vision.timm_presets import PRESETS

QUICK = BenchConfig.quick_config()


def test_the_section_is_registered_among_the_families():
    names = section_names()
    assert "timm-memory" in names
    assert names.index("vision") < names.index("timm-memory") < names.index("gpu")
    # minutes of 224 px training steps: only when --only names it, not in a plain `headwise bench`
    assert "timm-memory" not in default_section_names()


def test_the_sections_pairs_are_the_11_originals_of_tables_4_and_5_and_their_reduced_forms():
    originals = tm.MemorySizes().originals
    assert len(originals) == 11
    assert {*originals, *(f"{n}-reduced" for n in originals)} == {p.name for p in PRESETS}


def test_sizes_quick_full_and_the_paper_batch_on_cuda():
    quick, full = tm.MemorySizes.of(QUICK), tm.MemorySizes.of(BenchConfig())
    assert quick.originals == ("timm-vit-b", "timm-xcit-m") and quick.batch == 1
    vit_l = next(p for p in PRESETS if p.name == "timm-vit-l")
    vit_b = next(p for p in PRESETS if p.name == "timm-vit-b")
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert (full.batch_of(vit_b, cpu), full.batch_of(vit_b, cuda), full.batch_of(vit_l, cuda)) == (4, 128, 64)
    assert quick.batch_of(vit_l, cuda) == 1


def _canned(monkeypatch, fail: str | None = None):
    """``measure`` answering peak = 10 bytes per parameter of the preset (a failure for ``fail``)."""
    def key(model, changes):
        return model, json.dumps({k: v for k, v in changes.items() if v is not None}, sort_keys=True)

    presets = {key(p.model, dataclasses.asdict(p.changes)): p for p in PRESETS}
    jobs = []

    def fake(job):
        jobs.append(job)
        preset = presets[key(job.model, job.changes)]
        if preset.name == fail:
            raise HeadwiseError(f"measuring the training memory of {job.model!r} failed: Killed")
        return {"peak_bytes": 10 * preset.params, "params": preset.params}

    monkeypatch.setattr(tm, "measure", fake)
    return jobs


def _run(sections=frozenset({"timm-memory"}), cfg=QUICK):
    run = SuiteRun(cfg, frozenset(sections), {"load": {}}, lambda msg: None)
    tm.measure_timm_memory(run)
    return run.result


@pytest.fixture
def with_timm(monkeypatch):
    monkeypatch.setattr(tm, "unavailable", lambda: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_the_section_derives_ratios_and_reports_them(monkeypatch, with_timm):
    jobs = _canned(monkeypatch)
    part = _run()["timm_memory"]
    assert [(j.model, j.batch, j.image_size, j.device) for j in jobs] == [
        ("vit_base_patch16_224", 1, 224, "cpu"), ("vit_base_patch16_224", 1, 224, "cpu"),
        ("xcit_medium_24_p16_224", 1, 224, "cpu"), ("xcit_medium_24_p16_224", 1, 224, "cpu")]
    vit = part["pairs"][0]
    assert (vit["original_bytes"], vit["reduced_bytes"]) == (865_676_560, 401_128_720)
    assert vit["ratio"] == pytest.approx(40_112_872 / 86_567_656) == pytest.approx(vit["params_ratio"])
    assert vit["paper_ratio"] == pytest.approx(101.6 / 178.4)
    assert part["pairs"][1]["paper_ratio"] == pytest.approx(196.0 / 320.8)
    result = {"timm_memory": part}
    [t] = evaluate_targets(result)
    assert t["met"] is True and t["shown"] == "0.70x (timm-xcit-m)"  # 59.0M / 84.4M, the worse pair
    text = "\n".join(tm.timm_memory_table(result))
    assert "| timm-vit-b | 4 | 1 | 0.81 | 0.37 | 0.46 | 178.4 -> 101.6 | 0.57 | 0.46 |" in text


def test_a_failed_measurement_is_recorded_and_the_rest_go_on(monkeypatch, with_timm):
    _canned(monkeypatch, fail="timm-vit-b-reduced")
    pairs = _run()["timm_memory"]["pairs"]
    assert "Killed" in pairs[0]["failed"] and "ratio" not in pairs[0]
    assert pairs[1]["ratio"] == pytest.approx(59_002_600 / 84_395_752)
    assert "failed: measuring the training memory of 'vit_base_patch16_224' failed: Killed" in \
        "\n".join(tm.timm_memory_table({"timm_memory": {"device": "cpu", "precision": "fp32", "image_size": 224,
                                                        "steps": 2, "measure": "m", "pairs": pairs}}))


def test_without_timm_the_section_is_skipped_with_the_reason_or_refused_alone(monkeypatch):
    monkeypatch.setattr(tm, "unavailable", lambda: "timm is not installed (pip install 'headwise[vision]')")
    with pytest.raises(HeadwiseError, match="section 'timm-memory' cannot run: timm is not installed"):
        _run()
    result = _run({"timm-memory", "vision"})
    assert result["timm_memory"] == {"skipped": "timm is not installed (pip install 'headwise[vision]')"}
    assert evaluate_targets(result) == [] or all("timm" not in t["target"] for t in evaluate_targets(result))
    assert "skipped: timm is not installed" in "\n".join(tm.timm_memory_table(result))


def test_the_report_shows_the_section(monkeypatch, with_timm):
    _canned(monkeypatch)
    result = {"quick": True, "date": "d", "config": dataclasses.asdict(QUICK), "wall_time_s": 1.0,
              "machine": {"cpu": "c", "cores": 2, "torch_threads": 2, "torch": "t", "python": "p"},
              "load": {}, "training": [], **{k: v for k, v in _run().items() if k == "timm_memory"}}
    text = render_markdown(result)
    assert "## Training memory of Leaner's timm models (cpu, fp32, 224 px)" in text
    assert "timm training memory, reduced / original (worst pair)" in text


def _small_vit(depth: int, heads: int, mlp_ratio: float, head_dim: int | None = None) -> tm.Job:
    # 32 px images of 16 px patches: 5 positions, so activations are a few hundred KiB and the
    # peak is the 16 bytes per parameter of weights, gradients and AdamW's two moments
    changes = dict(depth=depth, heads=heads, embed_dim=384, mlp_ratio=mlp_ratio)
    if head_dim:
        changes["head_dim"] = head_dim
    return tm.Job("vit_base_patch16_224", changes, batch=1, device="cpu", threads=1, image_size=32, num_classes=10)


@pytest.mark.skipif(tm.unavailable() is not None, reason=f"the measure needs timm: {tm.unavailable()}")
def test_the_measure_is_16_bytes_a_parameter_and_larger_for_the_larger_model():
    original = tm.measure(_small_vit(6, 6, 4.0))
    reduced = tm.measure(_small_vit(3, 12, 2.0, head_dim=64))  # Leaner's change: fewer layers, more heads
    # timm's counts by hand; outside the blocks: patches, class token, positions, final norm, head
    d, outside = 384, 3 * 16 * 16 * 384 + 384 + 384 + 5 * 384 + 2 * 384 + 384 * 10 + 10
    assert original["params"] == 6 * (12 * d * d + 13 * d) + outside == 10_949_002
    # 12 heads of 64: q, k, v and the output projection 768 wide; MLP 768
    assert reduced["params"] == 3 * (3 * 768 * d + 3 * 768 + 768 * d + d + 2 * (2 * d * d) + 768 + d + 4 * d) + outside
    for got in (original, reduced):
        floor = 16 * got["params"]
        # above: what must be live; the margin: activations, kernel scratch, small tensors on the heap
        assert floor <= got["peak_bytes"] <= floor + 24 * 2**20, (got, floor)
    assert original["peak_bytes"] > reduced["peak_bytes"] + 16 * (original["params"] - reduced["params"]) * 0.9
