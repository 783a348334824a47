"""Adding a family edits no existing file. A toy family written as one new folder outside
headwise, found through the ``headwise.families`` entry point, brings every kind of part there is:

- its task and ``[task]`` config (``__init__.py``), a built-in study (``means.toml``) and a report
  layout (``report.py``);
- a model front end and a model head (``model.py``, declared in ``model_parts.py``) and an
  attention kind (``model_attention.py``) that its layers use;
- a model preset (``presets.py``) and a bench section (``bench.py``).

The ordinary CLI trains and reports the study by name, counts the model's parameters exactly,
exports it to a folder that loads and computes the same outputs where neither headwise nor the
toy family is importable, and lists the study, the bench section and every part (``headwise
study --list``, ``headwise bench --list``, ``headwise parts``). Everything of the toy family runs in
subprocesses, so its parts never enter the registries of the test process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

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
    """The mean of a sequence of numbers, by regression."""

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
    """``[task]`` of the mean of a sequence of numbers, by regression."""

    kind: Literal["mean"] = "mean"
    length: int = 8

    def dims(self):
        return None, self.length, None

    def build(self, cache_dir=None, progress=False) -> MeanTask:
        return MeanTask(self.length)


register_family(TaskFamily(kind="mean", config=MeanTaskConfig, inputs="scalars", outputs="mean",
                           report_layout="means"))
'''

MODEL = '''
"""The toy family's model code: its front end and its output head."""

from torch import nn

from headwise.model.inputs import FRONT_ENDS, FrontEnd, add_positions, position_embedding
from headwise.model.outputs import OUTPUT_HEADS, OutputHead


@FRONT_ENDS.register("scalars")
class ScalarInputs(FrontEnd):
    """Numbers [B, T], each embedded by one linear map, plus learned positions."""

    @staticmethod
    def build(spec):
        return {"scalar_emb": nn.Linear(1, spec.d_model), "pos_emb": position_embedding(spec)}

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
    def forward(model, x, pad_vocab, key_mask=None):
        return model.mean_out(x.mean(1)).squeeze(-1)
'''

MODEL_PARTS = '''
"""What the spec knows of the toy family's front end and head, their parameter counts too (the head
exports as the generic class)."""

from headwise.parts import FRONT_END_PARTS, OUTPUT_HEAD_PARTS, FrontEndPart, OutputHeadPart, position_params


def _scalars(spec):
    return {"scalar_embedding": 2 * spec.d_model, "position_embedding": position_params(spec)}


FRONT_END_PARTS.register("scalars", FrontEndPart(default_outputs="mean", param_counts=_scalars, vocabulary=False))
OUTPUT_HEAD_PARTS.register("mean", OutputHeadPart(param_counts=lambda spec: {"mean_head": spec.d_model + 1},
                                                  noun="regressor of sequence means", hf_class="HeadwiseModel"))
'''

ATTENTION = '''
"""The toy family's attention kind: bidirectional softmax attention with a learned gain on each
head's output. It reads only the fields a spec has (a family's kind adds none)."""

import torch
from torch import nn

from headwise.model.attention import AttentionKind, register_kind, softmax_attention


@register_kind
class HeadGainAttention(AttentionKind):
    """Softmax attention whose heads' outputs are scaled by learned gains, one per head."""

    name = "toy_head_gain"

    @staticmethod
    def check(spec, used):
        if used and spec.causal:
            raise ValueError("toy_head_gain layers are bidirectional: set causal = false")

    @staticmethod
    def params(spec, shape):
        return shape.heads

    @staticmethod
    def build(attn, spec, shape):
        attn.head_gain = nn.Parameter(torch.ones(shape.heads))

    @staticmethod
    def forward(attn, q, k, v, cache, queries, key_mask):
        y = softmax_attention(attn, q, k, v, cache, queries, key_mask)
        return y * attn.head_gain[:, None, None]
