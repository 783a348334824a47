"""The ``timm-overhead`` section of ``headwise bench``: training images/s of a timm model through
headwise's trainer against the same model in a plain PyTorch loop, and headwise's overhead (time per
step headwise / plain - 1; the target: at most 3%).

headwise's side is the step the trainer really runs: a :class:`~headwise.train.trainer.Trainer`
built from a ``[model.timm]`` run config on a synthetic IDX image folder the section writes (recipe
off: no augmentation, mixing or label smoothing; fp32; no evaluation, analysis or checkpoints), whose
own loop (``Trainer._loop``: the step's micro-batch read from the image cache, autocast, the loss and
its device-side accumulators, grad clipping, AdamW, the schedule, and every ``log_every`` steps the
metrics row: one host sync and a line of ``metrics.jsonl``) runs one log interval per sample. Driving
the loop itself, rather than timing whole runs and taking the slope over two step counts, leaves out
the run's fixed start-up (building the task and model, the run folder, saving the final model), whose
noise on a shared machine would swamp a 3% difference; the progress display is off (it prints one
line per log interval). A second headwise case feeds the trainer the plain side's one batch every
step, which tells the data pipeline's share of the overhead from the loop's.

The plain side: the same timm model (built by :func:`~headwise.families.vision.timm_models.build_timm_model`
from the same seed: the same weights), the trainer's first batch every step, AdamW with the trainer's
settings and parameter groups at its (constant) learning rate, the same clipping, and the loop ``loss
= F.cross_entropy(model(x), y); loss.backward(); clip; opt.step(); opt.zero_grad(set_to_none=True)``.
Before timing both sides take their first step on that batch: the comparison is fair when their losses
agree and their weights still do after it (the result records both). All cases are timed in the same
interleaved rounds (:func:`~headwise.bench.core.interleave`), so the machine's noise falls on every
side alike; both run in one process, under the CPU allocator setting the trainer makes.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from headwise.bench.core import case_ratio, interleave, optimizer_settings
from headwise.bench.report import number, quiet_count, target
from headwise.bench.sections import BenchSection, SuiteRun, measure_part, of_part, register_section
from headwise.bench.settings import BenchConfig
from headwise.data.batch import Batch
from headwise.families.vision.timm_models import timm_unavailable
from headwise.train.config import OptimConfig, RunConfig

#: the section's models, scaled down for small images: a DeiT (65 positions at 32 px) and an XCiT
#: with its head width held at 16 as in Leaner's reduced XCiT (16 patches, then class attention)
MODELS: dict[str, dict[str, Any]] = {
    "deit": {"name": "deit_tiny_patch16_224", "depth": 4, "heads": 4, "embed_dim": 128, "patch_size": 4},
    "xcit": {"name": "xcit_nano_12_p16_224", "depth": 4, "heads": 8, "embed_dim": 128, "head_dim": 16,
             "patch_size": 8},
}
#: the most headwise's step may add to the plain loop's time
TARGET_OVERHEAD = 0.03
#: the synthetic images: classes, and the test split the task needs (never evaluated)
CLASSES, TEST_IMAGES = 10, 16
#: the cases of one model, as the results name them
PLAIN, HEADWISE, FIXED = "plain", "headwise", "headwise fixed batch"


@dataclass(frozen=True)
class OverheadSizes:
    """The section's models, images, batch, the steps of one sample (the trainer's log interval) and
    the rounds."""

    models: tuple[str, ...] = tuple(MODELS)
    image_size: int = 32
    batch: int = 64
    steps: int = 10
    train_images: int = 512
    rounds: int = 5
    warmup: int = 1
    idle_wait: float = 5.0
    seed: int = 0

    @classmethod
    def of(cls, cfg: BenchConfig) -> OverheadSizes:
        """The full run's sizes, or ``--quick``'s (batch 16, samples of 5 steps, 1 s waits for
        quiet), sized for under a minute on 2 idle cores. Rounds and warm-up are the run's (``--rounds``)."""
        sizes = cls(rounds=cfg.rounds, warmup=cfg.warmup, seed=cfg.seed)
        return dataclasses.replace(sizes, batch=16, steps=5, train_images=256, idle_wait=1.0) if cfg.quick else sizes


