"""``[[stages]]``: runs that start from each run of a study, such as fine-tuning a pretrained model.

    [[stages]]
    name = "sst2"                                      # its runs live under STUDY_DIR/stages/sst2/
    # variants = ["l2-h2"]                             # start only from these variants' runs
    source_keys = ["train.init_from", "task.tokenizer_from"]   # set to the source run's folder
    [stages.config]                                    # the stage's run config (over the
                                                       #   study's [stage_defaults], if any)
    model = { dropout = 0.1, classifier_hidden = 1024 }  # over the variant's [model]
    task = { kind = "glue", task = "sst2", source = "nyu-mll/glue" }
    optim = { lr = 4e-5 }
    train = { epochs = 5, micro_batch = 16 }

For every run of the study (each variant and seed; or of the variants its ``variants`` lists) a
stage runs once, after that run has completed, from a config made of the stage's own tables, with
``[model]`` the variant's model with the stage's model keys over it (so each variant fine-tunes its
own encoder), ``[log]`` the variant's unless the stage has one, ``train.seed`` the run's seed (so seed s of two variants
fine-tunes on the same batch order: the comparison stays paired) and each of ``source_keys`` the
source run's directory. A stage whose source run did not complete does not run.

A stage's folder is laid out as the study's own (``configs/``, ``runs/VARIANT/seedK/``,
``logs/``, ``locks/``, ``results.csv``; :mod:`headwise.study.layout`), so its runs resume,
report their status and fill a results table as the main runs do. Stages are part of the study's
identity. When the study is resolved, a stage's config is checked table by table for every
variant, and so is what it needs of the runs it starts from (:func:`source_problem`): a stage
that could never start (a GLUE fine-tuning of a causal language model, say) is refused before
any pretraining runs. The source run's files themselves are checked by ``headwise train`` when
the stage's run starts.
"""

from __future__ import annotations

import copy
import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from headwise.config import Config, deep_merge, set_dotted
from headwise.errors import HeadwiseError
from headwise.parts import OUTPUT_HEAD_PARTS
from headwise.spec import ModelSpec
from headwise.train.config import RunConfig, resolve_spec
from headwise.train.init_from import HEAD_FIELDS

if TYPE_CHECKING:
    from headwise.study.layout import StudyRecord

STAGES_DIR = "stages"
#: a stage's run config tables that come from the variant's config unless the stage gives them
INHERITED = ("log",)


class Stage(Config):
    """Runs that start from each run of the study (see the module docstring)."""

    name: str
    #: the dotted run-config keys set to the source run's directory
    source_keys: list[str] = Field(default_factory=lambda: ["train.init_from"], min_length=1)
    #: the stage's run config, table by table; its ``[model]`` keys go over the variant's model
    config: dict[str, dict[str, Any]]
    #: the variants whose runs it starts from (None: every variant)
    variants: list[str] | None = Field(default=None, min_length=1)

    def runs_from(self, variant: str) -> bool:
        """Whether the stage starts from the runs of ``variant``."""
        return self.variants is None or variant in self.variants

    def unknown_variant(self, variants: list[str]) -> str | None:
        """One line naming a variant the stage lists that is not one of ``variants``; None when all are."""
        missing = [v for v in self.variants or [] if v not in variants]
        return (f"stage {self.name!r} starts from variant {missing[0]!r}, which the study does not have "
                f"(variants: {', '.join(variants)})") if missing else None


def stage_config(stage: Stage, variant_config: dict[str, Any], source: Path | str, seed: int) -> dict[str, Any]:
    """The run config of ``stage`` for the run of ``variant_config`` (seed ``seed``) in ``source``."""
    cfg = copy.deepcopy(stage.config)
    cfg["model"] = deep_merge(variant_config.get("model", {}), stage.config.get("model", {}))
    for table in INHERITED:
        if table in variant_config and table not in cfg:
            cfg[table] = copy.deepcopy(variant_config[table])
    set_dotted(cfg, "train.seed", seed)
    for key in stage.source_keys:
        set_dotted(cfg, key, str(source))
    return cfg


def apply_stage_defaults(raw: dict[str, Any], source: str) -> None:
    """Merge a raw study's ``[stage_defaults]`` (what every stage's config shares) under each
    ``[[stages]]`` entry's ``config``; the merged stages are what the study records."""
    defaults = raw.pop("stage_defaults", {}) or {}
    if not isinstance(defaults, dict):
        raise HeadwiseError(f"{source}: `stage_defaults` must be a table of run-config tables")
    for stage in raw.get("stages", []) or []:
        if not isinstance(stage, dict):
            continue  # the study's validation names what a stage must be
        config = stage.get("config", {})
        if not isinstance(config, dict):
            raise HeadwiseError(f"{source}: stage {stage.get('name')!r}: `config` must be a table of run-config "
                                f"tables (e.g. config = {{ task = {{ kind = \"glue\" }} }}), not {config!r}")
        stage["config"] = deep_merge(defaults, config)


