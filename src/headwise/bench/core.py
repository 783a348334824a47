"""Measurement primitives: interleaved timing, the matmul peak, the machine and its load.

Everything compared is timed in one process, in rounds: each round runs every case once, in an
order shuffled afresh (seeded) every round, so that neither a drift of the machine's speed nor a
burst of other work on shared cores falls systematically on one case. A ratio is the median of
the per-round ratios (both sides timed in the same round); the ratio of medians is kept beside it.

On a shared machine other jobs' bursts distort samples badly (a parallel region of an op can
wait milliseconds for a descheduled OpenMP worker). Each sample therefore records the share of
its time some task waited for a CPU (Linux PSI); statistics use the quiet samples (stall below
:data:`QUIET_STALL`) when there are at least two, and say so.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from headwise.train.allocator import allocator_tuned, tune_cpu_allocator
from headwise.train.peak import cpu_model, matmul_peak


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels (CUDA launches are asynchronous; the CPU needs nothing)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# A sample is "quiet" when other work kept a runnable task of the machine waiting for a CPU less
# than this share of the sample's time (Linux pressure-stall information, /proc/pressure/cpu).
QUIET_STALL = 0.10


def cpu_stall_seconds() -> float | None:
    """Total time some task waited for a CPU since boot (PSI "some"), or None without PSI."""
    try:
        first = Path("/proc/pressure/cpu").read_text().split("\n", 1)[0].split()
        return int(dict(kv.split("=") for kv in first[1:])["total"]) / 1e6
    except (OSError, KeyError, ValueError):
        return None


def cpu_busy_share(window: float = 0.5) -> float | None:
    """Share of all cores busy (not idle or waiting for I/O) over ``window`` seconds."""

    def read() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]
        return sum(fields) - idle, sum(fields)

    try:
        busy0, total0 = read()
        time.sleep(window)
        busy1, total1 = read()
    except (OSError, ValueError, IndexError):
        return None
    return (busy1 - busy0) / max(total1 - total0, 1)


def wait_for_idle(max_wait: float, threshold: float = 0.15) -> float:
    """Wait (at most ``max_wait`` seconds) until the cores are idle while we are: other jobs'
    bursts then fall less often inside a timed sample. Returns the seconds waited."""
    start = time.perf_counter()
    while time.perf_counter() - start < max_wait:
        busy = cpu_busy_share()
        if busy is None or busy < threshold:
            break
    return time.perf_counter() - start


@dataclass
class Timings:
    """Seconds per call of every case, and the share of each call other work stalled a CPU
    (None where the kernel has no PSI)."""

    seconds: dict[str, list[float]]
    stall: dict[str, list[float | None]]
    waited: float = 0.0

    def quiet(self, name: str) -> list[bool]:
        """Per sample of ``name``: was the machine quiet? (see :func:`quiet_mask`)"""
        return quiet_mask(self.stall[name])

    def rates(self, name: str, per_sample: int, unit: str = "tokens") -> dict[str, Any]:
        """Case ``name``'s samples as rates (``per_sample`` units per sample, e.g. tokens or images):
        ``{unit}_per_s`` per sample and ``{unit}_per_s_median`` over its quiet samples when it has
        two or more (see :func:`pick_quiet`), beside the raw seconds and CPU stall."""
        rates = [per_sample / s for s in self.seconds[name]]
        use, basis = pick_quiet(self.quiet(name))
        return {"seconds": self.seconds[name], "cpu_stall": self.stall[name], f"{unit}_per_s": rates, "basis": basis,
                f"{unit}_per_s_median": median([rates[i] for i in use])}

    def cases(self, meta: dict[str, dict[str, Any]], per_sample: int, unit: str = "tokens") -> dict[str, Any]:
        """Every case's ``meta`` with its :meth:`rates`."""
        return {name: {**m, **self.rates(name, per_sample, unit)} for name, m in meta.items()}


def quiet_mask(*stalls: list[float | None]) -> list[bool]:
    """Per sample: was the machine quiet in every one of the given stall series, measured in the
    same rounds (stall below :data:`QUIET_STALL`, or unknown)?"""
    return [all(x is None or x < QUIET_STALL for x in xs) for xs in zip(*stalls)]