'''

PRESETS = '''
"""The toy family's model preset: a one-layer model of the toy's parts."""

from headwise.presets import register_preset

register_preset("toy-means", {"inputs": "scalars", "d_model": 8, "n_layers": 1, "heads": [1], "head_dim": 8,
                              "mlp_hidden": 16, "max_seq_len": 8, "causal": False, "attention": "toy_head_gain"})
'''

BENCH = '''
"""The toy family's bench section: forward passes per second of the toy preset's model."""

import time

import torch

from headwise.bench.sections import BenchSection, register_section


def measure(run):
    from headwise.model.transformer import Transformer
    from headwise.presets import spec_from_preset

    model = Transformer(spec_from_preset("toy-means")).eval()
    x = torch.randn(4, 8)
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(3):
            model(x)
    run.result["toy_means"] = {"forwards_per_s": 3 / (time.perf_counter() - start)}


def table(result):
    if "toy_means" not in result:
        return []
    return ["## Toy means", "", f"toy forwards measured: {result['toy_means']['forwards_per_s'] > 0}", ""]


register_section(BenchSection("toy-means", "forward passes per second of the toy family's model", 95,
                              measure, render=table))
'''

LAYOUT = '''
"""The toy family's report layout: the final loss of each variant, by heads."""

from headwise.report.registry import Layout, register_layout


@register_layout
class MeansLayout(Layout):
    """The final loss of each variant of a study of sequence means."""

    kind = "means"
    conditioning = False

    def sections(self, doc):
        rows = [f"- `{v.name}`: {v.total_heads} heads, loss {v.stats.mean:.4f}" for v in self.study.done]
        doc.add("## Mean of numbers", "\\n".join(rows))
        return [f"{len(rows)} variants reported by the toy layout"]
'''

STUDY = '''
name = "means"
description = "Heads against the mean of a sequence of numbers (the toy family's study)."
default_preset = "quick"

[base.model]
preset = "toy-means"

[base.task]
kind = "mean"
length = 8

[base.optim]
lr = 0.01
weight_decay = 0.0

[base.train]
micro_batch = 16
steps = 20
device = "cpu"
log_every = 10

[base.eval]
every = 10

[base.checkpoint]
every = 10
keep = 1

[[variants]]
name = "one-head"
set = {}

[[variants]]
name = "two-heads"
set = { "model.heads" = 2, "model.head_dim" = 4 }

[presets.quick]
summary = "two variants, 20 steps each"
'''

FILES = {"__init__.py": PACKAGE, "model.py": MODEL, "model_parts.py": MODEL_PARTS,
         "model_attention.py": ATTENTION, "presets.py": PRESETS, "bench.py": BENCH, "report.py": LAYOUT,
         "means.toml": STUDY}

#: the generator of the inputs headwise and the export both compute on: 3 sequences of 8 numbers
INPUTS = "torch.Generator().manual_seed(0)"

#: what headwise, with the toy family installed, makes of the runs named by the arguments: by run,
#: the spec's exact count, the built model's, the kinds of its layers and its outputs; and the
#: same counts for the toy preset named alone, and what the spec says of the preset with causal
#: layers, which the toy kind refuses
IN_HEADWISE = f'''
import json, sys
import torch
from headwise.model.transformer import Transformer
from headwise.params import count_params, param_breakdown
from headwise.presets import spec_from_preset
from headwise.train.generate import load_run_model

runs = {{}}
for run in sys.argv[1:]:
    model, _ = load_run_model(run)
    with torch.no_grad():
        out = model(torch.randn(3, 8, generator={INPUTS}))
    runs[run] = {{"count": count_params(model.spec), "built": model.num_params(),
                 "breakdown": param_breakdown(model.spec), "attention": [b.attn.kind.name for b in model.blocks],
                 "outputs": out.tolist()}}