def write_images(folder: Path, sizes: OverheadSizes) -> None:
    """An IDX image folder (MNIST's four files) of random grey images and labels."""
    rng = np.random.default_rng(sizes.seed)
    for prefix, n in (("train", sizes.train_images), ("t10k", TEST_IMAGES)):
        arrays = {"images-idx3-ubyte": rng.integers(0, 256, (n, sizes.image_size, sizes.image_size)),
                  "labels-idx1-ubyte": rng.integers(0, CLASSES, n)}
        for name, array in arrays.items():
            header = bytes([0, 0, 0x08, array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
            (folder / f"{prefix}-{name}").write_bytes(header + array.astype(np.uint8).tobytes())


def run_config(table: dict[str, Any], folder: Path, sizes: OverheadSizes, device: torch.device) -> RunConfig:
    """The run config of headwise's side: ``[model.timm]`` = ``table`` on the images in ``folder``,
    recipe off, fp32, a constant learning rate (no warm-up, the floor at the peak: the plain loop has
    no schedule, and the trainer's still steps), logging every sample's steps, and no evaluation,
    analysis or checkpoints. Its length is a sample's: :class:`TrainerSide` sets each sample's end."""
    return RunConfig.parse({
        "model": {"timm": table},
        "schedule": {"warmup_steps": 0, "min_lr": OptimConfig().lr},
        "task": {"kind": "images", "source": str(folder), "format": "idx", "cache_dir": str(folder / "cache")},
        "train": {"micro_batch": sizes.batch, "device": device.type, "seed": sizes.seed, "log_every": sizes.steps,
                  "steps": sizes.steps},
        "eval": {"every": 0, "at_end": False},
        "checkpoint": {"every": 0, "at_end": False},
        "analysis": {"every": 0},
    })


class _Repeat(Iterator[Batch]):
    """A training stream that gives one batch every step (headwise's fixed-batch case)."""

    epoch = 0.0

    def __init__(self, batch: Batch) -> None:
        self.batch = batch

    def __next__(self) -> Batch:
        return self.batch


class TrainerSide:
    """headwise's side: a trainer set up as :meth:`~headwise.train.trainer.Trainer.run` sets it up
    (its metrics file open, the progress display off), whose own loop runs to a given step."""

    def __init__(self, cfg: RunConfig, out: Path) -> None:
        from headwise.train.distributed import init_distributed
        from headwise.train.metrics import MetricsLog, Progress
        from headwise.train.trainer import Trainer

        self.ctx = init_distributed(cfg.train.device)
        self.trainer = t = Trainer(cfg, out, self.ctx, resume=False, overwrite=False, task=None)
        t.metrics = MetricsLog(out, None, t.trackers, t.cfg.to_dict())
        t.progress = Progress(t.layout.steps, 0, enabled=False, unit=t.task.unit)
        self.stream = t.stream

    def run_to(self, step: int, stream: Iterator[Batch] | None = None) -> None:
        """Train to ``step`` (a log step: the loop ends on one) on the trainer's own stream or ``stream``."""
        t = self.trainer
        t.stream = stream or self.stream
        t.layout = dataclasses.replace(t.layout, steps=step)
        t._loop()

    def first_loss(self) -> float:
        """Take the run's first step and return its loss, as the trainer logged it."""
        from headwise.run import read_metrics

        self.run_to(1)
        return read_metrics(self.trainer.out)[-1]["train_loss"]

    def interval(self, stream: Iterator[Batch] | None = None) -> Callable[[], None]:
        """One sample: the loop to the next log step, ``log_every`` steps on after the first."""
        every = self.trainer.cfg.train.log_every

        def sample() -> None:
            self.run_to((self.trainer.step // every + 1) * every, stream)

        return sample

    def close(self) -> None:
        """Close the metrics file and leave the process group (a single process has none)."""
        self.trainer.metrics.close()
        self.ctx.close()


def plain_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, images: torch.Tensor,
               labels: torch.Tensor, clip: float) -> Callable[[], torch.Tensor]:
    """The plain loop's step; returns its loss."""

    def step() -> torch.Tensor:
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return step


def plain_side(side: TrainerSide, seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The plain side's model (built from the trainer's spec and seed, as the trainer builds its own)
    and its AdamW with the trainer's settings and parameter groups."""
    from headwise.families.vision.timm_models import build_timm_model
    from headwise.train.optim import param_groups

    t = side.trainer
    spec = t.spec
    torch.manual_seed(seed)
    model = build_timm_model(spec.name, spec.changes(), num_classes=spec.num_classes, image_size=spec.image_size,
                             in_chans=spec.channels, drop_path=spec.drop_path).to(t.device).train()
    settings = {k: t.optimizer.defaults[k] for k in ("lr", "betas", "eps", "fused", "foreach")}
    return model, torch.optim.AdamW(param_groups(model, t.cfg.optim.weight_decay), **settings)


def max_difference(a: torch.nn.Module, b: torch.nn.Module) -> float:
    """The largest absolute difference between two models' parameters of the same names (the
    same architecture)."""
    pb = dict(b.named_parameters())
    return max((p.detach() - pb[name].detach()).abs().max().item() for name, p in a.named_parameters())


def repeat(step: Callable[[], Any], times: int) -> Callable[[], None]:
    """``step`` run ``times`` times: one sample of the plain side."""
    def run() -> None:
        for _ in range(times):
            step()
    return run


def bench_model(label: str, sizes: OverheadSizes, device: torch.device, folder: Path,
                log: Callable[[str], None]) -> dict[str, Any]:
    """One model's first step on both sides (their losses, and the largest difference of their
    weights as built and after it), then its three cases timed in interleaved rounds."""
    side = TrainerSide(run_config(MODELS[label], folder, sizes, device), folder / f"run-{label}")
    try:
        t = side.trainer
        batch = next(t.task.train_stream(sizes.batch, seed=sizes.seed)).to(device)  # the trainer's first
        model, optimizer = plain_side(side, sizes.seed)
        built = max_difference(model, t.model)
        step = plain_step(model, optimizer, batch.inputs, batch.targets, t.cfg.train.grad_clip)
        losses = {HEADWISE: side.first_loss(), PLAIN: step().item()}
        # the same first step: the same loss, then the same weights
        weights = {"built": built, "after_first_step": max_difference(model, t.model)}
        cases = {PLAIN: repeat(step, sizes.steps), HEADWISE: side.interval(), FIXED: side.interval(_Repeat(batch))}
        prefix = f"[{device.type} fp32 timm-overhead {label} B={sizes.batch}]"
        timings = interleave(cases, sizes.rounds, sizes.warmup, device, seed=sizes.seed + 11,
                             idle_wait=sizes.idle_wait, progress=lambda s: log(f"{prefix} {s}"))
        measured = timings.cases({name: {} for name in cases}, sizes.batch * sizes.steps, "images")
        return {"model": label, "timm": MODELS[label], "params": t.params, "first_loss": losses,
                "weight_difference": weights, "optimizer": optimizer_settings(t.optimizer),
                "idle_wait_s": timings.waited, "cases": measured, "overhead": overhead(measured, HEADWISE),
                "overhead_fixed_batch": overhead(measured, FIXED)}
    finally:
        side.close()


def overhead(cases: dict[str, dict[str, Any]], case: str) -> dict[str, Any]:
    """``case``'s time per step over the plain loop's, less 1 (the median over rounds of the plain
    rate / the case's, see :func:`~headwise.bench.core.case_ratio`), beside that ratio's figures."""
    stats = case_ratio(cases, PLAIN, case, unit="images")
    return {**stats, "overhead": stats["ratio"] - 1, "overhead_of_medians": stats["ratio_of_medians"] - 1}


def bench_timm_overhead(sizes: OverheadSizes, device: torch.device, log: Callable[[str], None]) -> dict[str, Any]:
    """Every model of ``sizes`` through headwise's trainer and the plain loop, on images the
    section writes into a temporary folder."""
    with tempfile.TemporaryDirectory(prefix="headwise-timm-overhead-") as tmp:
        folder = Path(tmp)
        write_images(folder, sizes)
        models = [bench_model(label, sizes, device, folder, log) for label in sizes.models]
    return {"device": str(device), "precision": "fp32", "image_size": sizes.image_size, "channels": 1,
            "classes": CLASSES, "batch": sizes.batch, "steps_per_sample": sizes.steps, "rounds": sizes.rounds,
            "warmup": sizes.warmup, "threads": torch.get_num_threads(), "models": models}


def measure_timm_overhead(run: SuiteRun) -> None:
    """The ``timm-overhead`` section, on CUDA where there is one; skipped or refused without timm
    (:func:`~headwise.bench.sections.measure_part`)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    measure_part(run, "timm-overhead", "timm_overhead", timm_unavailable(),
                 lambda: bench_timm_overhead(OverheadSizes.of(run.cfg), device, run.log))


def _percent(x: float) -> str:
    return f"{100 * x:+.1f}%"


@of_part("timm_overhead")
def timm_overhead_targets(part: dict[str, Any]) -> list[dict[str, Any]]:
    """Per model: headwise's time per training step at most 3% over the plain loop's."""
    rows = []
    for m in part.get("models", []):
        o = m["overhead"]
        rows.append(target(f"timm {m['model']} ({m['timm']['name']}) training step, headwise's trainer / a plain "
                           "loop - 1", f"<= {100 * TARGET_OVERHEAD:.0f}%", o["overhead"],
                           o["overhead"] <= TARGET_OVERHEAD,
                           f"{_percent(o['overhead'])} ({o['basis']} rounds; of medians "
                           f"{_percent(o['overhead_of_medians'])})"))
    return rows


@of_part("timm_overhead")
def timm_overhead_table(part: dict[str, Any]) -> list[str]:
    """Both sides' images/s per model, the overheads, the first-step losses and how far the weights
    differ after that step."""
    title = "## timm training through headwise's trainer vs a plain loop"
    if "skipped" in part:
        return [title, "", f"skipped: {part['skipped']}", ""]
    lines = [f"{title} ({part['device']}, {part['precision']}, B={part['batch']} images of {part['image_size']} px)",
             "", f"A sample is {part['steps_per_sample']} training steps: headwise's is the trainer's own loop over "
             "one log interval (its data stream, loss accumulators, clipping, AdamW, schedule and the metrics row); "
             "the plain loop's is cross-entropy, backward, clipping and AdamW with the trainer's settings on one "
             "batch; the fixed-batch case feeds the trainer that batch (headwise.families.vision.bench_timm_overhead "
             f"says more). Median of {part['rounds']} interleaved rounds after {part['warmup']} warm-up.", "",
             "| model | parameters | quiet | plain images/s | headwise images/s | overhead | fixed batch images/s "
             "| overhead | first step: loss plain / headwise, weights' largest difference |",
             "|---|---|---|---|---|---|---|---|---|"]
    for m in part["models"]:
        c = m["cases"]
        loss = m["first_loss"]
        lines.append(f"| {m['model']} ({m['timm']['name']}) | {m['params']:,} | {quiet_count(c[HEADWISE])} | "
                     f"{number(c[PLAIN]['images_per_s_median'], 1)} | {number(c[HEADWISE]['images_per_s_median'], 1)} "
                     f"| {_percent(m['overhead']['overhead'])} | {number(c[FIXED]['images_per_s_median'], 1)} | "
                     f"{_percent(m['overhead_fixed_batch']['overhead'])} | {loss[PLAIN]:.6f} / {loss[HEADWISE]:.6f}, "
                     f"{m['weight_difference']['after_first_step']:.1e} |")
    lines.append("")
    return lines


register_section(BenchSection(
    "timm-overhead", "timm training images/s through headwise's trainer vs a plain PyTorch loop (overhead <= 3%)",
    74, measure_timm_overhead, timm_overhead_targets, timm_overhead_table, by_default=False))
