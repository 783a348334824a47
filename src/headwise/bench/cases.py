"""The models a benchmark run times: the blog's grid of head plans, and which of them each
section needs.

A grid plan is a :class:`headwise.plans.Plan` from :func:`headwise.plans.plan_heads`; the bench
groups and compares plans by the budget they were asked for (``requested_total``: 45, 90, 180),
which a nearest valid plan may miss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from headwise.bench.settings import BenchConfig
from headwise.errors import HeadwiseError
from headwise.plans import Plan, Scheme, plan_heads
from headwise.presets import spec_from_preset
from headwise.spec import ModelSpec


def plan_label(plan: Plan) -> str:
    """The plan's name in results: ``4x12`` for a constant plan, else the scheme's first four
    letters and the heads (``asce 6,12,24,48``)."""
    if plan.scheme is Scheme.CONSTANT:
        return f"{plan.n_layers}x{plan.heads[0]}"
    return f"{plan.scheme.value[:4]} {','.join(map(str, plan.heads))}"


def grid_plans(cfg: BenchConfig) -> list[Plan]:
    """The blog's grid: every scheme at every budget (``plan_heads`` picks the nearest valid plan);
    a plan equal to an earlier one (possible for small d_model) is listed once."""
    plans: list[Plan] = []
    for scheme in cfg.schemes:
        for total in cfg.totals:
            plan = plan_heads(scheme, cfg.n_layers, cfg.d_model, total)
            if all(p.heads != plan.heads for p in plans):
                plans.append(plan)
    return plans


def model_spec(cfg: BenchConfig, heads: tuple[int, ...] | list[int]) -> ModelSpec:
    """The blog's GPT-Neo model (alternating global/local layers) at ``cfg``'s size."""
    return spec_from_preset(
        "blog-gpt-neo", d_model=cfg.d_model, n_layers=cfg.n_layers, vocab_size=cfg.vocab_size,
        heads=list(heads), attention=[("global", "local")[i % 2] for i in range(cfg.n_layers)],
    )


def share_parameters(target: nn.Module, source: nn.Module) -> nn.Module:
    """Make ``target`` use ``source``'s parameters and buffers (same names and shapes).

    ``target`` is typically built on the meta device; tied weights stay tied because both names
    get the same source parameter.
    """
    params = dict(source.named_parameters(remove_duplicate=False))
    buffers = dict(source.named_buffers(remove_duplicate=False))
    for name, p in list(target.named_parameters(remove_duplicate=False)):
        if params[name].shape != p.shape:
            raise HeadwiseError(f"cannot share {name}: shape {tuple(params[name].shape)} vs {tuple(p.shape)}")
        owner, _, attr = name.rpartition(".")
        setattr(target.get_submodule(owner), attr, params[name])
    for name, _ in list(target.named_buffers(remove_duplicate=False)):
        owner, _, attr = name.rpartition(".")
        setattr(target.get_submodule(owner), attr, buffers[name])
    return target


def meta_twin(build: Callable[[], nn.Module], source: nn.Module) -> nn.Module:
    """``build()``'s model made on the meta device, then given ``source``'s parameters and buffers."""
    with torch.device("meta"):
        target = build()
    return share_parameters(target, source)


@dataclass
class TrainingCases:
    """Which models one training section times."""

    plans: list[Plan]
    hf_totals: list[int]  # constant plans also timed with Hugging Face GPT-Neo
    bf16_totals: list[int]  # constant plans also timed under bf16 autocast (CPU)


def training_cases(cfg: BenchConfig, sections: set[str]) -> TrainingCases:
    """The union of models the chosen sections need (the baseline 4 x 12 always included)."""
    grid = grid_plans(cfg)
    constant = [p for p in grid if p.scheme is Scheme.CONSTANT]
    base = constant[0]
    chosen: list[Plan] = [base]
    hf_totals: list[int] = []
    bf16_totals: list[int] = []
    if "penalty" in sections:
        chosen = grid
    if "hf" in sections:
        hf_totals = [p.requested_total for p in constant]
        extra = constant + [p for p in grid
                            if p.scheme is Scheme.DESCENDING and p.requested_total == max(cfg.totals)]
        chosen += [p for p in extra if p not in chosen]
    if "bf16" in sections:
        bf16_totals = [t for t in cfg.bf16_totals if any(p.requested_total == t for p in constant)]
        chosen += [p for p in constant if p.requested_total in bf16_totals and p not in chosen]
    order = {p: i for i, p in enumerate(grid)}
    return TrainingCases(sorted(chosen, key=order.__getitem__), hf_totals, bf16_totals)


def hf_reference(plan: Plan, cases: TrainingCases, grid: list[Plan]) -> str | None:
    """The Hugging Face model a plan is compared with: the constant plan of the same budget
    (so the descending 96,48,24,12 plan meets HF's 4 x 48 model, same parameters)."""
    if plan.requested_total not in cases.hf_totals:
        return None
    constant = next(p for p in grid if p.scheme is Scheme.CONSTANT and p.requested_total == plan.requested_total)
    return f"hf {plan_label(constant)}"
