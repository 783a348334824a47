"""Study definitions: a base run config plus axes (or explicit variants), with named presets.

A study file is TOML::

    name = "progression"
    description = "..."
    default_preset = "tiny"          # used when --preset is not given
    seeds = 1                         # seeds per variant (train.seed = 0, 1, ...)

    [base]                            # a run config (the tables of ``headwise train``)
    model.preset = "tiny-lm"
    ...

    [[axes]]                          # a cartesian product of axes; each value sets keys
    name = "scheme"
    key = "model.plan.scheme"
    values = ["constant", "ascending", "descending"]

    [[axes]]
    name = "budget"
    key = "model.plan.total_heads"
    label = "h{value}"                # how a value appears in variant names
    values = [45, 90, 180]

    [[axes]]                          # values that set several keys carry their own label
    name = "shape"
    values = [{ label = "12x12", set = { "model.n_layers" = 12, "model.heads" = 12 } }]

    [[grids]]                         # more products, unioned with the one above
    axes = [...]

    [[variants]]                      # or explicit variants
    name = "baseline"
    set = { "model.n_layers" = 12 }

    [runner]                          # defaults for --jobs and --threads
    jobs = 2
    threads = 1

    [report]                          # how ``headwise report`` lays the study out (not part of
    kind = "heads"                    #   the study's identity; kept as written, checked by the
    series = "scheme"                 #   report: headwise.report.options); kind: a registered layout
    baseline = "constant"             #   (default: the task family's), the other keys the layout's own
    [report.paper]                    # reference values the report quotes beside the study's
    at_heads = 180

    [[claims]]                        # the papers' claims the study tests, declared before the
    name = "descending beats constant"  #   runs (headwise.study.claims): the report's verdicts
    pairs = [["descending-h90", "constant-h90"]]

    [[stages]]                        # runs that start from each run (e.g. fine-tuning a
    name = "sst2"                     #   pretrained model; headwise.study.stages)
    config = { task = { kind = "glue", task = "sst2" }, ... }
    [stage_defaults]                  # merged under every stage's config
    optim = { lr = 4e-5 }

    [nuisance]                        # settings tuned per variant before its seeds run
    selection = { "task.validation" = "fraction:0.1" }   # (headwise.study.nuisance)
    values = { "optim.lr" = [1e-3, 3e-3, 1e-2] }

    [presets.tiny]                    # deep-merged over everything above (lists replaced)
    summary = "one line about the preset"
    ...
    [presets.quick]
    extends = "tiny"                  # merged over the tiny preset
    ...

Every variant gets a stable, readable name (its axis labels joined by ``-``) and, per seed, its
own run directory. ``model.heads`` given as one integer means that count in every layer.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from itertools import product
from typing import Any

from pydantic import Field, field_validator, model_validator

from headwise.config import Config, apply_overrides, deep_merge, quoting_hints, set_dotted
from headwise.errors import HeadwiseError
from headwise.plans import Plan
from headwise.presets import preset_dict
from headwise.study.claims import Claim, check_metrics, unknown_variants
from headwise.study.definition_file import Definition, FileKind, identity, merge_preset
from headwise.study.nuisance import Nuisance, check_tuning, overlapping_seeds
from headwise.study.stages import Stage, apply_stage_defaults, check_stage_config
from headwise.train.config import resolve_run_model

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+=-]*$")


class AxisValue(Config):
    """One value of an axis that sets one or more keys, under an explicit label."""

    label: str
    set: dict[str, Any]

    @field_validator("label")
    @classmethod
    def _label_ok(cls, v: str) -> str:
        return _check_name(v, "axis label")


class Axis(Config):
    """One dimension of a grid: a key and its values, or values that each set several keys."""

    name: str
    #: the dotted run-config key every scalar value sets (e.g. ``model.plan.total_heads``)
    key: str | None = None
    values: list[Any] = Field(min_length=1)
    #: format of a scalar value in variant names, e.g. ``"h{value}"``
    label: str | None = None

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        return _check_name(v, "axis name")

    @model_validator(mode="after")
    def _check(self) -> "Axis":
        if self.key is None and not all(isinstance(v, dict) for v in self.values):
            raise ValueError(
                f"axis {self.name!r}: scalar values need a `key` on the axis "
                "(or give each value as { label = ..., set = { ... } })"
            )
        labels = [v.label for v in self.resolved_values()]
        dup = {x for x in labels if labels.count(x) > 1}
        if dup:
            raise ValueError(f"axis {self.name!r}: labels {sorted(dup)} repeat; give each value its own label")
        return self

    def format_label(self, value: Any) -> str:
        """The label of a scalar value in variant names."""
        text = "x".join(map(str, value)) if isinstance(value, list) else str(value)
        if self.label is not None:
            try:
                text = self.label.format(value=text)
            except (KeyError, IndexError, ValueError):
                raise ValueError(f"axis {self.name!r}: label {self.label!r} must use only {{value}}") from None
        elif not isinstance(value, str):
            text = f"{self.name}{text}"
        return _sanitize(text)

    def resolved_values(self) -> list[AxisValue]:
        """Every value as an :class:`AxisValue` (label and the keys it sets)."""
        return [AxisValue.parse(v, source=f"axis {self.name!r}") if isinstance(v, dict)
                else AxisValue(label=self.format_label(v), set={self.key: v}) for v in self.values]


class Grid(Config):
    """A cartesian product of axes."""

    axes: list[Axis] = Field(min_length=1)


class ExplicitVariant(Config):
    """A variant given by name and the keys it sets."""

    name: str
    set: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        return _check_name(v, "variant name")


class RunnerDefaults(Config):
    """How many runs at a time and torch threads per run, unless ``--jobs`` / ``--threads`` say
    otherwise. Not part of the study's definition; the thread count a study's runs used is
    recorded beside it instead (``study.toml``'s ``[environment]``): it changes a run's numbers
    (the order of floating-point sums), so a study keeps it for all its runs."""

    jobs: int | None = Field(default=None, ge=1)
    threads: int | None = Field(default=None, ge=1)


class StudyConfig(Config):
    """A study after its preset is merged in: base run config, variants, report layout."""

    name: str
    description: str = ""
    seeds: int = Field(default=1, ge=1)
    base: dict[str, Any]
    axes: list[Axis] = Field(default_factory=list)
    grids: list[Grid] = Field(default_factory=list)
    variants: list[ExplicitVariant] = Field(default_factory=list)
    #: the ``[report]`` table as written: the report checks it (:func:`headwise.report.study_report`)
    report: dict[str, Any] = Field(default_factory=dict)
    runner: RunnerDefaults = Field(default_factory=RunnerDefaults)
    claims: list[Claim] = Field(default_factory=list)
    nuisance: Nuisance | None = None
    stages: list[Stage] = Field(default_factory=list)

    @model_validator(mode="after")
    def _some_variants(self) -> "StudyConfig":
        if not (self.axes or self.grids or self.variants):
            raise ValueError("a study needs `axes`, `grids` or `variants`")
        names = [_check_name(s.name, "stage name") for s in self.stages]
        if len(set(names)) != len(names):
            raise ValueError(f"stage names repeat ({', '.join(names)}): give each stage its own name")
        unknown = [c.stage for c in self.claims if c.stage and c.stage not in names]
        if unknown:
            raise ValueError(f"a claim compares stage {unknown[0]!r}, which the study does not have "
                             f"(stages: {', '.join(names) or 'none'})")
        return self


@dataclass
class Variant:
    """One point of the study: a name, its axis labels, the keys it sets on the base, and (once
    resolved) its run config and the head plan that config gives."""

    name: str
    labels: dict[str, str]
    sets: dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)
    plan: Plan | None = None


@dataclass
class RunSpec:
    """One run: a variant with one seed."""

    variant: str
    seed: int
    labels: dict[str, str]
    config: dict[str, Any]

    @property
    def key(self) -> str:
        return f"{self.variant}/seed{self.seed}"


@dataclass
class Study(Definition):
    """A resolved study: its config, where it came from, the preset and the number of seeds."""

    config: StudyConfig
    seeds: int
    variants: list[Variant]

    def runs(self) -> list[RunSpec]:
        """Every (variant, seed), variants in definition order, seeds 0..seeds-1."""
        return [RunSpec(v.name, s, dict(v.labels), deep_merge(v.config, {"train": {"seed": s}}))
                for v in self.variants for s in range(self.seeds)]

    def identity(self) -> dict[str, Any]:
        """What makes two studies the same study: what is run, not how many seeds (they may be
        added later), how fast (``[runner]``), how it is reported (``[report]``) or logged
        (``[base.log]``)."""
        return study_identity(self.name, self.preset, self.config.to_dict())

    def to_dict(self) -> dict[str, Any]:
        """The saved form (``study.toml``): identity, seeds, and each variant's labels."""
        return {
            "name": self.name,
            "source": self.source,
            "preset": self.preset or "",
            "preset_summary": self.preset_summary,
            "seeds": self.seeds,
            "fingerprint": self.fingerprint(),
            "definition": self.config.to_dict(),
            "variants": [{"name": v.name, "labels": v.labels} for v in self.variants],
        }


def study_identity(name: str, preset: str | None, definition: dict[str, Any]) -> dict[str, Any]:
    """The identity of a study from its name, preset and resolved definition (see
    :meth:`Study.identity`); also how a saved study is compared with a new one."""
    what_runs = {k: v for k, v in definition.items() if k not in ("runner", "report")}
    # studies saved before claims existed keep their identity
    if not what_runs.get("claims"):
        what_runs.pop("claims", None)
    if not what_runs.get("stages"):  # nor do those saved before stages
        what_runs.pop("stages", None)
    # where the runs are logged ([base.log]: the trackers) does not change what they compute
    if "log" in what_runs.get("base", {}):
        what_runs["base"] = {k: v for k, v in what_runs["base"].items() if k != "log"}
    return identity(name, preset, what_runs)


def _check_name(v: str, what: str) -> str:
    if not _NAME_RE.match(v):
        raise ValueError(f"{what} {v!r} must start with a letter or digit and use only letters, digits and ._+=-")
    return v


def _sanitize(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+=-]+", "_", text).strip("_") or "value"


#: study files: any family file but a search's (``search-*.toml``)
STUDY_FILES = FileKind("study", "studies", saved_hint="a study directory: `headwise report` writes its report")
builtin_studies = STUDY_FILES.builtins
load_study_file = STUDY_FILES.load


def resolve_study(
    raw: dict[str, Any],
    source: str,
    preset: str | None = None,
    seeds: int | None = None,
    overrides: list[str] | None = None,
) -> Study:
    """Merge the preset into a raw study, apply ``key=value`` overrides to its base, and expand
    and validate every variant's run config (naming the variant on a bad value), with what its
    stages, tuning and claims ask of the variant's runs."""
    raw, preset, summary = merge_preset(raw, source, preset)
    apply_stage_defaults(raw, source)
    bare = apply_overrides(raw.setdefault("base", {}), overrides or [])
    config = StudyConfig.parse(raw, source=source)
    n_seeds = seeds if seeds is not None else config.seeds
    if n_seeds < 1:
        raise HeadwiseError(f"--seeds {n_seeds}: a study needs at least one seed")
    overlap = overlapping_seeds(config.nuisance, n_seeds)
    if overlap:
        raise HeadwiseError(f"{source}: tuning seed{'s' if len(overlap) > 1 else ''} {', '.join(map(str, overlap))} "
                            f"would also be {'' if len(overlap) > 1 else 'a '}seed{'s' if len(overlap) > 1 else ''} "
                            f"the study reports (0..{n_seeds - 1}): give [nuisance] seeds >= {n_seeds}, or fewer seeds")
    variants = expand_variants(config)
    names = [v.name for v in variants]
    problems = [p for s in config.stages if (p := s.unknown_variant(names))]
    problems += unknown_variants(config.claims, names, config.stages)
    if problems:
        raise HeadwiseError(f"{source}: {problems[0]}")
    with quoting_hints(bare):
        for v in variants:
            v.config, v.plan = build_run_config(config.base, v)
            for stage in (s for s in config.stages if s.runs_from(v.name)):
                check_stage_config(stage, v.name, v.config)
            if config.nuisance is not None:
                check_tuning(config.nuisance, v.name, v.config)
    check_metrics(config.claims, config.stages, {v.name: v.config for v in variants})
    return Study(config=config, source=source, preset=preset, preset_summary=summary, seeds=n_seeds,
                 variants=variants)


def expand_variants(config: StudyConfig) -> list[Variant]:
    """Every variant of the study, in definition order; names that repeat must set the same keys."""
    seen: dict[str, Variant] = {}
    for grid in ([Grid(axes=config.axes)] if config.axes else []) + config.grids:
        values = [[(a.name, v) for v in a.resolved_values()] for a in grid.axes]
        for combo in product(*values):
            labels = {axis: v.label for axis, v in combo}
            sets = {key: value for _, v in combo for key, value in v.set.items()}
            _add(seen, Variant("-".join(labels.values()), labels, sets))
    for ev in config.variants:
        _add(seen, Variant(ev.name, {"variant": ev.name}, dict(ev.set)))
    return list(seen.values())


def _add(seen: dict[str, Variant], v: Variant) -> None:
    old = seen.get(v.name)
    if old is None:
        seen[v.name] = v
    elif old.sets != v.sets:
        raise HeadwiseError(f"variant name {v.name!r} is produced twice with different settings; relabel an axis value")


def build_run_config(base: dict[str, Any], variant: Variant) -> tuple[dict[str, Any], Plan]:
    """The run config of a variant (the base with its keys set) and the head plan it resolves
    to, validated as ``headwise train`` would."""
    cfg = copy.deepcopy(base)
    for key, value in variant.sets.items():
        try:
            set_dotted(cfg, key, value)
        except HeadwiseError as exc:
            raise HeadwiseError(f"variant {variant.name!r}: {exc}") from None
    broadcast_heads(cfg)
    try:
        _, plan = resolve_run_model(cfg)
    except HeadwiseError as exc:
        raise HeadwiseError(f"variant {variant.name!r}: {exc}") from None
    return cfg, plan


def broadcast_heads(cfg: dict[str, Any]) -> None:
    """``model.heads = 8`` in a study means 8 heads in every layer."""
    model = cfg.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("heads"), int) or isinstance(model.get("heads"), bool):
        return
    n_layers = model.get("n_layers")
    if n_layers is None and isinstance(model.get("preset"), str):
        n_layers = preset_dict(model["preset"]).get("n_layers")
    if isinstance(n_layers, int) and n_layers > 0:
        model["heads"] = [model["heads"]] * n_layers
