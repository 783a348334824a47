"""``[[claims]]``: the published claims a study tests, declared in the study file before its runs.

    [[claims]]
    name = "descending beats constant"
    source = "blog post, loss vs total heads"     # where the paper makes the claim
    test = "better"                                # superiority; or "as_good" / "equivalent" with a margin
    metric = "loss"                                # final eval loss, or a key of the eval metrics
    pairs = [["descending-h90", "constant-h90"]]   # (variant, baseline) per comparison
    paper_gain_percent = 0.3                       # the paper's effect, in % of the baseline
    paper_scale = "d_model 768, 4 layers, 250k stories, one epoch"
    # stage = "sst2"                               # compare a stage's runs (headwise.study.stages)

    [[claims]]
    name = "global pruning beats per-layer"
    pairs = [["prune-global/baseline", "prune-uniform/baseline"]]   # STAGE/VARIANT: that stage's runs

    [[claims]]
    name = "1 x 4 heads is as good as 2 x 2 with fewer parameters"
    test = "as_good"
    metric = "accuracy"
    better = "higher"                              # needed for any metric but the loss
    percent = true                                 # the metric in points (x 100)
    margin = 1.0                                   # in the metric's units: 1 accuracy point
    pairs = [["listops-l1-h4", "listops-l2-h2"]]

A pair's names are variants: a plain name the study's runs of it (or its ``stage``'s runs, with
``stage``), ``"STAGE/VARIANT"`` that stage's runs of it, so one comparison can span two stages, or a
stage and the study's own runs. Either way seed s is paired with seed s: a stage's run of seed s
starts from the study's run of seed s and trains on its batch order.

``test`` picks the hypothesis test, and the verdict is named after it
(:mod:`headwise.report.paired`):

- ``"better"``: superiority, one-sided against 0: *superior*, *inferior* or *not shown*;
- ``"as_good"``: non-inferiority, one-sided against minus the margin: *non-inferior within the
  margin*, *inferior* (worse than the margin) or *not shown*;
- ``"equivalent"``: two one-sided tests (TOST) against minus and plus the margin: *equivalent*,
  *not equivalent* or *not shown*.

"as_good" and "equivalent" need exactly one of ``margin`` or ``margin_percent``; "better" takes
neither. A ``margin_percent`` or ``paper_gain_percent`` is taken of each comparison's own baseline.
The comparisons of one claim are one family, tested at one-sided 2.5% in all: Bonferroni splits
it over the claim's pairs and nothing else. Claims are part of the study's identity, so a margin
cannot be moved once runs exist.

A claim's ``metric`` must be one its runs report (:func:`metric_problem`): the loss always, else
one their ``[task]`` table declares (:meth:`~headwise.tasks.family.TaskConfigBase.reported_metrics`);
a study that names another is refused when it is resolved.
"""

from __future__ import annotations

import difflib
from typing import Any, Literal

from pydantic import Field, model_validator

from headwise.config import Config
from headwise.errors import HeadwiseError
from headwise.study.stages import Stage, stage_config
from headwise.tasks.family import TaskConfigBase
from headwise.train.config import RunConfig


