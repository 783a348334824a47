"""Task families: every registered family names a front end, an output head and a report layout
that exist, its record and config declare what its task does (front end, head, metrics) without
building it, its config knows the task's shape before any data exists, and a new family plugs in
through the registry alone."""

from __future__ import annotations

from typing import Literal

import pytest

from headwise.errors import HeadwiseError
from headwise.parts import FRONT_END_PARTS, OUTPUT_HEAD_PARTS
from headwise.report.registry import layout_kinds
from headwise.tasks.union import parse_task_config
from headwise.tasks.family import FAMILIES, TaskConfigBase, TaskFamily, family_of, register_family
from headwise.families.encoder.glue_task import GlueFinetuneTask, GlueRegressionTask
from headwise.families.encoder.mlm_task import MLMTask
from headwise.families.encoder.task import MLMTaskConfig
from headwise.families.lm.lm_task import LMTask
from headwise.families.lm.task import LMTaskConfig
from headwise.families.lra.sequence_task import SequenceTask
from headwise.families.nearest.nearest_task import NearestNeighbourTask
from headwise.families.nearest.task import NearestTaskConfig
from headwise.families.vision.image_task import ImageTask
from headwise.train.config import RunConfig, resolve_spec

#: the task classes each built-in family's config builds (the glue family's regression too)
BUILT = {"lm": (LMTask,), "mlm": (MLMTask,), "nearest": (NearestNeighbourTask,), "images": (ImageTask,),
         "lra": (SequenceTask,), "glue": (GlueFinetuneTask, GlueRegressionTask)}


@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_family_names_what_exists(kind):
    family = FAMILIES[kind]
    assert family.inputs in FRONT_END_PARTS and family.outputs in OUTPUT_HEAD_PARTS
    assert family.report_layout in layout_kinds()
    assert family.config.model_fields["kind"].default == kind


@pytest.mark.parametrize("kind", sorted(BUILT))
def test_the_record_declares_what_the_task_takes(kind):
    # the record is read without the task (and torch): it must say what the task class says
    family = FAMILIES[kind]
    for task in BUILT[kind]:
        assert (family.inputs, family.outputs) == (task.inputs, task.outputs), task.__name__


@pytest.mark.parametrize("config, task", [(LMTaskConfig(), LMTask), (MLMTaskConfig(), MLMTask),
                                          (NearestTaskConfig(), NearestNeighbourTask)])
def test_the_config_declares_the_metrics_its_task_records(config, task):
    # families whose metrics do not depend on the table: the config names its task's metric_names
    assert config.reported_metrics() == task.metric_names


def test_built_in_families():
    assert {"lm", "nearest", "images"} <= set(FAMILIES)
    assert family_of("nearest").report_layout == "rank" and family_of("lm").report_layout == "heads"
    assert family_of("images").report_layout == "vision"
    with pytest.raises(HeadwiseError, match="unknown task kind 'audio'"):
        family_of("audio")


def test_a_new_family_plugs_in_through_the_registry(monkeypatch):
    # a family of the nearest task under another name: its config is found by kind and its
    # shape sets the model's front end and head, with no change anywhere else
    class EchoConfig(TaskConfigBase):
        kind: Literal["echo"] = "echo"
        dim: int = 8

        def dims(self):
            return None, 4, self.dim

        def build(self, cache_dir=None, progress=False):
            return NearestNeighbourTask(dim=self.dim, n_points=4, eval_batches=1, eval_batch_size=2)

    # registered into the registry's table, so that the test leaves it as it was
    monkeypatch.setitem(FAMILIES._items, "echo", TaskFamily("echo", EchoConfig, "vectors", "vectors", "rank"))
    cfg = parse_task_config({"kind": "echo", "dim": 8})
    assert cfg.family is FAMILIES["echo"] and cfg.data_description() is None
    model = RunConfig.parse({"model": {"preset": "amsel-nn", "d_model": 8, "head_dim": 8, "max_seq_len": 4},
                             "task": {"kind": "nearest"}, "train": {"steps": 1}}).model
    spec, plan = resolve_spec(model, cfg.shape())
    assert spec.inputs == "vectors" and spec.vocab_size is None and plan.heads == (1,)
    assert cfg.build().shape() == cfg.shape()
    with pytest.raises(HeadwiseError, match="registered twice"):
        register_family(TaskFamily("echo", EchoConfig, "vectors", "vectors", "heads"))
