"""Adding a family edits no existing file: a toy family written as one new folder (its task and
``[task]`` config, a front end and an output head with their declarations, and a report layout),
outside headwise and found through the ``headwise.families`` entry point, is trained and reported
by the ordinary CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tomli_w

from helpers import read_csv

PACKAGE = '''
"""A toy family: a sequence of numbers in, their mean out."""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor

from headwise.tasks.base import Batch, BatchStream, Task
from headwise.tasks.family import TaskConfigBase, TaskFamily, register_family


class MeanStream(BatchStream):
    def __init__(self, length: int, batch: int, seed: int, rank: int) -> None:
        self.length, self.batch, self.seed, self.rank, self.step = length, batch, seed, rank, 0

    @property
    def epoch(self) -> float:
        return 0.0

    def __next__(self) -> Batch:
        g = torch.Generator().manual_seed(hash((self.seed, self.rank, self.step)) % 2**31)
        self.step += 1
        x = torch.randn(self.batch, self.length, generator=g)
        return Batch(x, x.mean(1))

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])


class MeanTask(Task):
    inputs = "scalars"
    outputs = "mean"
    unit = "sequences"

    def __init__(self, length: int) -> None:
        self.length = length

    @property
    def vocab_size(self):
        return None

    @property
    def seq_len(self) -> int:
        return self.length

    def train_stream(self, micro_batch, seed, rank=0, world_size=1):
        return MeanStream(self.length, micro_batch, seed, rank)

    def eval_batches(self):
        return [next(MeanStream(self.length, 32, 12345, 0))]

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        return ((outputs.float() - targets) ** 2).mean()

    def tokens_per_epoch(self):
        return None


class MeanTaskConfig(TaskConfigBase):
    kind: Literal["mean"] = "mean"
    length: int = 8

    def dims(self):
        return None, self.length, None

    def build(self, cache_dir=None, progress=False) -> MeanTask:
        return MeanTask(self.length)


register_family(TaskFamily(kind="mean", config=MeanTaskConfig, task=MeanTask, report_layout="means"))
'''

MODEL = '''
"""The toy family's model code: its front end and its output head."""

from torch import nn

from headwise.model.inputs import FRONT_ENDS, FrontEnd, add_positions, position_embedding, position_params
from headwise.model.outputs import OUTPUT_HEADS, OutputHead


@FRONT_ENDS.register("scalars")
class ScalarInputs(FrontEnd):
    """Numbers [B, T], each embedded by one linear map, plus learned positions."""

    @staticmethod
    def build(spec):
        return {"scalar_emb": nn.Linear(1, spec.d_model), "pos_emb": position_embedding(spec)}

    @staticmethod
    def param_counts(spec):
        return {"scalar_embedding": 2 * spec.d_model, "position_embedding": position_params(spec)}

    @staticmethod
    def forward(model, inputs, past):
        return add_positions(model, model.scalar_emb(inputs.unsqueeze(-1)), past)


@OUTPUT_HEADS.register("mean")
class MeanHead(OutputHead):
    """One number per sequence, read from the mean of the final states."""

    @staticmethod
    def build(spec, model):
        return {"mean_out": nn.Linear(spec.d_model, 1)}

    @staticmethod
    def param_counts(spec):
        return {"mean_head": spec.d_model + 1}

    @staticmethod
    def forward(model, x, pad_vocab, key_mask=None):
        return model.mean_out(x.mean(1)).squeeze(-1)
'''

MODEL_PARTS = '''
"""What the spec knows of the toy family's front end and head."""

from headwise.parts import FRONT_END_PARTS, OUTPUT_HEAD_PARTS, FrontEndPart, OutputHeadPart

FRONT_END_PARTS.register("scalars", FrontEndPart(default_outputs="mean", vocabulary=False))
OUTPUT_HEAD_PARTS.register("mean", OutputHeadPart())
'''

LAYOUT = '''
"""The toy family's report layout: the final loss of each variant, by heads."""

from headwise.report.registry import Layout, register_layout


@register_layout
class MeansLayout(Layout):
    kind = "means"
    conditioning = False

    def sections(self, doc):
        rows = [f"- `{v.name}`: {v.total_heads} heads, loss {v.stats.mean:.4f}" for v in self.study.done]
        doc.add("## Mean of numbers", "\\n".join(rows))
        return [f"{len(rows)} variants reported by the toy layout"]
'''


@pytest.mark.slow
def test_a_family_from_one_new_folder_trains_and_reports(tmp_path):
    # the family: one folder, plus the one line of packaging metadata that names it
    (tmp_path / "toyfam").mkdir()
    (tmp_path / "toyfam" / "__init__.py").write_text(textwrap.dedent(PACKAGE))
    (tmp_path / "toyfam" / "model.py").write_text(textwrap.dedent(MODEL))
    (tmp_path / "toyfam" / "model_parts.py").write_text(textwrap.dedent(MODEL_PARTS))
    (tmp_path / "toyfam" / "report.py").write_text(textwrap.dedent(LAYOUT))
    dist = tmp_path / "toyfam-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toyfam\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[headwise.families]\nmeans = toyfam\n")
    base = {
        "model": {"d_model": 8, "n_layers": 1, "heads": 1, "head_dim": 8, "mlp_hidden": 16, "max_seq_len": 8,
                  "causal": False},
        "task": {"kind": "mean", "length": 8},
        "optim": {"lr": 0.01, "weight_decay": 0.0},
        "train": {"micro_batch": 16, "steps": 20, "device": "cpu", "log_every": 10},
        "eval": {"every": 10},
        "checkpoint": {"every": 10, "keep": 1},
    }
    study = tmp_path / "means.toml"
    study.write_text(tomli_w.dumps({"name": "means", "base": base, "variants": [
        {"name": "one-head", "set": {}}, {"name": "two-heads", "set": {"model.heads": 2, "model.head_dim": 4}}]}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "headwise", "study", str(study), "--out", str(out), "--jobs", "1",
                           "--threads", "1"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_csv(out / "results.csv")
    assert sorted(r["variant"] for r in rows) == ["one-head", "two-heads"]
    assert all(r["status"] == "completed" for r in rows)
    report = (out / "report" / "report.md").read_text()
    assert "## Mean of numbers" in report and "2 variants reported by the toy layout" in report
    # nothing of the toy family is left in headwise itself
    import headwise

    assert not any(Path(headwise.__file__).parent.rglob("toyfam*"))
