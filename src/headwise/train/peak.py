"""The peak FLOP/s a run's MFU is measured against, for its own device and precision.

A GPU NVIDIA lists takes the datasheet's dense peak. A CPU's peak is measured: a short square
matmul probe at start-up, cached per machine (CPU model, torch version, thread count and
precision) in ``$XDG_CACHE_HOME/headwise/peak_flops.json`` (``~/.cache`` by default), so a run
costs it once per machine, not once per run; ``headwise bench`` raises the cached figure when it
measures a higher one. Machines differ several-fold (a 2-core Xeon with
AMX: fp32 ~371, bf16 ~2,230 GFLOP/s; a 2-core AMD EPYC without it: ~194 and ~422), which is why
no fixed CPU figure is right. ``train.peak_flops`` in a run's config overrides both.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import torch

from headwise.config import atomic_write_text
from headwise.locks import FileLock

# NVIDIA's datasheet dense FLOP/s without sparsity, by precision (H100/H200 SXM: 989 TFLOP/s
# bf16, 67 TFLOP/s fp32 without TF32, which PyTorch leaves off for matmuls; H100 PCIe: 756 and
# 51; A100: 312 and 19.5), matched by name in this order.
GPU_PEAK_FLOPS = {
    "H100 PCIe": {"bf16": 756e12, "fp32": 51e12},
    "H100": {"bf16": 989e12, "fp32": 67e12},
    "H200": {"bf16": 989e12, "fp32": 67e12},
    "A100": {"bf16": 312e12, "fp32": 19.5e12},
}
# The start-up probe: the best of PROBE_REPS square matmuls of this size (~0.1-0.5 s in all on
# 2 cores; large enough that the library's packing and threading costs are small beside it).
PROBE_N = 2048
PROBE_REPS = 5
# ... or smaller, so that one matmul takes at most this long: a CPU without native bf16 matmuls
# runs them ~100x slower than fp32 (an AVX2-only AMD EPYC here: 0.7-1.4 GFLOP/s on one thread,
# ~25 s for one 2048^2 bf16 matmul, so the full probe took minutes on a busy machine)
PROBE_MAX_S = 1.0
CACHE_FILE = "peak_flops.json"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def cpu_model() -> str:
    """The CPU's model name, with family/model numbers when the name is vague (e.g. "AMD EPYC")
    and the matmul-relevant instruction sets."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.processor() or platform.machine()
    name = info.get("model name", platform.processor() or platform.machine())
    extra = []
    if "cpu family" in info:
        extra.append(f"family {info['cpu family']} model {info.get('model', '?')}")
    flags = set(info.get("flags", "").split())
    simd = [f for f in ("avx512f", "avx512_bf16", "amx_bf16", "avx2") if f in flags]
    if simd:
        extra.append(" ".join(simd))
    return f"{name} ({'; '.join(extra)})" if extra else name


def matmul_peak(dtype: torch.dtype, device: torch.device, n: int, reps: int = 3) -> float:
    """Best FLOP/s of ``reps`` square ``n x n`` matmuls in ``dtype``: this machine's matmul peak."""
    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    torch.mm(a, b)  # warm-up: library dispatch, packing buffers, clocks
    _synchronize(device)
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        torch.mm(a, b)
        _synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def probe_size(dtype: torch.dtype, largest: int, seconds: float = PROBE_MAX_S) -> int:
    """The size of the CPU start-up probe: the largest power of two up to ``largest`` whose square
    matmul in ``dtype`` should take at most ``seconds`` (one 128^2 matmul timed, scaled as n^3)."""
    n = min(128, largest)
    a = torch.randn(n, n).to(dtype)
    torch.mm(a, a)  # warm-up
    start = time.perf_counter()
    torch.mm(a, a)
    estimate = time.perf_counter() - start
    while 2 * n <= largest and 8 * estimate <= seconds:
        n, estimate = 2 * n, 8 * estimate
    return n


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cache_path() -> Path:
    """Where measured CPU peaks are kept: ``$XDG_CACHE_HOME/headwise/peak_flops.json``."""
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "headwise" / CACHE_FILE


def cpu_key(precision: str) -> str:
    """The cache key of this machine's CPU peak in ``precision``: what changes the figure."""
    return f"{cpu_model()} | torch {torch.__version__} | {torch.get_num_threads()} threads | {precision}"


def _read_cache(path: Path) -> dict[str, dict]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):  # none yet, or damaged: measured again and rewritten
        return {}
    return data if isinstance(data, dict) else {}


def _cached_flops(cache: dict[str, dict], key: str) -> float | None:
    entry = cache.get(key)
    flops = entry.get("flops") if isinstance(entry, dict) else None
    return float(flops) if isinstance(flops, (int, float)) and flops > 0 else None


def measured_cpu_peak(precision: str) -> tuple[float, str]:
    """This CPU's matmul peak in ``precision`` (FLOP/s), from the cache or measured now and
    cached; and where it came from."""
    path, key = cache_path(), cpu_key(precision)
    cached = _cached_flops(_read_cache(path), key)
    if cached is not None:
        return cached, f"measured {precision} matmul peak of this CPU ({key}; cached in {path})"
    n = probe_size(DTYPES[precision], PROBE_N)
    flops = matmul_peak(DTYPES[precision], torch.device("cpu"), n, PROBE_REPS)
    kept = remember_cpu_peak(precision, flops, f"{n}x{n} matmul, best of {PROBE_REPS}")
    return flops, (f"measured {precision} matmul peak of this CPU ({key}; at start-up, "
                   + (f"cached in {path})" if kept else "not cached)"))


def remember_cpu_peak(precision: str, flops: float, how: str) -> bool:
    """Keep ``flops`` as this CPU's peak in ``precision`` unless the cache holds a higher figure
    (a probe on a busy machine reads low; ``headwise bench`` offers the peaks it measures before
    each round, so a machine's figure only improves). Returns whether the cache holds it or a
    higher one."""
    path, key = cache_path(), cpu_key(precision)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Runs of a study and the bench may write at once: read, compare and write under one lock,
        # or one process's new entry could replace another's.
        with FileLock(path.parent / f"{path.name}.lock"):
            cache = _read_cache(path)
            old = _cached_flops(cache, key)
            if old is not None and old >= flops:
                return True
            cache[key] = {"flops": flops, "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                          "probe": how}
            atomic_write_text(path, json.dumps(cache, indent=1) + "\n")
    except OSError:  # a read-only home: the figure still holds for this run
        return False
    return True


def default_peak_flops(device: torch.device, precision: str) -> tuple[float | None, str]:
    """Peak FLOP/s of one ``device`` in ``precision`` ("fp32" or "bf16") and where the figure
    comes from: a known GPU's datasheet, a CPU's measured (cached) matmul peak, else None."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, peaks in GPU_PEAK_FLOPS.items():
            if key in name:
                return peaks[precision], f"datasheet dense {precision} peak of {key}"
        return None, f"no known peak for {name}: set train.peak_flops"
    if device.type == "cpu":
        return measured_cpu_peak(precision)
    return None, f"no known peak for a {device.type} device: set train.peak_flops"
