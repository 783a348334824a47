"""Task families: every registered family names a front end, an output head and a report layout
that exist, its config knows the task's shape before any data exists, and a new family plugs in
through the registry alone."""

from __future__ import annotations

from typing import Literal

import pytest

from headwise.errors import HeadwiseError
from headwise.parts import FRONT_END_PARTS, OUTPUT_HEAD_PARTS
from headwise.report.registry import layout_kinds
from headwise.tasks.union import parse_task_config
from headwise.tasks.family import FAMILIES, TaskConfigBase, TaskFamily, family_of, register_family
from headwise.families.nearest.task import NearestNeighbourTask
from headwise.train.config import RunConfig, resolve_spec


@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_family_names_what_exists(kind):
    family = FAMILIES[kind]
    assert family.task.inputs in FRONT_END_PARTS and family.task.outputs in OUTPUT_HEAD_PARTS
    assert family.report_layout in layout_kinds()
    assert family.config.model_fields["kind"].default == kind
    assert isinstance(family.task.metric_names, tuple)


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
    monkeypatch.setitem(FAMILIES._items, "echo", TaskFamily("echo", EchoConfig, NearestNeighbourTask, "rank"))
    cfg = parse_task_config({"kind": "echo", "dim": 8})
    assert cfg.family is FAMILIES["echo"] and cfg.data_description() is None
    model = RunConfig.parse({"model": {"preset": "amsel-nn", "d_model": 8, "head_dim": 8, "max_seq_len": 4},
                             "task": {"kind": "nearest"}, "train": {"steps": 1}}).model
    spec, plan = resolve_spec(model, cfg.shape())
    assert spec.inputs == "vectors" and spec.vocab_size is None and plan.heads == (1,)
    assert cfg.build().shape() == cfg.shape()
    with pytest.raises(HeadwiseError, match="registered twice"):
        register_family(TaskFamily("echo", EchoConfig, NearestNeighbourTask, "heads"))
