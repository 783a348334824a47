"""The training loop every task shares: one process or many under ``torchrun``.

Each optimiser step runs ``grad_accum`` micro-batches (DDP synchronises gradients on the last),
clips the global gradient norm, steps AdamW and the schedule. Losses stay on the device and are
read only at log steps, so a step makes no host synchronisation of its own. A run can be killed
at any moment and resumed exactly: checkpoints hold the model, optimiser, schedule, every random
generator, each process's data position and the not-yet-logged loss sum.
"""

from __future__ import annotations

import contextlib
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from headwise.errors import HeadwiseError, RunFailure
from headwise.model import save_pretrained
from headwise.run import RunDir, RunStatus, RunSummary, write_summary
from headwise.run.tokenizer import task_tokenizer, tokenizer_record
from headwise.tasks.base import Task
from headwise.tasks.union import build_task
from headwise.train.allocator import tune_cpu_allocator
from headwise.train.checkpoint import latest_checkpoint, rng_state, save_checkpoint, set_rng_state
from headwise.train.config import RunConfig, batch_layout, min_lr, resolve_spec, resolved_config, warmup_steps
from headwise.train.distill import load_distiller
from headwise.train.distributed import DistContext, init_distributed, resolve_device
from headwise.train.held_out import eval_totals, finish_totals
from headwise.train.init_from import check_init_source, converted_tokenizer, load_encoder
from headwise.train.metrics import MetricsLog, Progress, peak_memory_bytes
from headwise.train.optim import build_optimizer, build_scheduler
from headwise.train.peak import default_peak_flops
from headwise.train.prune_init import prune_for_run, write_record
from headwise.train.resume import ResumePoint
from headwise.train.run_folder import NewFolder, ResumedConfig, check_run_dir, prepare_run_dir
from headwise.train.trackers import open_trackers

# Sentinel for "no non-finite loss yet" in the on-device first-bad-step tracker.
_NO_STEP = float("inf")


def run_training(cfg: RunConfig, out_dir: str | Path, *, resume: bool = False, overwrite: bool = False,
                 task: Task | None = None) -> RunSummary:
    """Train ``cfg`` into ``out_dir`` and return the run's summary (also in ``summary.json``).

    ``resume`` continues the run in ``out_dir`` from its latest checkpoint; ``overwrite``
    replaces a run already there. ``task`` trains on a ready-made task instead of building
    ``cfg.task`` (the config's task table is then only recorded). Under ``torchrun`` every
    process calls this; rank 0 writes the files.

    Raises HeadwiseError on bad input (nothing on disk changed: a new run refused once its folder
    is written, before any checkpoint, takes back what it added) and RunFailure when the loss
    becomes non-finite (``summary.json`` then says ``diverged``; the last good checkpoint stays)
    or when ``resume`` finds no checkpoint that verifies (nothing on disk changed; a damaged
    newer checkpoint is skipped, see :mod:`headwise.train.resume`).
    A SIGINT or SIGTERM saves a checkpoint and returns with status ``interrupted``; a second
    SIGINT (Ctrl-C twice) stops at once, without saving.
    """
    if resume and overwrite:
        raise HeadwiseError("--resume and --overwrite contradict each other: choose one")
    ctx = init_distributed(cfg.train.device)
    try:
        trainer = Trainer(cfg, Path(out_dir), ctx, resume=resume, overwrite=overwrite, task=task)
        try:
            summary = trainer.run()
        except (HeadwiseError, RunFailure) as exc:
            trainer.take_back(exc)
            raise
        # No process tears its group down while another still communicates (a gloo rank that did
        # aborted now and then); after a failure the others may never arrive, so only here.
        ctx.barrier()
        return summary
    finally:
        ctx.close()


