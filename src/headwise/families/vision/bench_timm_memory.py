"""The ``timm-memory`` section of ``headwise bench``: peak training memory of Leaner Transformers'
original and reduced timm models (Tables 4-5, :mod:`headwise.families.vision.timm_presets`), their
reduced / original ratio beside the paper's Memory column and the parameter ratio.

What is measured: two training steps (forward, cross-entropy on random labels, backward, the
trainer's AdamW step, gradients released) on random 224 px images; the second is the steady state,
AdamW's moments already allocated. Its peak counts what a training step holds at once: weights,
gradients, the two moments and the activations. Each model runs in a fresh Python process, so no
model's memory stays behind for the next, and the measure starts from that process's own baseline,
taken after the imports, a small warm-up step (torch's thread pool and kernel libraries start
lazily) and a weightless build of the same model on the meta device (which imports its timm module:
~60 MiB of Python, which would otherwise count as the model's):

- CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, less what was
  allocated at the baseline: the bytes of live tensors at their peak.
- CPU: torch has no allocator statistics for the CPU, so the process's peak resident set size
  since the baseline less its resident size there: on Linux the kernel's high-water mark is reset
  at the baseline (``/proc/self/clear_refs``) and read as ``VmHWM``; ``getrusage``'s
  ``ru_maxrss`` is no measure there, since a process started from a large one (a test runner)
  inherits that one's high-water mark across ``exec``. Elsewhere ``ru_maxrss``. With glibc's mmap
  threshold fixed at 128 KiB (``GLIBC_TUNABLES``): every tensor of 128 KiB or more is then its own
  mapping, returned to the kernel when freed, so the high-water mark follows the live tensors
  rather than the heap's fragmentation (glibc's default moves the threshold up and keeps freed
  blocks: 50 MiB more on reduced ViT-B at batch 1). Checked against the exact peak of live tensor bytes from
  torch.profiler's memory timeline (a private API, and slow, so not the measure itself) on ViT-B
  and its reduced form at batch 1: 1,347.6 MiB against 1,332.2 MiB and 635.7 MiB against 623.4 MiB.
  The ~12 MiB more (kernel scratch, the autograd graph, small tensors on the heap) is the same for
  every model: two small ViTs on 5 positions peak 12.7 and 12.1 MiB above their 16 bytes per
  parameter. Outside glibc the threshold setting is ignored and the peak includes what the
  allocator keeps.

The paper measured on 8 A100s at its training batch (1,024 images for the base models, 512 for
the large, Table 6), in GB as its tables print them, without saying more. At the CPU's small
batches (1 with ``--quick``, else 4) a step's memory is mostly the 16 bytes per parameter of fp32
weights, gradients and moments, so the CPU ratios sit near the parameter ratio; on CUDA the section
trains at the paper's batch per GPU (128 and 64), where activations weigh as they did for the paper.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from headwise.bench.report import target
from headwise.bench.sections import BenchSection, SuiteRun, measure_part, of_part, register_section
from headwise.bench.settings import BenchConfig
from headwise.bench.training import make_optimizer
from headwise.errors import HeadwiseError
from headwise.families.vision.bench import make_image_step
from headwise.families.vision.timm_models import TimmChanges, build_timm_model, timm_unavailable
from headwise.families.vision.timm_presets import PRESETS, TimmPreset, timm_preset

#: the paper's batch per GPU (Table 6: 1,024 base and 512 large over 8 A100s), by table
PAPER_GPU_BATCH = {4: 128, 5: 64}
#: glibc's mmap threshold for the measured process (see the module doc)
MMAP_THRESHOLD = 128 * 1024
#: the training steps a measurement runs: the last is the steady state
STEPS = 2


@dataclass(frozen=True)
class MemorySizes:
    """The section's pairs (the originals' preset names), the batch, and whether CUDA trains at
    the paper's batch per GPU instead."""

    originals: tuple[str, ...] = tuple(p.name for p in PRESETS if not p.name.endswith("-reduced"))
    batch: int = 4
    paper_batch_on_cuda: bool = True
    image_size: int = 224

    @classmethod
    def of(cls, cfg: BenchConfig) -> MemorySizes:
        """The full run's sizes, or ``--quick``'s: ViT-B and XCiT-M at batch 1 on any device."""
        return cls(originals=("timm-vit-b", "timm-xcit-m"), batch=1, paper_batch_on_cuda=False) if cfg.quick \
            else cls()

    def batch_of(self, preset: TimmPreset, device: torch.device) -> int:
        """Images per step of ``preset`` on ``device``."""
        return PAPER_GPU_BATCH[preset.table] if device.type == "cuda" and self.paper_batch_on_cuda else self.batch