class Claim(Config):
    """A claim from a paper, and how the study tests it."""

    name: str = Field(min_length=1)
    #: where the paper makes it (section, figure or table)
    source: str = ""
    #: "better": the variant beats the baseline (superiority); "as_good": it is no worse than the
    #: margin (non-inferiority); "equivalent": it is within the margin either way (TOST)
    test: Literal["better", "as_good", "equivalent"] = "better"
    #: "loss" (the final eval loss) or a key of the runs' eval metrics ("accuracy", "top5", "error")
    metric: str = "loss"
    #: which direction is better; the loss is lower-is-better, any other metric must say
    better: Literal["lower", "higher"] | None = None
    #: show the metric x 100 (accuracies in points); margins and paper gains are then in points
    percent: bool = False
    #: (variant, baseline) of each comparison; ``"STAGE/VARIANT"`` names a stage's runs of a variant
    pairs: list[tuple[str, str]] = Field(min_length=1)
    #: as_good: how much worse the variant may be; equivalent: how far either way; in the metric's units ...
    margin: float | None = Field(default=None, gt=0)
    #: ... or in % of the baseline's mean
    margin_percent: float | None = Field(default=None, gt=0)
    #: the paper's effect as a gain (positive favours the variant), in the metric's units ...
    paper_gain: float | None = None
    #: ... or in % of the baseline's mean
    paper_gain_percent: float | None = None
    #: the paper's scale (model size, data, steps), quoted beside the study's
    paper_scale: str = ""
    #: the ``[[stages]]`` entry whose runs plain names compare (e.g. a fine-tuning); none: the study's runs
    stage: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> "Claim":
        margins = [m for m in (self.margin, self.margin_percent) if m is not None]
        if self.test in ("as_good", "equivalent") and len(margins) != 1:
            raise ValueError(f"claim {self.name!r}: an {self.test} claim needs exactly one of margin or "
                             "margin_percent, declared before the runs")
        if self.test == "better" and margins:
            raise ValueError(f"claim {self.name!r}: a margin belongs to an as_good or equivalent claim "
                             "(test = \"as_good\" or \"equivalent\")")
        if self.metric != "loss" and self.better is None:
            raise ValueError(f"claim {self.name!r}: say whether a higher or lower {self.metric!r} is better "
                             "(better = \"higher\" or \"lower\")")
        if self.paper_gain is not None and self.paper_gain_percent is not None:
            raise ValueError(f"claim {self.name!r}: give the paper's effect once (paper_gain or paper_gain_percent)")
        return self

    def run_set(self, name: str) -> tuple[str | None, str]:
        """(stage or None for the study's own runs, variant) of a name in ``pairs``."""
        stage, _, variant = name.rpartition("/")
        return stage or self.stage, variant

    @property
    def higher_is_better(self) -> bool:
        return (self.better or "lower") == "higher"

    @property
    def label(self) -> str:
        """The metric as the report names it."""
        name = "eval loss" if self.metric == "loss" else self.metric
        return f"{name} (points)" if self.percent else name

    def margin_for(self, baseline_mean: float) -> float | None:
        """The margin in the metric's units, for the comparison whose baseline has this mean
        (None for a "better" claim)."""
        if self.margin_percent is not None:
            return abs(baseline_mean) * self.margin_percent / 100
        return self.margin

    def paper_gain_for(self, baseline_mean: float) -> float | None:
        """The paper's effect as a gain in the metric's units, for the comparison whose baseline
        has this mean (None when not given)."""
        if self.paper_gain_percent is not None:
            return abs(baseline_mean) * self.paper_gain_percent / 100
        return self.paper_gain


def unknown_variants(claims: list[Claim], variants: list[str], stages: list[Stage]) -> list[str]:
    """One line for each run set a claim names that the study does not have: a variant, a stage,
    or a stage's runs of a variant it does not start from."""
    by_name = {s.name: s for s in stages}
    problems = []
    for c in claims:
        for stage, variant in (c.run_set(name) for pair in c.pairs for name in pair):
            if variant not in variants:
                problems.append(f"claim {c.name!r} names variant {variant!r}, which the study does not have "
                                f"(variants: {', '.join(variants)})")
            elif stage is not None and stage not in by_name:
                problems.append(f"claim {c.name!r} names stage {stage!r}, which the study does not have "
                                f"(stages: {', '.join(by_name) or 'none'})")
            elif stage is not None and not by_name[stage].runs_from(variant):
                problems.append(f"claim {c.name!r} names {stage}/{variant}, but stage {stage!r} starts only from "
                                f"{', '.join(by_name[stage].variants or [])}")
    return problems


def metric_problem(metric: str, task: TaskConfigBase) -> str | None:
    """Why runs of ``task`` cannot be compared on ``metric`` (the loss always can), as the end of
    a sentence; None when they can, or when only their built task knows its metrics."""
    names = task.reported_metrics()
    known = None if names is None else frozenset(names)
    if metric == "loss" or known is None or metric in known:
        return None
    hint = difflib.get_close_matches(metric, [*known, "loss"], n=1)
    return (f"{task.kind!r} runs report only the loss{''.join(f', {m}' for m in sorted(known))}"
            + (f"; did you mean {hint[0]!r}?" if hint else ""))


def check_metrics(claims: list[Claim], stages: list[Stage], configs: dict[str, dict[str, Any]]) -> None:
    """Refuse a claim whose metric its runs do not report: for each run set it names (run configs
    by variant in ``configs``), the task of the variant's runs or of its stage's."""
    by_name = {s.name: s for s in stages}
    for claim in claims:
        for stage, variant in dict.fromkeys(claim.run_set(n) for pair in claim.pairs for n in pair):
            config = configs[variant]
            if stage is not None:
                config = stage_config(by_name[stage], config, f"runs/{variant}/seed0", 0)
            problem = metric_problem(claim.metric, RunConfig.parse(config).task)
            if problem:
                runs = f"stage {stage!r} of variant {variant!r}" if stage else f"variant {variant!r}"
                raise HeadwiseError(f"claim {claim.name!r} compares {runs} on {claim.metric!r}, but {problem}")
