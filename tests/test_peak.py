"""The peak FLOP/s a run's MFU divides by: measured once per machine on a CPU (cached), a
datasheet figure on a known GPU, and the summary says which."""

import json

import pytest
import torch

from headwise.train import peak


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(peak, "PROBE_N", 64)  # a tiny probe: the test checks the plumbing
    return tmp_path / "headwise" / "peak_flops.json"


def test_cpu_peak_is_measured_once_then_read_from_the_cache(cache_home, monkeypatch):
    flops, source = peak.default_peak_flops(torch.device("cpu"), "fp32")
    assert flops > 0 and source.startswith("measured fp32 matmul peak of this CPU")
    assert "at start-up, cached in" in source and str(cache_home) in source
    entry = json.loads(cache_home.read_text())[peak.cpu_key("fp32")]
    assert entry["flops"] == flops and "measured" in entry

    def no_probe(*args, **kwargs):
        raise AssertionError("the cached figure should be used")

    monkeypatch.setattr(peak, "matmul_peak", no_probe)
    again, source = peak.default_peak_flops(torch.device("cpu"), "fp32")
    assert again == flops and "; cached in" in source and "at start-up" not in source


def test_the_cache_key_holds_what_changes_the_figure(cache_home, monkeypatch):
    calls = []
    monkeypatch.setattr(peak, "matmul_peak", lambda dtype, *a: calls.append(dtype) or 1e9)
    peak.default_peak_flops(torch.device("cpu"), "fp32")
    peak.default_peak_flops(torch.device("cpu"), "bf16")  # another precision: a miss
    key = peak.cpu_key("fp32")
    assert peak.cpu_model() in key and torch.__version__ in key and f"{torch.get_num_threads()} threads" in key
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)  # another thread count: a miss
        peak.default_peak_flops(torch.device("cpu"), "fp32")
    finally:
        torch.set_num_threads(threads)
    peak.default_peak_flops(torch.device("cpu"), "fp32")  # a hit
    assert calls == [torch.float32, torch.bfloat16, torch.float32]
    assert len(json.loads(cache_home.read_text())) == 3


def test_a_damaged_cache_is_measured_again(cache_home):
    cache_home.parent.mkdir(parents=True)
    cache_home.write_text("{not json")
    flops, source = peak.default_peak_flops(torch.device("cpu"), "bf16")
    assert flops > 0 and "at start-up" in source
    assert json.loads(cache_home.read_text())[peak.cpu_key("bf16")]["flops"] == flops


@pytest.mark.parametrize("name, precision, expected", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989e12), ("NVIDIA H100 PCIe", "fp32", 51e12),
    ("NVIDIA H200", "bf16", 989e12), ("NVIDIA A100-SXM4-40GB", "fp32", 19.5e12),
])
def test_known_gpus_take_the_datasheet_peak(name, precision, expected, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    flops, source = peak.default_peak_flops(torch.device("cuda", 0), precision)
    assert flops == expected and source.startswith(f"datasheet dense {precision} peak of")


def test_unknown_devices_have_no_peak(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some GPU")
    assert peak.default_peak_flops(torch.device("cuda", 0), "bf16") == (
        None, "no known peak for Some GPU: set train.peak_flops")
    flops, source = peak.default_peak_flops(torch.device("mps"), "fp32")
    assert flops is None and "set train.peak_flops" in source


def test_a_higher_measurement_replaces_the_cached_peak_a_lower_one_does_not(cache_home):
    flops, _ = peak.default_peak_flops(torch.device("cpu"), "fp32")
    assert peak.remember_cpu_peak("fp32", flops / 2, "a busy probe")
    assert peak.default_peak_flops(torch.device("cpu"), "fp32")[0] == flops
    assert peak.remember_cpu_peak("fp32", flops * 2, "headwise bench")
    assert peak.default_peak_flops(torch.device("cpu"), "fp32")[0] == flops * 2
    assert json.loads(cache_home.read_text())[peak.cpu_key("fp32")]["probe"] == "headwise bench"


def test_the_probe_shrinks_where_matmuls_are_slow(monkeypatch):
    # a CPU without native bf16 matmuls runs them ~100x slower: the probe must stay short there
    assert peak.probe_size(torch.float32, 64) == 64  # never larger than asked
    clock = iter([0.0, 0.004])  # one 128^2 matmul "took" 4 ms (about 1 GFLOP/s)
    monkeypatch.setattr(peak.time, "perf_counter", lambda: next(clock))
    # 256^2 would take ~32 ms, 512^2 ~0.26 s: over the 0.25 s budget
    assert peak.probe_size(torch.bfloat16, 2048, seconds=0.25) == 256
    clock = iter([0.0, 1e-5])
    monkeypatch.setattr(peak.time, "perf_counter", lambda: next(clock))
    assert peak.probe_size(torch.float32, 2048, seconds=0.25) == 2048