@dataclass(frozen=True)
class Job:
    """One measurement, as the measured process receives it (JSON on its command line)."""

    model: str
    changes: dict[str, Any]
    batch: int
    device: str
    threads: int
    image_size: int = 224
    num_classes: int = 1000


def _changes(job: Job) -> TimmChanges:
    """The job's changes, JSON's lists back to per-stage tuples."""
    return TimmChanges(**{k: tuple(v) if isinstance(v, list) else v for k, v in job.changes.items()})


def _warm_up(device: torch.device) -> None:
    """Two training steps of a small model, so that torch's lazily started thread pool and kernel
    libraries are running before the baseline."""
    small = nn.Sequential(nn.Conv2d(3, 8, 4, 4), nn.Flatten(), nn.LayerNorm(128), nn.GELU(), nn.Linear(128, 10))
    small = small.to(device)
    step = make_image_step(small, make_optimizer(small, device), torch.randn(2, 3, 16, 16, device=device),
                           torch.tensor([1, 2], device=device))
    step()
    step()


def _resident_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


_STATUS, _CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")


def _reset_peak_resident() -> None:
    """Start the kernel's high-water mark of this process's resident size afresh (Linux: "5")."""
    if _CLEAR_REFS.exists():
        _CLEAR_REFS.write_text("5")


def _peak_resident_bytes() -> int:
    """The peak resident size since :func:`_reset_peak_resident` (Linux), else since the start."""
    if _STATUS.exists():
        return int(re.search(r"VmHWM:\s+(\d+) kB", _STATUS.read_text()).group(1)) * 1024
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


def measure_job(job: Job) -> dict[str, int]:
    """Run :data:`STEPS` training steps of ``job``'s model in this process and return its peak
    training memory in bytes over the baseline (see the module doc) and its parameter count. Meant
    for a fresh process: :func:`measure` starts one."""
    import gc

    device = torch.device(job.device)
    torch.set_num_threads(job.threads)
    torch.manual_seed(0)
    changes = _changes(job)
    _warm_up(device)
    with torch.device("meta"):
        build_timm_model(job.model, changes, num_classes=job.num_classes, image_size=job.image_size)
    gc.collect()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    else:
        _reset_peak_resident()
    baseline = torch.cuda.memory_allocated(device) if cuda else _resident_bytes()
    model = build_timm_model(job.model, changes, num_classes=job.num_classes, image_size=job.image_size)
    model = model.to(device).train()
    images = torch.randn(job.batch, 3, job.image_size, job.image_size, device=device)
    labels = torch.randint(0, job.num_classes, (job.batch,), device=device)
    step = make_image_step(model, make_optimizer(model, device), images, labels)
    for _ in range(STEPS):
        step()
    if cuda:
        torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) if cuda else _peak_resident_bytes()
    return {"peak_bytes": peak - baseline, "params": sum(p.numel() for p in model.parameters())}