def check_stage_config(stage: Stage, variant: str, variant_config: dict[str, Any]) -> None:
    """Check a stage's run config for a variant before any run exists: its tables, and what it
    needs of the variant's runs (:func:`source_problem`)."""
    source = f"runs/{variant}/seed0"
    try:
        run = RunConfig.parse(stage_config(stage, variant_config, source, 0), source=f"stage {stage.name!r}")
    except HeadwiseError as exc:
        raise HeadwiseError(f"variant {variant!r}: {exc}") from None
    ran = RunConfig.parse(variant_config, source="run config")
    spec, _ = resolve_spec(ran.model, ran.task.shape(), source="run config")
    problem = source_problem(stage, run, os.path.abspath(source), ran.task.kind, spec)
    if problem:
        raise HeadwiseError(f"variant {variant!r}: stage {stage.name!r} cannot start from its runs: {problem}")


def source_problem(stage: Stage, run: RunConfig, source: str, kind: str, spec: ModelSpec) -> str | None:
    """Why the stage's run ``run`` cannot start from the run in ``source`` (task kind ``kind``,
    model ``spec``), judged from configs alone as ``headwise train`` judges the source when the
    stage's run starts (the task reading its vocabulary run, then
    :func:`~headwise.train.init_from.check_init_source`); None when it can."""
    task = run.task
    vocabulary = task.vocabulary_run()
    reads_vocabulary = bool(vocabulary) and os.path.abspath(vocabulary) == source
    if reads_vocabulary:
        kinds = task.vocabulary_kinds
        if kinds is not None and kind not in kinds:
            return (f"its {task.kind!r} task reads its vocabulary from a {' or '.join(map(repr, kinds))} run, and "
                    f"the study's runs are {kind!r} runs: start the stage from a study of such runs")
        if spec.vocab_size is None:
            return (f"its {task.kind!r} task reads its vocabulary from them, and the study's {kind!r} runs have "
                    f"none ({spec.inputs} inputs)")
    if run.train.init_from != source:
        return None
    if vocabulary and not reads_vocabulary:
        return (f"it takes their encoder (train.init_from) but its task's vocabulary from {vocabulary}, and an "
                "encoder's embeddings belong to its own run's vocabulary: add the task's key to source_keys")
    if not OUTPUT_HEAD_PARTS[spec.output_head].token_encoder or spec.vocab_size is None:
        return (f"it fine-tunes their encoder (train.init_from), and the study's {kind!r} runs train "
                f"{spec.output_head!r} models without a token encoder")
    theirs = spec.model_dump()
    # what the stage's task and its own [model] keys dictate of the encoder must be the source's
    wanted = {**{k: v for k, v in run.model.model_dump().items() if k in stage.config.get("model", {})},
              **task.spec_fields()}
    for key, value in wanted.items():
        if key in theirs and key not in HEAD_FIELDS and _plain(value) != _plain(theirs[key]):
            return (f"it fine-tunes their encoder (train.init_from), whose {key} is {theirs[key]!r}, but its "
                    f"{task.kind!r} task's model has {key} = {value!r}: a stage fine-tunes an encoder of its "
                    "source's own shape")
    return None


def _plain(value: Any) -> Any:
    """A config value as it compares with a spec's: tuples as lists."""
    return list(value) if isinstance(value, tuple) else value


def preflight_config(stage: Stage, variant_config: dict[str, Any]) -> dict[str, Any]:
    """A stage's run config for the study's checks before anything runs (its device, its data):
    the source keys name no run yet, so the configs of every seed and variant of a task are one."""
    cfg = stage_config(stage, variant_config, "", 0)
    cfg["model"] = {}  # the data does not depend on the encoder
    return cfg


def stage_root(study_dir: Path | str, stage: str) -> Path:
    """The folder of a stage's configs, runs, logs and results: ``STUDY_DIR/stages/NAME``."""
    return Path(study_dir) / STAGES_DIR / stage


def stage_record(record: StudyRecord, stage: str) -> StudyRecord:
    """The study record of one stage: the variants it starts from and the same seeds, rooted at its
    folder, so that the study's results and report functions read and write its runs."""
    (mine,) = [s for s in saved_stages(record) if s.name == stage]
    return replace(record, path=stage_root(record.path, stage),
                   variants=[v for v in record.variants if mine.runs_from(v["name"])])


def saved_stages(record: StudyRecord) -> list[Stage]:
    """The stages a saved study declared (none for studies without ``[[stages]]``)."""
    where = str(record.path)
    return [Stage.parse(s, source=where) for s in record.definition.get("stages", [])]