def interleave(
    cases: dict[str, Callable[[], Any]],
    rounds: int,
    warmup: int,
    device: torch.device,
    *,
    before_round: Callable[[int], None] | None = None,
    progress: Callable[[str], None] | None = None,
    seed: int = 0,
    idle_wait: float = 0.0,
) -> Timings:
    """Run every case ``warmup`` times untimed, then ``rounds`` timed rounds.

    Each round runs the cases in a fresh random order (``random.Random(seed)``), so a change in
    the machine's speed does not fall on the same cases every round. Before each round it waits
    up to ``idle_wait`` seconds for the other jobs on the machine to go quiet, then runs
    ``before_round(r)`` (used to measure the matmul peak beside the steps it normalises). Each
    sample records how much of its time other work kept a CPU contended (see :class:`Timings`).
    """
    names = list(cases)
    for w in range(warmup):
        for name in names:
            if progress:
                progress(f"warm-up {w + 1}/{warmup}: {name}")
            cases[name]()
            synchronize(device)
    out = Timings({name: [] for name in names}, {name: [] for name in names})
    rng = random.Random(seed)
    for r in range(rounds):
        if idle_wait > 0:
            out.waited += wait_for_idle(idle_wait)
        if before_round is not None:
            before_round(r)
        for name in rng.sample(names, len(names)):
            if progress:
                progress(f"round {r + 1}/{rounds}: {name}")
            synchronize(device)
            stall0 = cpu_stall_seconds()
            start = time.perf_counter()
            cases[name]()
            synchronize(device)
            elapsed = time.perf_counter() - start
            stall1 = cpu_stall_seconds()
            out.seconds[name].append(elapsed)
            out.stall[name].append(None if stall0 is None or stall1 is None else (stall1 - stall0) / elapsed)
    return out


def median(values: list[float]) -> float:
    """The median (statistics.median), NaN for no values."""
    return statistics.median(values) if values else float("nan")


def pick_quiet(mask: list[bool], minimum: int = 2) -> tuple[list[int], str]:
    """Indices of the samples to use: the quiet ones when there are at least ``minimum``,
    else all; and a note saying which."""
    quiet = [i for i, ok in enumerate(mask) if ok]
    if len(quiet) >= minimum:
        return quiet, f"{len(quiet)}/{len(mask)} quiet"
    return list(range(len(mask))), f"all {len(mask)} ({len(quiet)} quiet)"


def ratio_stats(numerator: list[float], denominator: list[float],
                quiet: list[bool] | None = None) -> dict[str, Any]:
    """Compare two per-round rate series measured in the same rounds.

    ``ratio`` is the median of the per-round ratios ``paired`` (each from one round, so the
    machine's state is shared), over the rounds where both samples were quiet (``quiet``, when
    at least two) else all; ``ratio_of_medians`` divides the two medians over the same rounds.
    """
    paired = [a / b for a, b in zip(numerator, denominator)]
    use, basis = pick_quiet(quiet if quiet is not None else [True] * len(paired))
    return {
        "ratio": median([paired[i] for i in use]),
        "ratio_of_medians": median([numerator[i] for i in use]) / median([denominator[i] for i in use]),
        "paired": paired,
        "basis": basis,
    }


def case_ratio(cases: dict[str, dict[str, Any]], numerator: str, denominator: str,
               unit: str = "tokens") -> dict[str, Any]:
    """:func:`ratio_stats` of two cases of one section (their ``{unit}_per_s``), over the rounds
    in which both were quiet."""
    a, b = cases[numerator], cases[denominator]
    return ratio_stats(a[f"{unit}_per_s"], b[f"{unit}_per_s"], quiet_mask(a["cpu_stall"], b["cpu_stall"]))


def optimizer_settings(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The AdamW settings a section records (learning rate, betas, decay, implementation)."""
    return {k: optimizer.defaults.get(k) for k in ("lr", "betas", "weight_decay", "fused", "foreach")}


def versus_hf(hf_model: torch.nn.Module, attn_implementation: str, optimizer: torch.optim.Optimizer,
              timings: Timings, cases: dict[str, Any]) -> dict[str, Any]:
    """The fields that end a section timed against a Hugging Face model: its parameters and
    attention implementation, headwise's AdamW settings, the wait for quiet, and the cases."""
    return {"hf_params": sum(p.numel() for p in hf_model.parameters()), "hf_attn_implementation": attn_implementation,
            "optimizer": optimizer_settings(optimizer), "idle_wait_s": timings.waited, "cases": cases}


def machine_info(device: torch.device) -> dict[str, Any]:
    """What the numbers were measured on: CPU, cores, threads, memory, libraries, GPU."""
    info: dict[str, Any] = {
        "cpu": cpu_model(),
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