def measure(job: Job, timeout: float | None = None) -> dict[str, int]:
    """:func:`measure_job` in a fresh Python process (its own peak, nothing of earlier models),
    with glibc's mmap threshold fixed; refuses, with the process's last words, when it fails."""
    env = dict(os.environ)
    tunable = f"glibc.malloc.mmap_threshold={MMAP_THRESHOLD}"
    env["GLIBC_TUNABLES"] = ":".join(filter(None, (env.get("GLIBC_TUNABLES"), tunable)))
    # the child imports this headwise, wherever the parent found it
    root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (root, env.get("PYTHONPATH"))))
    proc = subprocess.run([sys.executable, "-m", __name__, json.dumps(dataclasses.asdict(job))], env=env,
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise HeadwiseError(f"measuring the training memory of {job.model!r} failed: {last}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def unavailable() -> str | None:
    """Why the section cannot run here (``None``: it can): no timm, or no measure on the CPU."""
    no_measure = not torch.cuda.is_available() and importlib.util.find_spec("resource") is None
    return timm_unavailable() or ("the CPU measure needs the resource module (Unix)" if no_measure else None)


def _model_job(preset: TimmPreset, sizes: MemorySizes, device: torch.device) -> Job:
    changes = {k: v for k, v in dataclasses.asdict(preset.changes).items() if v is not None}
    return Job(preset.model, changes, sizes.batch_of(preset, device), str(device), torch.get_num_threads(),
               sizes.image_size)


def bench_timm_memory(sizes: MemorySizes, device: torch.device, log: Callable[[str], None]) -> dict[str, Any]:
    """Each pair's peaks, their ratio, the paper's and the parameter ratio (a failed measurement
    is recorded as the process's last words)."""
    pairs = []
    for name in sizes.originals:
        row: dict[str, Any] = {"original": name, "reduced": f"{name}-reduced"}
        for side in ("original", "reduced"):
            preset = timm_preset(row[side])
            job = _model_job(preset, sizes, device)
            log(f"[{device.type} timm-memory B={job.batch}] {preset.name}")
            row["table"], row["batch"] = preset.table, job.batch
            try:
                got = measure(job)
            except HeadwiseError as exc:
                row["failed"] = str(exc)
                break
            row[f"{side}_bytes"], row[f"{side}_params"] = got["peak_bytes"], got["params"]
        if "failed" not in row:
            row["ratio"] = row["reduced_bytes"] / row["original_bytes"]
            row["params_ratio"] = row["reduced_params"] / row["original_params"]
        row["paper_gb"] = [float(timm_preset(row[side]).paper_memory_gb) for side in ("original", "reduced")]
        row["paper_ratio"] = row["paper_gb"][1] / row["paper_gb"][0]
        pairs.append(row)
    measure_text = ("torch.cuda.max_memory_allocated over the baseline" if device.type == "cuda" else
                    f"peak resident set size over the baseline, glibc mmap threshold {MMAP_THRESHOLD // 1024} KiB")
    return {"device": str(device), "precision": "fp32", "image_size": sizes.image_size, "steps": STEPS,
            "threads": torch.get_num_threads(), "measure": measure_text, "pairs": pairs}


def measure_timm_memory(run: SuiteRun) -> None:
    """The ``timm-memory`` section, on CUDA where there is one; skipped or refused where it cannot
    run (:func:`~headwise.bench.sections.measure_part`)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    measure_part(run, "timm-memory", "timm_memory", unavailable(),
                 lambda: bench_timm_memory(MemorySizes.of(run.cfg), device, run.log))


@of_part("timm_memory")
def timm_memory_targets(part: dict[str, Any]) -> list[dict[str, Any]]:
    """The paper's claim: every reduced model trains in less memory than its original."""
    done = [r for r in part.get("pairs", []) if "ratio" in r]
    if not done:
        return []
    worst = max(done, key=lambda r: r["ratio"])
    return [target("timm training memory, reduced / original (worst pair)", "< 1.0x", worst["ratio"],
                   worst["ratio"] < 1.0, f"{worst['ratio']:.2f}x ({worst['original']})")]


def _gib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**30:.2f}"


@of_part("timm_memory")
def timm_memory_table(part: dict[str, Any]) -> list[str]:
    """Both peaks per pair, their ratio beside the paper's and the parameter ratio."""
    if "skipped" in part:
        return ["## Training memory of Leaner's timm models", "", f"skipped: {part['skipped']}", ""]
    lines = [f"## Training memory of Leaner's timm models ({part['device']}, {part['precision']}, "
             f"{part['image_size']} px)", "",
             f"Peak memory of a training step (forward, cross-entropy, backward, AdamW), the last of "
             f"{part['steps']}, each model in a fresh process: {part['measure']} "
             "(headwise.families.vision.bench_timm_memory says what that counts). The paper's Memory column is "
             "in GB at its training batch on 8 A100s.", "",
             "| pair | table | batch | original (GiB) | reduced (GiB) | reduced / original | paper (GB) "
             "| paper's ratio | parameters reduced / original |", "|---|---|---|---|---|---|---|---|---|"]
    for r in part["pairs"]:
        if "failed" in r:
            lines.append(f"| {r['original']} | | | failed: {r['failed']} | | | | {r['paper_ratio']:.2f} | |")
            continue
        lines.append(f"| {r['original']} | {r['table']} | {r['batch']} | {_gib(r['original_bytes'])} | "
                     f"{_gib(r['reduced_bytes'])} | {r['ratio']:.2f} | {r['paper_gb'][0]:g} -> {r['paper_gb'][1]:g} | "
                     f"{r['paper_ratio']:.2f} | {r['params_ratio']:.2f} |")
    lines.append("")
    return lines


register_section(BenchSection(
    "timm-memory", "peak training memory of Leaner's original vs reduced timm models (Tables 4-5) beside the paper's",
    72, measure_timm_memory, timm_memory_targets, timm_memory_table, by_default=False))


if __name__ == "__main__":
    print(json.dumps(measure_job(Job(**json.loads(sys.argv[1])))))