class Trainer:
    """One run: set up from a config (checking everything before touching the disk), then :meth:`run`."""

    def __init__(self, cfg: RunConfig, out: Path, ctx: DistContext, *, resume: bool, overwrite: bool,
                 task: Task | None) -> None:
        self.ctx, self.out, self.run_dir = ctx, out, RunDir(out)
        self.device = resolve_device(cfg.train.device, ctx)
        if task is None:
            saved = converted_tokenizer(cfg, out, resume)  # a converted model's own is read, never learnt
            # Rank 0 builds (or reuses) the token cache first, so the others only open it.
            if ctx.is_main:
                task = build_task(cfg.task, progress=sys.stderr.isatty(), tokenizer=saved)
            ctx.barrier()
            if not ctx.is_main:
                task = build_task(cfg.task, tokenizer=saved)
        self.task, self.tokenizer = task, task_tokenizer(task)
        self.spec, self.plan = resolve_spec(cfg.model, self.task)
        self.layout = batch_layout(cfg.train, self.task, ctx.world_size)
        # the saved config's [model] is the one configured: under [train.prune], the init_from model's
        self.cfg = resolved_config(cfg, self.spec)
        self.eval_set = self.task.eval_batches()
        t = self.cfg.train
        # a resumed fine-tuning run restores its own checkpoint: the source is not read again
        self.init_source = (check_init_source(t.init_from, t.init_checkpoint, self.spec, cfg.task.vocabulary_run(),
                                              self.tokenizer) if t.init_from and not resume else None)
        #: [train.prune]'s pruned init_from model (until _build loads it) and its record (pruned.json)
        self.pruned_model, self.prune_record = None, None
        if t.prune:
            self.spec, self.plan, self.pruned_model, self.prune_record = prune_for_run(
                t.prune, self.out, self.init_source, self.spec, self.task, t.seed, self.device)
        # counted once: another library's model is counted on a meta build
        self.params = self.spec.parameter_count()
        self.flops_per_token = self.spec.flops_per_token(self.layout.seq_len)
        self.peak_flops, self.peak_source = (
            (t.peak_flops, "train.peak_flops") if t.peak_flops else default_peak_flops(self.device, t.precision)
        )
        self.resume_from = check_run_dir(self.run_dir, self.cfg, self.spec, self.tokenizer, ctx.world_size,
                                         resume=resume, overwrite=overwrite)
        # Made (a missing extra refused) before anything is written, by every process so that
        # all refuse alike; rank 0 starts them in run().
        self.trackers = open_trackers(self.cfg.log, out)
        # before _build seeds the generators (building the teacher draws weights); a resume loads it again
        self.distiller = (load_distiller(t.distill, self.spec, self.task, self.tokenizer, self.device)
                          if t.distill else None)
        self.resume_notes: list[str] = []
        self._init_progress()
        # The model, the init_from weights and the data streams too: what they refuse (a damaged
        # source, a batch larger than the training split) must not leave a run folder behind.
        self._build()
        #: the step this invocation starts from (a resumed run's checkpoint's)
        self.first_step = self.step
        # Every process has read the directory before rank 0 changes it.
        ctx.barrier()
        #: what rank 0 wrote into the run folder, taken back if the run is refused before it trains
        self.undo: NewFolder | ResumedConfig | None = None
        if ctx.is_main:
            self.undo, self.resume_notes = prepare_run_dir(self.run_dir, self.cfg, self.tokenizer,
                                                           self.resume_from, overwrite)
            write_record(out, self.prune_record)
        ctx.barrier()

    def take_back(self, exc: HeadwiseError | RunFailure) -> None:
        """Take back what this invocation wrote into the run folder (:mod:`headwise.train.run_folder`)
        when the run is refused before it saved a checkpoint: on bad input, or on a failure before
        its first step (a tracker that cannot start). A failure after that (a diverged loss) keeps
        the run, whose summary says what happened."""
        refused = isinstance(exc, HeadwiseError) or self.step == self.first_step
        saved = self.last_saved != self.first_step or self.status is RunStatus.COMPLETED
        if self.undo is not None and refused and not saved:
            self.undo.take_back()

    def _init_progress(self) -> None:
        """Counters, timers and status of the run, before anything has trained (a resumed run
        overwrites them from its checkpoint in :meth:`_restore`)."""
        self.step, self.tokens = 0, 0
        self.prior_train_time = self.prior_wall_time = 0.0
        self.train_time = 0.0
        self.wall_t0 = time.perf_counter()
        self.last_eval: float | None = None
        self.last_metrics: dict[str, float] = {}
        self.last_saved = 0
        self.unlogged = 0
        self.status, self.error = RunStatus.PENDING, None
        self.stop_signal: int | None = None

    def _build(self) -> None:
        cfg, t, ctx = self.cfg, self.cfg.train, self.ctx
        torch.manual_seed(t.seed)
        np.random.seed(t.seed)
        random.seed(t.seed)
        if self.device.type == "cpu":
            # The step's large temporaries (logits, their gradient) otherwise page-fault in afresh
            # every step: a bf16 step of the bench's 4 x 12 model took 0.77 s with glibc's default,
            # 0.59 s tuned (fp32 1.56 and 1.51 s; 2 threads, best of 4 steps, two runs each).
            tune_cpu_allocator()
        self.model = self.spec.build().to(self.device)
        if self.pruned_model is not None:
            self.model.load_state_dict(self.pruned_model.state_dict())
            self.pruned_model = None  # free the copy
        elif self.init_source is not None:
            load_encoder(self.model, self.init_source)
        self.optimizer = build_optimizer(self.model, cfg.optim, self.device)
        self.scheduler = build_scheduler(self.optimizer, lr=cfg.optim.lr, min_lr=min_lr(cfg),
                                         warmup=warmup_steps(cfg.schedule, self.layout.steps),
                                         total=self.layout.steps, decay=cfg.schedule.decay,
                                         start_lr=cfg.schedule.warmup_start_lr, cycle_beta1=cfg.schedule.cycle_beta1)
        self.stream = self.task.train_stream(t.micro_batch, seed=t.seed, rank=ctx.rank, world_size=ctx.world_size)
        # Device-side accumulators: the loss sum since the last log and the first non-finite step.
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        self.first_bad = torch.full((), _NO_STEP, dtype=torch.float64, device=self.device)
        if self.resume_from is not None:
            self._restore(self.resume_from)
        forward = torch.compile(self.model) if t.compile else self.model
        if ctx.enabled:
            forward = DistributedDataParallel(forward, device_ids=[self.device.index] if self.device.type == "cuda"
                                              else None)
        self.forward = forward
        self.autocast = torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=t.precision == "bf16")

    def _restore(self, point: ResumePoint) -> None:
        self.model.load_state_dict(point.model.state_dict())
        state = point.state
        point.model = point.state = None  # type: ignore[assignment]  # free them
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step, self.tokens, self.last_eval = state["step"], state["tokens"], state["last_eval_loss"]
        self.last_metrics = state.get("last_eval_metrics", {})  # absent from checkpoints older than metrics
        self.last_saved = self.step
        self.prior_train_time, self.prior_wall_time = state["train_time_s"], state["wall_time_s"]
        mine = state["ranks"][self.ctx.rank]
        self.stream.load_state_dict(mine["stream"])
        self.loss_sum.copy_(mine["loss_sum"])
        self.unlogged = mine["unlogged"]
        # Last, so that nothing above draws from the restored generators.
        set_rng_state(mine["rng"])

    def run(self) -> RunSummary:
        """Train to the end (or to a stop signal); returns the summary it wrote last."""
        self.wall_t0 = time.perf_counter()
        self.status = RunStatus.RUNNING
        resume_step = self.step if self.resume_from is not None else None
        self.metrics = (MetricsLog(self.out, resume_step, self.trackers, self.cfg.to_dict())
                        if self.ctx.is_main else None)
        self.progress = Progress(self.layout.steps, self.step, enabled=self.ctx.is_main, unit=self.task.unit)
        self._write_summary()
        self._announce()
        handlers = self._install_signal_handlers()
        try:
            self._loop()
            self._finish()
        except RunFailure as exc:
            self.status, self.error = RunStatus.DIVERGED, str(exc)
            raise
        except KeyboardInterrupt:
            self.status, self.error = RunStatus.INTERRUPTED, "interrupted by a second Ctrl-C before a checkpoint"
            raise
        except BaseException as exc:
            self.status, self.error = RunStatus.FAILED, f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self.progress.close()
            summary = self.summary()
            if self.ctx.is_main:
                write_summary(self.out, summary)
            if self.metrics is not None:
                self.metrics.close(summary.model_dump(mode="json"))
            # Only now: a repeated SIGTERM (PR_SET_PDEATHSIG fires once per thread of a dying
            # study runner) under the default handler would kill the process before the summary.
            for sig, old in handlers.items():
                signal.signal(sig, old)
        return self.summary()

    def _announce(self) -> None:
        lay = self.layout
        for line in self.resume_notes:
            self.progress.message(line)
        if self.metrics is not None and self.metrics.dropped:
            self.progress.message(f"warning: {self.run_dir.metrics} had {self.metrics.dropped} damaged line(s); "
                                  "dropped them, kept the rows that read back")
        where = f"resuming at step {self.step}" if self.resume_from is not None else "starting"
        self.progress.message(f"{where}: {self.params:,} parameters, {self.spec.heads_line()}, {lay.steps} steps x "
                              f"{lay.tokens_per_step:,} {self.task.unit} (micro-batch {lay.micro_batch} x "
                              f"accumulation {lay.grad_accum} x {lay.world_size} processes), {self.device.type} "
                              f"{self.cfg.train.precision}")
        for note in self.plan.notes:
            self.progress.message(f"note: {note}")

    def _install_signal_handlers(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}

        def handler(signum: int, frame: Any) -> None:
            # Only a second Ctrl-C means "stop now, without saving". SIGTERM can come more than
            # once for one stop: PR_SET_PDEATHSIG fires again as each thread of a dying study
            # runner exits, and a runner forwards SIGTERM after its process group got Ctrl-C.
            if self.stop_signal is not None and signum == signal.SIGINT:
                raise KeyboardInterrupt
            if self.stop_signal is None:
                self.stop_signal = signum

        return {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}

    def _loop(self) -> None:
        c, total = self.cfg, self.layout.steps
        interval_t0 = time.perf_counter()
        while self.step < total:
            self.step += 1
            step = self.step
            due_eval = (bool(c.eval.every) and step % c.eval.every == 0) or (step == total and c.eval.at_end)
            due_analysis = bool(c.analysis.every) and step % c.analysis.every == 0
            due_log = step % c.train.log_every == 0 or step == total or due_eval or due_analysis
            due_ckpt = bool(c.checkpoint.every) and step % c.checkpoint.every == 0
            lr = self.scheduler.get_last_lr()[0]
            grad_norm = self._train_step(need_norm=due_log)
            self.tokens += self.layout.tokens_per_step
            self.progress.advance(step)
            # Processes agree on stopping at log steps only: one stopping alone would leave the
            # others waiting for it in the next collective.
            stop = self.stop_signal is not None and not self.ctx.enabled
            if due_log:
                row, stop = self._log_row(lr, grad_norm, interval_t0)
                if due_eval:
                    self.last_eval = row["eval_loss"] = self._evaluate()
                    row.update({f"eval_{k}": v for k, v in self.last_metrics.items()})
                if due_analysis and self.ctx.is_main:
                    row.update(self._analyse())
                if self.metrics is not None:
                    self.metrics.write(row)
                self.progress.log(row)
            elif stop:
                self.train_time += time.perf_counter() - interval_t0
            stop = stop and step < total  # a signal during the last step: just finish
            if due_ckpt or stop:
                self._save()
            if stop:
                self.status = RunStatus.INTERRUPTED
                name = signal.Signals(self.stop_signal).name if self.stop_signal else "a signal"
                self.progress.message(f"{name} at step {step}: checkpoint saved; continue with --resume")
                return
            if due_log or due_ckpt:
                interval_t0 = time.perf_counter()

    def _train_step(self, need_norm: bool) -> torch.Tensor | None:
        t, accum = self.cfg.train, self.layout.grad_accum
        step_loss = torch.zeros((), dtype=torch.float64, device=self.device)
        for micro in range(accum):
            batch = next(self.stream).to(self.device)
            last = micro == accum - 1
            sync = self.forward.no_sync() if self.ctx.enabled and not last else contextlib.nullcontext()
            with sync:
                with self.autocast:
                    loss = (self.distiller or self.task).train_loss(self.forward, batch)
                (loss / accum).backward()
            step_loss += loss.detach()
        step_loss /= accum
        params = [p for p in self.model.parameters() if p.grad is not None]
        grad_norm = None
        if t.grad_clip > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, t.grad_clip)
        elif need_norm:
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.loss_sum += step_loss
        self.unlogged += 1
        # Remember the first step whose loss is not finite without reading it back to the host.
        self.first_bad = torch.where(torch.isfinite(step_loss), self.first_bad, self.first_bad.clamp(max=self.step))
        return grad_norm

    def _check_finite(self, bad: float | None = None) -> None:
        """Raise RunFailure naming the first step whose loss was not finite; ``bad`` is that step
        as already read back (else it is read here: one host sync)."""
        if bad is None:
            bad = self.ctx.all_reduce(self.first_bad.clone(), "min").item()
        if bad != _NO_STEP:
            ckpt = latest_checkpoint(self.out) if self.ctx.is_main else None
            kept = f"the last good checkpoint is {ckpt}" if ckpt else "no checkpoint was saved before it"
            raise RunFailure(f"the training loss became non-finite at step {int(bad)}; {kept}")

    def _log_row(self, lr: float, grad_norm: torch.Tensor | None, since: float) -> tuple[dict[str, Any], bool]:
        """The metrics row of this step (one host sync), and whether every process is to stop.
        ``since`` is when the steps being logged began."""
        self.ctx.all_reduce(self.loss_sum)
        bad = self.ctx.all_reduce(self.first_bad.clone(), "min")
        flag = torch.tensor(float(self.stop_signal is not None), dtype=torch.float64, device=self.device)
        self.ctx.all_reduce(flag, "max")
        norm = grad_norm if grad_norm is not None else torch.zeros((), device=self.device)
        loss_sum, norm_value, stop_value, bad_value = torch.stack([self.loss_sum, norm.double(), flag, bad]).tolist()
        # Timed after the sync, so that queued device work is counted.
        seconds = time.perf_counter() - since
        self._check_finite(bad_value)
        train_loss = loss_sum / self.ctx.world_size / self.unlogged
        self.loss_sum.zero_()
        steps_done, self.unlogged = self.unlogged, 0
        self.train_time += seconds
        row = {
            "step": self.step,
            "tokens": self.tokens,
            "epoch": round(self.stream.epoch, 6),
            "train_loss": train_loss,
            "lr": lr,
            "grad_norm": norm_value if grad_norm is not None else None,
            "tokens_per_s": steps_done * self.layout.tokens_per_step / max(seconds, 1e-9),
            "elapsed_s": round(self.prior_wall_time + time.perf_counter() - self.wall_t0, 3),
        }
        return row, stop_value > 0

    @torch.no_grad()
    def _evaluate(self) -> float | None:
        """Mean loss (returned) and the task's metrics (kept in ``last_metrics``) over the task's
        fixed held-out batches, shared out among the processes."""
        if not self.eval_set:
            return None
        self.model.eval()
        total = eval_totals(self.model, self.task, self.eval_set[self.ctx.rank::self.ctx.world_size], self.device,
                            self.autocast)
        self.model.train()
        self.ctx.all_reduce(total)
        loss, self.last_metrics = finish_totals(self.task, total)
        return loss

    def _analyse(self) -> dict[str, float]:
        return self.spec.analyze(self.model, [self.eval_set[0].inputs.to(self.device)]).metrics()

    def _save(self) -> None:
        """Checkpoint the current step (all processes take part; rank 0 writes)."""
        if self.last_saved == self.step:
            return
        self._check_finite()
        mine = {
            "rng": rng_state(),
            "stream": self.stream.state_dict(),
            "loss_sum": self.loss_sum.cpu(),
            "unlogged": self.unlogged,
        }
        ranks = self.ctx.all_gather_object(mine)
        if self.ctx.is_main:
            state = {
                "step": self.step,
                "tokens": self.tokens,
                "train_time_s": self.prior_train_time + self.train_time,
                "wall_time_s": self.prior_wall_time + time.perf_counter() - self.wall_t0,
                "last_eval_loss": self.last_eval,
                "last_eval_metrics": self.last_metrics,
                "world_size": self.ctx.world_size,
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "ranks": ranks,
            }
            save_checkpoint(self.out, self.step, self.model, state, self.cfg.checkpoint.keep)
            self._write_summary()
        self.last_saved = self.step
        self.ctx.barrier()

    def _finish(self) -> None:
        if self.status is RunStatus.INTERRUPTED:
            return
        if self.cfg.checkpoint.at_end:
            self._save()
        else:
            self._check_finite()
        if self.ctx.is_main:
            save_pretrained(self.model, self.run_dir.model)
        self.status = RunStatus.COMPLETED
        self.progress.message(
            f"done: {self.step} steps, final eval loss "
            + (f"{self.last_eval:.4f}" if self.last_eval is not None else "n/a")
            + f"; run in {self.out}"
        )

    def summary(self) -> RunSummary:
        """The run's summary as it stands."""
        train_time = self.prior_train_time + self.train_time
        tokens_per_s = self.tokens / train_time if train_time > 0 else None
        fpt = self.flops_per_token
        mfu = None
        if tokens_per_s and self.peak_flops:
            mfu = fpt * tokens_per_s / (self.peak_flops * self.ctx.world_size)
        return RunSummary(
            status=self.status,
            final_eval_loss=self.last_eval if self.status is RunStatus.COMPLETED else None,
            last_eval_loss=self.last_eval,
            eval_metrics=self.last_metrics,
            params=self.params,
            d_model=self.spec.d_model,
            plan=self.plan,
            wall_time_s=self.prior_wall_time + time.perf_counter() - self.wall_t0,
            unit=self.task.unit,
            train_time_s=train_time,
            tokens_per_s=tokens_per_s,
            peak_memory_bytes=peak_memory_bytes(self.device),
            mfu=mfu,
            flops_per_token=fpt,
            kv_cache_bytes_per_token=self.spec.kv_cache_budget(),
            peak_flops=self.peak_flops,
            peak_flops_source=self.peak_source,
            steps=self.step,
            total_steps=self.layout.steps,
            tokens=self.tokens,
            tokens_per_step=self.layout.tokens_per_step,
            micro_batch=self.layout.micro_batch,
            grad_accum=self.layout.grad_accum,
            world_size=self.ctx.world_size,
            device=str(self.device),
            precision=self.cfg.train.precision,
            task=self.task.describe(),
            init_from=({"run": t.init_from, "checkpoint": t.init_checkpoint}
                       if (t := self.cfg.train).init_from else None),
            tokenizer=tokenizer_record(self.tokenizer),
            error=self.error,
        )

    def _write_summary(self) -> None:
        if self.ctx.is_main:
            write_summary(self.out, self.summary())
