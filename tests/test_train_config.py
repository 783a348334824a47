"""RunConfig: parsing, resolution against a task, batch arithmetic, the schedule, decay groups."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest
import torch

from headwise.errors import HeadwiseError
from headwise.plans import Plan, Scheme
from headwise.model import Transformer
from headwise.families.nearest.nearest_task import NearestNeighbourTask
from headwise.families.nearest.task import NearestTaskConfig
from headwise.train.config import (
    RunConfig,
    TrainConfig,
    batch_layout,
    resolve_spec,
    resolved_config,
    warmup_steps,
)
from headwise.train.optim import beta1_at, build_scheduler, lr_at, param_groups
from test_train_synthetic import SEQ, VOCAB, SyntheticLM, tiny_config

REPO = Path(__file__).resolve().parents[1]


def _base(**tables):
    data = tiny_config().to_dict()
    for table, values in tables.items():
        data.setdefault(table, {}).update(values)
    return data


@pytest.mark.parametrize("data, needle", [
    ({"trian": {}}, "unknown key 'trian'; did you mean 'train'?"),
    ({"train": {"stesp": 3}}, "unknown key 'train.stesp'; did you mean 'steps'?"),
    ({"model": {"d_modle": 8}}, "unknown key 'model.d_modle'; did you mean 'd_model'?"),
    ({"model": {"plan": {"shceme": "constant"}}}, "did you mean 'scheme'?"),
    ({"optim": {"lr": "fast"}}, "optim.lr"),
    ({"train": {"precision": "fp16"}}, "train.precision"),
    ({"train": {"epochs": 1.0}}, "exactly one of steps, epochs or tokens for the run's length (got steps, epochs)"),
    ({"train": {"grad_accum": 2, "tokens_per_step": 128}}, "grad_accum or tokens_per_step, not both"),
    ({"schedule": {"warmup_frac": 0.1}}, "warmup_steps or warmup_frac, not both"),
])
def test_bad_configs_are_one_line_errors(data, needle):
    base = _base()
    for table, values in data.items():
        if isinstance(base.get(table), dict):
            base[table] = {**base[table], **values}
        else:
            base[table] = values
    with pytest.raises(HeadwiseError) as err:
        RunConfig.parse(base, source="run.toml")
    message = str(err.value)
    assert needle in message and "\n" not in message


def test_run_needs_a_duration():
    data = _base()
    del data["train"]["steps"]
    with pytest.raises(HeadwiseError, match="exactly one of steps, epochs or tokens"):
        RunConfig.parse(data)


class _FiniteTask(SyntheticLM):
    def tokens_per_epoch(self) -> int:
        return 10_000


def test_batch_arithmetic():
    task = _FiniteTask()
    lay = batch_layout(TrainConfig(micro_batch=4, tokens_per_step=4 * SEQ * 2 * 3, steps=5), task, world_size=2)
    assert (lay.grad_accum, lay.tokens_per_step, lay.steps) == (3, 384, 5)
    assert batch_layout(TrainConfig(micro_batch=4, grad_accum=2, tokens=1000), task, 1).steps == math.ceil(1000 / 128)
    assert batch_layout(TrainConfig(micro_batch=4, epochs=2.5), task, 1).steps == math.ceil(2.5 * 10_000 / 64)
    with pytest.raises(HeadwiseError, match=r"not a multiple of micro_batch x seq_len x processes = 4 x 16 x 1 = 64; "
                                            r"nearest valid: 128"):
        batch_layout(TrainConfig(micro_batch=4, tokens_per_step=100, steps=5), task, 1)
    with pytest.raises(HeadwiseError, match="larger than the training data"):
        batch_layout(TrainConfig(micro_batch=1000, epochs=1), task, 1)
    with pytest.raises(HeadwiseError, match="endless"):
        batch_layout(TrainConfig(micro_batch=4, epochs=1), SyntheticLM(), 1)


def test_resolve_spec_preset_overrides_plan_and_vocabulary():
    cfg = RunConfig.parse(_base(model={"preset": "tiny-lm", "d_model": 64, "n_layers": 2, "max_seq_len": SEQ,
                                       "plan": {"scheme": "descending", "total_heads": 6}}))
    data = cfg.to_dict()
    data["model"].pop("heads")
    cfg = RunConfig.parse(data)
    spec, plan = resolve_spec(cfg.model, SyntheticLM())
    # tiny-lm's own vocabulary (4096) gives way to the task's tokenizer; its other fields stay
    assert spec.vocab_size == VOCAB and spec.score_scale == "inv_sqrt" and spec.activation == "gelu_new"
    assert spec.heads == [4, 2] and plan.total == plan.requested_total == 6
    assert plan.scheme is Scheme.DESCENDING and plan.heads == (4, 2) and plan.head_dims == (16, 32)
    # the resolved config is the full spec beside what was asked of the plan: resolving it
    # again gives the same model and the same plan
    again = resolved_config(cfg, spec)
    model = again.to_dict()["model"]
    assert "preset" not in model and model["heads"] == [4, 2]
    assert model["plan"] == {"scheme": "descending", "total_heads": 6, "ratio": 2.0}
    assert resolve_spec(again.model, SyntheticLM()) == (spec, plan)


def test_resolve_spec_gives_an_explicit_plan_without_a_plan_table():
    spec, plan = resolve_spec(RunConfig.parse(_base()).model, SyntheticLM())
    assert plan == Plan.explicit((4, 2), (8, 16)) and plan.total == spec.total_heads == 6


@pytest.mark.parametrize("model, needle", [
    ({"vocab_size": VOCAB - 1}, "smaller than the tokenizer's 32 tokens"),
    ({"max_seq_len": SEQ - 1}, "max_seq_len 15 is shorter than the task's sequences (16)"),
    ({"plan": {"scheme": "constant", "total_heads": 4}}, "heads [4, 2] differ from the constant plan's [2, 2]"),
    ({"heads": [3, 2]}, "layer 0: heads = 3 does not divide d_model 32"),
    ({"inputs": "vectors"}, "inputs = 'vectors', but this task takes 'tokens' inputs"),
    ({"outputs": "vectors"}, "outputs = 'vectors', but this task takes 'lm' outputs"),
])
def test_resolve_spec_refuses(model, needle):
    cfg = RunConfig.parse(_base(model=model))
    with pytest.raises(HeadwiseError) as err:
        resolve_spec(cfg.model, SyntheticLM())
    assert needle in str(err.value)


def test_vector_task_gets_a_vector_model():
    task = NearestNeighbourTask(dim=8, n_points=4, eval_batches=1, eval_batch_size=2)
    model = {"preset": "amsel-nn", "d_model": 8, "head_dim": 8, "max_seq_len": 4}
    spec, _ = resolve_spec(RunConfig.parse({**_base(), "model": model}).model, task)
    assert spec.vocab_size is None and spec.inputs == "vectors" and spec.norm == "unitnorm_post"
    with pytest.raises(HeadwiseError, match="this task's inputs have no vocabulary: remove vocab_size"):
        resolve_spec(RunConfig.parse({**_base(), "model": {**model, "vocab_size": 8}}).model, task)
    with pytest.raises(HeadwiseError, match="d_model 16 differs from the task's vector size 8"):
        resolve_spec(RunConfig.parse({**_base(), "model": {**model, "d_model": 16}}).model, task)
    # the config knows the same shape before any data exists
    assert task.shape() == NearestTaskConfig(dim=8, n_points=4).shape()


def test_schedule_closed_form():
    lr, low, warm, total = 1.0, 0.1, 4, 14
    assert [lr_at(s, lr=lr, min_lr=low, warmup=warm, total=total) for s in range(warm)] == [0.25, 0.5, 0.75, 1.0]
    # cosine from lr at step `warm` to min_lr at the last step (total - 1); halfway is the mean
    assert lr_at(warm, lr=lr, min_lr=low, warmup=warm, total=total) == pytest.approx(1.0)
    assert lr_at(warm + 4.5, lr=lr, min_lr=low, warmup=warm, total=total) == pytest.approx(0.55)
    assert lr_at(total - 1, lr=lr, min_lr=low, warmup=warm, total=total) == pytest.approx(0.1)
    assert warmup_steps(RunConfig.parse(_base(schedule={"warmup_steps": None, "warmup_frac": 0.25})).schedule, 10) == 2


def _stepped(opt, sched, steps):
    """(lr, beta1) of each of ``steps`` steps (the scheduler stepped alone)."""
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # scheduler steps without optimiser steps
        for _ in range(steps):
            out.append((opt.param_groups[0]["lr"], opt.param_groups[0]["betas"][0]))
            sched.step()
    return out


def _adamw(lr=1.0):
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr, betas=(0.9, 0.999))


def test_schedule_defaults_are_the_old_warmup_and_cosine():
    # the schedule every saved config was trained with: lr (s + 1) / warm, then a cosine from step
    # `warm` to min_lr at the last step; beta1 left alone
    cfg = RunConfig.parse(_base())
    assert (cfg.schedule.decay, cfg.schedule.warmup_start_lr, cfg.schedule.cycle_beta1) == ("cosine", None, None)
    lr, low, warm, total = 3e-3, 3e-4, 5, 23
    opt = _adamw(lr)
    got = _stepped(opt, build_scheduler(opt, lr=lr, min_lr=low, warmup=warm, total=total), total)
    old = [lr * (s + 1) / warm if s < warm else
           low + 0.5 * (lr - low) * (1 + math.cos(math.pi * (s - warm) / (total - 1 - warm))) for s in range(total)]
    assert [g for g, _ in got] == pytest.approx(old, rel=1e-12)
    assert {b for _, b in got} == {0.9}


@pytest.mark.parametrize("steps,warm", [(10, 3), (7, 2), (5000, 1000), (40, 0)])
def test_linear_decay_from_a_start_lr_with_cycled_beta1_is_torch_s_one_cycle_lr(steps, warm):
    # OneCycleLR(anneal_strategy="linear"), the Nystromformer LRA code's schedule, at every step:
    # warm-up from max_lr / 25 over `warm` steps, a line down to max_lr / 25 / 1e4 at the last step,
    # beta1 from 0.95 down to 0.85 and back (torch's defaults)
    lr = 1e-4
    opt = _adamw(lr)
    if warm:
        ref = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, pct_start=warm / steps, anneal_strategy="linear",
                                                  total_steps=steps)
        theirs = _stepped(opt, ref, steps)
    else:  # OneCycleLR needs a first phase; none: a line from max_lr at the first step
        theirs = [(lr / 25 / 1e4 + (lr - lr / 25 / 1e4) * (1 - s / (steps - 1)), 0.85 + 0.1 * s / (steps - 1))
                  for s in range(steps)]
    opt = _adamw(lr)
    ours = _stepped(opt, build_scheduler(opt, lr=lr, min_lr=lr / 25 / 1e4, warmup=warm, total=steps, decay="linear",
                                         start_lr=lr / 25 if warm else None, cycle_beta1=(0.85, 0.95)), steps)
    assert [a for a, _ in ours] == pytest.approx([a for a, _ in theirs], rel=1e-9, abs=0)
    assert [b for _, b in ours] == pytest.approx([b for _, b in theirs], rel=0, abs=1e-12)
    if warm > 1:
        assert ours[0] == pytest.approx((lr / 25, 0.95)) and ours[warm - 1] == pytest.approx((lr, 0.85))


def test_schedule_closed_forms_of_the_new_options():
    # a start lr: the first step at it, the peak at the warm-up's last step, the decay from there
    kw = {"lr": 1.0, "min_lr": 0.0, "warmup": 5, "total": 13}
    assert [lr_at(s, start_lr=0.2, **kw) for s in range(5)] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert lr_at(8, start_lr=0.2, decay="linear", **kw) == pytest.approx(0.5)   # 4 of 8 decay steps
    assert lr_at(8, start_lr=0.2, **kw) == pytest.approx(0.5)                    # cosine's midpoint too
    assert lr_at(6, start_lr=0.2, decay="cosine", **kw) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    # the old warm-up with a linear decay: the decay starts the step after the warm-up
    assert lr_at(9, decay="linear", **kw) == pytest.approx(1 - 4 / 7)  # 4 of the 7 steps after step 5
    # beta1 mirrors the rate: high at the floor, low at the peak
    assert beta1_at(0, low=0.8, high=0.9, warmup=5, total=13, one_cycle=True) == pytest.approx(0.9)
    assert beta1_at(4, low=0.8, high=0.9, warmup=5, total=13, one_cycle=True) == pytest.approx(0.8)
    assert beta1_at(12, low=0.8, high=0.9, warmup=5, total=13, decay="linear", one_cycle=True) == pytest.approx(0.9)


def test_cycled_beta1_resumes_from_a_saved_position():
    # the trainer saves the optimiser's and the scheduler's state and loads them into new ones
    kw = {"lr": 1e-3, "min_lr": 1e-7, "warmup": 4, "total": 20, "decay": "linear", "start_lr": 4e-5,
          "cycle_beta1": (0.85, 0.95)}
    opt = _adamw(1e-3)
    whole = _stepped(opt, build_scheduler(opt, **kw), 20)
    opt = _adamw(1e-3)
    sched = build_scheduler(opt, **kw)
    first = _stepped(opt, sched, 7)
    saved = (opt.state_dict(), sched.state_dict())
    assert "_beta1" not in saved[1]
    opt = _adamw(1e-3)
    sched = build_scheduler(opt, **kw)
    opt.load_state_dict(saved[0])
    sched.load_state_dict(saved[1])
    assert first + _stepped(opt, sched, 13) == whole


@pytest.mark.parametrize("schedule,needle", [
    ({"decay": "cosin"}, "decay"),
    ({"warmup_start_lr": -1.0, "warmup_steps": 3}, "warmup_start_lr"),
    ({"warmup_start_lr": 1e-5, "warmup_steps": None, "warmup_frac": None}, "give warmup_steps or warmup_frac"),
    ({"warmup_start_lr": 1e-5, "warmup_steps": 0}, "give warmup_steps or warmup_frac"),
    ({"cycle_beta1": [0.95, 0.85]}, "0 <= low <= high < 1"),
    ({"cycle_beta1": [0.85, 1.0]}, "0 <= low <= high < 1"),
    ({"cycle_beta1": [0.85]}, "cycle_beta1"),
])
def test_bad_schedule_options_are_refused(schedule, needle):
    with pytest.raises(HeadwiseError, match=needle):
        RunConfig.parse(_base(schedule=schedule))


def test_weight_decay_only_on_matrices_and_embeddings():
    cfg = tiny_config()
    spec, _ = resolve_spec(cfg.model, SyntheticLM())
    model = Transformer(spec)
    decay, no_decay = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = sorted(names[id(p)] for p in decay["params"])
    assert "tok_emb.weight" in decayed and "pos_emb.weight" in decayed  # as nanoGPT does
    assert all(n.endswith("weight") and "norm" not in n for n in decayed)
    assert all(n.endswith("bias") or "norm" in n for n in (names[id(p)] for p in no_decay["params"]))
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)
    # the tied output head is the embedding, counted once
    total = sum(p.numel() for g in (decay, no_decay) for p in g["params"])
    assert total == model.num_params() and not any(p is model.lm_head.weight for p in no_decay["params"])
    assert torch.equal(model.lm_head.weight, model.tok_emb.weight)


@pytest.mark.parametrize("name", ["lm-tiny", "nearest-tiny"])
def test_shipped_configs_parse(name):
    cfg = RunConfig.load(REPO / "configs" / f"{name}.toml")
    assert cfg.task.kind == name.split("-")[0]
