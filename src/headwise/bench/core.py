"""Measurement primitives: interleaved timing, the matmul peak, the machine and its load.

Everything compared is timed in one process, in rounds: each round runs every case once, in an
order shuffled afresh (seeded) every round, so that neither a drift of the machine's speed nor a
burst of other work on shared cores falls systematically on one case. A ratio is the median of
the per-round ratios (both sides timed in the same round); the ratio of medians is kept beside it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import datetime as _dt
import os
import platform
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels (CUDA launches are asynchronous; the CPU needs nothing)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleave(
    cases: dict[str, Callable[[], Any]],
    rounds: int,
    warmup: int,
    device: torch.device,
    *,
    before_round: Callable[[int], None] | None = None,
    progress: Callable[[str], None] | None = None,
    seed: int = 0,
) -> dict[str, list[float]]:
    """Run every case ``warmup`` times untimed, then ``rounds`` timed rounds; seconds per call.

    Each round runs the cases in a fresh random order (``random.Random(seed)``), so a change in
    the machine's speed does not fall on the same cases every round. ``before_round(r)`` runs
    before round ``r`` (used to measure the matmul peak beside the steps it normalises).
    """
    names = list(cases)
    for w in range(warmup):
        for name in names:
            if progress:
                progress(f"warm-up {w + 1}/{warmup}: {name}")
            cases[name]()
            synchronize(device)
    samples: dict[str, list[float]] = {name: [] for name in names}
    rng = random.Random(seed)
    for r in range(rounds):
        if before_round is not None:
            before_round(r)
        for name in rng.sample(names, len(names)):
            if progress:
                progress(f"round {r + 1}/{rounds}: {name}")
            synchronize(device)
            start = time.perf_counter()
            cases[name]()
            synchronize(device)
            samples[name].append(time.perf_counter() - start)
    return samples


def median(values: list[float]) -> float:
    """The median (statistics.median), NaN for no values."""
    return statistics.median(values) if values else float("nan")


def ratio_stats(numerator: list[float], denominator: list[float]) -> dict[str, Any]:
    """Compare two per-round rate series measured in the same rounds.

    ``ratio`` is the median of the per-round ratios ``paired`` (each from one round, so the
    machine's state is shared); ``ratio_of_medians`` divides the two medians.
    """
    paired = [a / b for a, b in zip(numerator, denominator)]
    return {
        "ratio": median(paired),
        "ratio_of_medians": median(numerator) / median(denominator),
        "paired": paired,
    }


def matmul_peak(dtype: torch.dtype, device: torch.device, n: int, reps: int = 3) -> float:
    """Best FLOP/s of ``reps`` square ``n x n`` matmuls in ``dtype``: this machine's matmul peak."""
    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    torch.mm(a, b)  # warm-up: library dispatch, packing buffers, clocks
    synchronize(device)
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        torch.mm(a, b)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


_allocator_tuned = False


def allocator_tuned() -> bool:
    """Whether :func:`tune_cpu_allocator` has been applied in this process."""
    return _allocator_tuned


def tune_cpu_allocator() -> bool:
    """Keep freed memory in glibc's heap instead of returning it to the kernel.

    A training step of a large-vocabulary model allocates and frees ~0.5 GB tensors (logits and
    their gradient); by default glibc serves each from a fresh ``mmap`` and unmaps it on free, so
    every step page-faults all of it in again (measured here: ~4x the minor faults and ~20% of
    the step in the kernel). ``mallopt`` turns that off for this process (which then keeps its
    peak memory until it exits: call it at the start of a benchmark or training process, not in
    a library). Returns whether it applied (glibc only).
    """
    global _allocator_tuned
    if platform.system() != "Linux":
        return False
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        m_trim_threshold, m_mmap_max = -1, -4
        ok = libc.mallopt(m_mmap_max, 0) == 1
        ok = libc.mallopt(m_trim_threshold, 2**31 - 1) == 1 and ok
    except (OSError, AttributeError):
        return False
    _allocator_tuned = _allocator_tuned or ok
    return ok


def _cpu_model() -> str:
    """The CPU's model name, with family/model numbers when the name is vague (e.g. "AMD EPYC")."""
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


def machine_info(device: torch.device) -> dict[str, Any]:
    """What the numbers were measured on: CPU, cores, threads, memory, libraries, GPU."""
    info: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
    }
    try:
        import psutil

        info["memory_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        pass
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        info["transformers"] = None
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def load_snapshot() -> dict[str, Any]:
    """The machine's load now: load averages and, where the kernel has it, CPU pressure (PSI)."""
    snap: dict[str, Any] = {"time": now_iso()}
    try:
        snap["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        snap["loadavg"] = None
    try:
        # "some avg10=.. avg60=.. avg300=.. total=..": share of time some task waited for a CPU
        first = Path("/proc/pressure/cpu").read_text().splitlines()[0].split()
        snap["cpu_pressure_avg60"] = float(dict(kv.split("=") for kv in first[1:])["avg60"])
    except (OSError, IndexError, KeyError, ValueError):
        snap["cpu_pressure_avg60"] = None
    return snap


def now_iso() -> str:
    """The current UTC time, ISO 8601 to the second."""
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