preset = spec_from_preset("toy-means", heads=[3], head_dim=5)
try:
    spec_from_preset("toy-means", causal=True)
    refused = ""
except Exception as exc:
    refused = str(exc)
print(json.dumps({{"runs": runs, "preset": [count_params(preset), Transformer(preset).num_params()],
                  "refused": refused}}))
'''

#: the export loaded where neither headwise nor the toy family can be imported
WITHOUT_HEADWISE = f'''
import json, sys
sys.modules["headwise"] = None
for name in ("headwise", "toyfam"):
    try:
        __import__(name)
        raise SystemExit(name + " is importable")
    except ImportError:
        pass
import torch
import transformers
path = sys.argv[1]
auto_map = json.load(open(path + "/config.json"))["auto_map"]
(auto,) = [name for name in auto_map if name != "AutoConfig"]
model = getattr(transformers, auto).from_pretrained(path, trust_remote_code=True).eval()
x = torch.randn(3, 8, generator={INPUTS})
with torch.no_grad():
    out = model(x)
print(json.dumps({{"class": type(model).__name__, "module": type(model).__module__,
                  "outputs": (out.logits if hasattr(out, "logits") else out).tolist()}}))
'''


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The toy family's folder, its one line of packaging metadata, and how to run headwise with
    it installed (``toy.run``, ``toy.python``)."""
    root = tmp_path_factory.mktemp("toy")
    (root / "toyfam").mkdir()
    for name, text in FILES.items():
        (root / "toyfam" / name).write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    dist = root / "toyfam-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toyfam\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[headwise.families]\nmeans = toyfam\n")
    path = [str(root), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path),
           "HF_MODULES_CACHE": str(root / "hf-modules")}

    def python(*args: str, isolated: bool = False) -> subprocess.CompletedProcess:
        command = [sys.executable, *(["-I"] if isolated else []), *args]
        done = subprocess.run(command, env=env, cwd=root, capture_output=True, text=True, timeout=600,
                              stdin=subprocess.DEVNULL)
        assert done.returncode == 0, f"{' '.join(args[:4])}: exit {done.returncode}\n{done.stderr[-3000:]}"
        return done

    def run(*args: str) -> str:
        return python("-m", "headwise", *args).stdout

    return SimpleNamespace(root=root, run=run, python=python)


@pytest.fixture(scope="module")
def study(toy):
    """The toy family's built-in study, run by name with its preset; the study folder."""
    out = toy.root / "out"
    toy.run("study", "means", "--preset", "quick", "--out", str(out), "--jobs", "1", "--threads", "1")
    return out


def run_dirs(study: Path) -> dict[str, Path]:
    """The study's run folder by variant."""
    return {row["variant"]: study / row["run_dir"] for row in read_csv(study / "results.csv")}


@pytest.fixture(scope="module")
def measured(toy, study):
    """What headwise makes of the study's runs and of the toy preset (see :data:`IN_HEADWISE`)."""
    return json.loads(toy.python("-c", IN_HEADWISE, *map(str, run_dirs(study).values())).stdout)


@pytest.mark.slow
def test_the_toy_study_trains_by_name_and_reports_with_the_toy_layout(study):
    rows = read_csv(study / "results.csv")
    assert sorted(r["variant"] for r in rows) == ["one-head", "two-heads"]
    assert all(r["status"] == "completed" for r in rows), rows
    report = (study / "report" / "report.md").read_text()
    assert "## Mean of numbers" in report and "2 variants reported by the toy layout" in report
    # nothing of the toy family is left in headwise itself
    import headwise

    assert not any(Path(headwise.__file__).parent.rglob("toyfam*"))


@pytest.mark.slow
def test_the_toy_model_uses_the_toy_kind_and_is_counted_exactly(study, measured):
    rows = {row["variant"]: row for row in read_csv(study / "results.csv")}
    for variant, run in run_dirs(study).items():
        got = measured["runs"][str(run)]
        summary = json.loads((run / "summary.json").read_text())
        assert got["attention"] == ["toy_head_gain"], variant
        assert got["count"] == got["built"] == summary["params"] == int(rows[variant]["params"]), variant
        d, heads = 8, summary["plan"]["heads"][0]
        # the block: two LayerNorms, q, k, v and out (with its bias), one gain per head, the MLP
        assert got["breakdown"]["block_0"] == 2 * 2 * d + 4 * d * 8 + d + heads + (d * 16 + 16 + 16 * d + d)
        assert got["breakdown"]["mean_head"] == d + 1 and got["breakdown"]["scalar_embedding"] == 2 * d
    # the preset by name, outside a study, is counted exactly too; the toy kind's check holds
    count, built = measured["preset"]
    assert count == built
    assert "toy_head_gain layers are bidirectional: set causal = false" in measured["refused"]


@pytest.mark.slow
def test_the_toy_model_exports_and_loads_where_headwise_is_not_importable(toy, study, measured):
    run = run_dirs(study)["two-heads"]
    out = toy.root / "export"
    toy.run("export", str(run), "--hf", str(out))
    carried = {p.name for p in out.glob("*.py")}
    assert {"model.py", "model_attention.py", "attention.py"} <= carried, carried
    # the head's declaration names the generic class; the card says how to call it and what the model reads
    config = json.loads((out / "config.json").read_text())
    assert config["auto_map"]["AutoModel"] == "modeling_headwise.HeadwiseModel"
    card = (out / "README.md").read_text()
    assert "model = AutoModel.from_pretrained(path, trust_remote_code=True)" in card
    assert "outputs = model(inputs).logits" in card and "inputs 'scalars'" in card
    got = json.loads(toy.python("-c", WITHOUT_HEADWISE, str(out), isolated=True).stdout)
    assert got["class"] == "HeadwiseModel" and got["module"].startswith("transformers_modules"), got
    expected = measured["runs"][str(run)]["outputs"]
    assert got["outputs"] == pytest.approx(expected, abs=1e-6)


@pytest.mark.slow
def test_the_toy_study_section_preset_and_parts_are_listed(toy):
    listed = toy.run("study", "--list")
    assert "means: Heads against the mean of a sequence of numbers" in listed
    assert "--preset quick two variants, 20 steps each" in listed
    sections = toy.run("bench", "--list")
    assert "toy-means  forward passes per second of the toy family's model" in sections
    bench = toy.run("bench", "--only", "toy-means", "--out", str(toy.root / "bench"))
    assert "## Toy means" in bench and "toy forwards measured: True" in bench
    result = json.loads((toy.root / "bench" / "latest.json").read_text())
    assert result["sections"] == ["toy-means"] and result["toy_means"]["forwards_per_s"] > 0
    tables = toy.run("parts")
    for row in (
        "| `mean` | toyfam | `scalars` -> `mean` | `means` | `[task]` of the mean of a sequence of numbers, by "
        "regression. |",
        "| `scalars` | toyfam.model | `mean` | its head's class | Numbers [B, T], each embedded by one linear map, "
        "plus learned positions. |",
        "| `mean` | toyfam.model | regressor of sequence means | `HeadwiseModel` | One number per sequence, read from "
        "the mean of the final states. |",
        "| `toy_head_gain` | toyfam.model_attention | none | bidirectional | none | Softmax attention whose heads' "
        "outputs are scaled by learned gains, one per head. |",
        "| `toy-means` | toyfam | 1 x 1 | 8 | `scalars` -> `mean` | 682 |",
        "| `means` | toyfam | `mean` | `means` | `quick` | Heads against the mean of a sequence of numbers (the toy "
        "family's study). |",
        "| `means` | toyfam.report | none | The final loss of each variant of a study of sequence means. |",
        "| `toy-means` | toyfam.bench | forward passes per second of the toy family's model |",
    ):
        assert row in tables, row
