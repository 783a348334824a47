"""A sweep of bad inputs across every subcommand and every config table.

For each case: the exit status (2 for bad input, 1 for a failure while running), exactly one line
on stderr that names what is wrong, no traceback, and everything already on disk (every file's
bytes, and the list of files) unchanged; bad input also writes no new file.

Cases run in-process through :func:`headwise.cli.main` (argparse errors leave it through
``SystemExit(2)``); a few run as ``python -m headwise`` where the process boundary matters. One
tiny nearest-neighbour run (2 steps) is trained once and shared; the files the cases read are
written once into a module-scoped folder (see ``world``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bad_input_harness import Case, c, check_outcome, snapshot
from conftest import REPO, shared_data_dir
from headwise.cli import main

DATA = shared_data_dir()

STUDY = """\
name = "mini"
[base]
model.preset = "amsel-nn"
model.d_model = 16
model.head_dim = 16
model.heads = [1]
model.mlp_hidden = 32
model.max_seq_len = 8
task.kind = "nearest"
task.dim = 16
task.n_points = 8
train.steps = 2
train.micro_batch = 8
"""
AXIS = '[[axes]]\nname = "lr"\nkey = "optim.lr"\nvalues = [0.01]\n'
LM_STUDY = """\
name = "lm-mini"
[base]
model.preset = "tiny-lm"
model.d_model = 32
model.n_layers = 1
model.heads = [2]
model.max_seq_len = 32
task.source = "tinystories-train-sample.txt"
task.validation = "tinystories-valid-sample.txt"
task.tokenizer = "bpe:300"
task.block_size = 32
train.steps = 1
[[variants]]
name = "one"
set = {}
"""

# Files the cases read (name -> text); study files are the mini study plus one bad part.
FILES = {
    "bad.toml": "[model\nd_model = 3\n",
    "tk.toml": '[model]\npreset = "amsel-nn"\n[task]\nkind = "translate"\n[train]\nsteps = 2\n',
    "notask.toml": "[model]\nd_model = 16\n[train]\nsteps = 2\n",
    "notes.txt": "not a config\n",
    "blank.toml": "",
    "model5.toml": "model = 5\n",
    "s_ok.toml": STUDY + AXIS,
    # names no bundled sample: found only under HEADWISE_DATA
    "s_lm.toml": LM_STUDY.replace("tinystories-train-sample.txt", "my-stories.txt"),
    "s_badtoml.toml": 'name = "x"\n[base\n',
    "s_top.toml": 'colour = "red"\n' + STUDY + AXIS,
    "s_seeds.toml": "seeds = 0\n" + STUDY + AXIS,
    "s_novariants.toml": STUDY,
    "s_axis_empty.toml": STUDY + '[[axes]]\nname = "x"\nkey = "optim.lr"\nvalues = []\n',
    "s_axis_name.toml": STUDY + '[[axes]]\nname = "a b"\nkey = "optim.lr"\nvalues = [1]\n',
    "s_axis_label.toml": STUDY + '[[axes]]\nname = "y"\nkey = "optim.lr"\nlabel = "{nope}"\nvalues = [1]\n',
    "s_axis_nokey.toml": STUDY + '[[axes]]\nname = "y"\nvalues = [1]\n',
    "s_axis_badkey.toml": STUDY + '[[axes]]\nname = "x"\nkey = "optim.lrr"\nvalues = [1]\n',
    "s_variant_key.toml": STUDY + '[[variants]]\nname = "v"\nset = { "train.stepz" = 3 }\n',
    "s_variant_name.toml": STUDY + '[[variants]]\nname = "bad name"\nset = {}\n',
    "s_presets.toml": "presets = 3\n" + STUDY + AXIS,
    "s_preset_unknown.toml": STUDY + AXIS + '[presets.p]\nextends = "q"\n',
    "s_preset_loop.toml": STUDY + AXIS + '[presets.p]\nextends = "q"\n[presets.q]\nextends = "p"\n',
    "s_report_kind.toml": STUDY + AXIS + '[report]\nkind = "nope"\n',
    "s_report_nokind.toml": STUDY + AXIS + '[report]\nseriez = "scheme"\n',
    "s_report_key.toml": STUDY + AXIS + '[report]\nkind = "heads"\nseriez = "scheme"\n',
    "s_report_temp.toml": STUDY + AXIS + "[report]\ntemperature = 0\n",
    "s_runner.toml": STUDY + AXIS + "[runner]\njobs = 0\n",
    # study directories as `headwise study` leaves them (only study.toml matters to these cases)
    "rank-study/study.toml": 'name = "mini"\nseeds = 1\nfingerprint = "0"\nvariants = []\n'
                             '[definition.base.task]\nkind = "nearest"\n',
    "broken-study/study.toml": 'name = "mini"\n',
    # a ViT on the 8x8 images of `imgs` (made by `world`), 4 classes
    "img.toml": '[model]\npreset = "vit-tiny-28"\nd_model = 16\nn_layers = 1\nheads = [2]\n'
                '[task]\nkind = "images"\nsource = "imgs"\n[train]\nsteps = 1\nmicro_batch = 4\n',
    # a one-layer Nyströmformer on generated ListOps (its cache made by `world`)
    "lra.toml": '[model]\nd_model = 16\nn_layers = 1\nheads = [2]\nhead_dim = 8\ncausal = false\n'
                'attention = "nystrom"\nlandmarks = 8\npooling = "mean"\nmax_seq_len = 128\n'
                '[task]\nkind = "lra"\ntask = "listops"\n'
                '[task.listops]\nvariant = "short"\nn_train = 40\nn_val = 10\nn_test = 10\n'
                '[train]\nsteps = 1\nmicro_batch = 4\n',
    "lra_files.toml": '[model]\nd_model = 16\nn_layers = 1\nheads = [2]\ncausal = false\nmax_seq_len = 128\n'
                      '[task]\nkind = "lra"\ntask = "listops"\nmax_length = 100\n[train]\nsteps = 1\n',
    "img_bad.toml": '[model]\npreset = "vit-tiny-28"\n[task]\nkind = "images"\nsource = "imgs-magic"\n'
                    '[train]\nsteps = 1\n',
}


def write_image_sources(root: Path) -> None:
    """Image data for the image cases: a good IDX folder (`imgs`, 8x8, 4 classes, its cache built)
    and one broken copy per kind of damage."""
    from test_image_data import random_rgb, write_cifar10, write_folder, write_idx_folder

    from headwise.families.vision.cache import prepare_images

    write_idx_folder(root / "imgs", gz=False, n_train=8, n_test=4, size=(8, 8), classes=4)
    prepare_images(root / "imgs", cache_dir=root / "cache")
    for name in ("imgs-magic", "imgs-trunc"):
        shutil.copytree(root / "imgs", root / name)
    images = root / "imgs-magic" / "train-images-idx3-ubyte"
    images.write_bytes(b"\x01\x02" + images.read_bytes()[2:])
    images = root / "imgs-trunc" / "t10k-images-idx3-ubyte"
    images.write_bytes(images.read_bytes()[:-5])
    write_folder(root / "imgs-empty", {"train": {"a": random_rgb(2)}, "val": {"a": random_rgb(1)}})
    (root / "imgs-empty" / "train" / "b").mkdir()
    write_folder(root / "imgs-mixed", {"train": {"a": random_rgb(1, 5, 5) + random_rgb(1, 6, 5)},
                                       "val": {"a": random_rgb(1)}})
    write_folder(root / "imgs-chan", {"train": {"a": random_rgb(1) + [np.zeros((5, 5), np.uint8)]},
                                      "val": {"a": random_rgb(1)}})
    write_cifar10(root / "imgs-label", label_names=("x", "y"), labels=[0, 1, 2, 1])


def write_lra_sources(root: Path) -> None:
    """The generated ListOps of `lra.toml` (its cache built) and damaged LRA files."""
    from test_lra_data import IMDB, write_imdb_parquet, write_listops

    from headwise.tasks.union import parse_task_config
    from headwise.config import read_toml

    parse_task_config(read_toml(root / "lra.toml")["task"]).cache(cache_dir=root / "cache")
    bad = write_listops(root / "lo-bad")
    (bad / "basic_train.tsv").write_text("Source\tTarget\n( [MAX 2 9 ]\t9\n[MIN 3 ]]\t3\n")
    empty = write_listops(root / "lo-empty")
    (empty / "basic_test.tsv").write_text("Source\tTarget\n")
    write_imdb_parquet(root / "imdb-bad", {**IMDB, "train": [("fine", 1), ("odd", 2)]})


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """A folder with the files the cases read, an empty folder, one tiny trained run, and a copy
    of it with every weights file damaged."""
    root = tmp_path_factory.mktemp("bad-inputs")
    for name, text in FILES.items():
        (root / name).parent.mkdir(exist_ok=True)
        (root / name).write_text(text)
    (root / "latin1.toml").write_bytes(b"[model]\nname = \"caf\xe9\"\n")
    shutil.copy(REPO / "configs" / "nearest-tiny.toml", root / "nn.toml")
    shutil.copy(REPO / "configs" / "lm-tiny.toml", root / "lm.toml")
    (root / "empty").mkdir()
    write_image_sources(root)
    write_lra_sources(root)
    old = Path.cwd()
    os.chdir(root)
    try:
        code = main(["train", "nn.toml", "--out", "run", "--set", "train.steps=2", "--set", "checkpoint.every=1",
                     "--set", "eval.every=0", "--set", "train.log_every=1"])
    finally:
        os.chdir(old)
    assert code == 0
    shutil.copytree(root / "run", root / "damaged")
    for weights in (root / "damaged").rglob("model.safetensors"):
        weights.write_bytes(weights.read_bytes()[:100])
    return root


def train(*sets: str, config: str = "nn.toml", says: tuple[str, ...] | str = (), code: int = 2, **kw) -> Case:
    """``headwise train CONFIG --out new-run --set ...`` (the id is the first override)."""
    argv = ["train", config, "--out", "new-run"] + [a for s in sets for a in ("--set", s)]
    return c(f"train-set-{sets[0] if sets else config}", *argv, code=code, says=says, **kw)


CASES = [
    # the command line itself
    c("no-command", says="required"),
    c("unknown-command", "fly", says="invalid choice"),
    # plan
    c("plan-no-budget", "plan", says="--total-heads"),
    c("plan-heads-without-explicit", "plan", "--heads", "4,4", "--layers", "2", "--total-heads", "8",
      says="--scheme explicit"),
    c("plan-explicit-with-total", "plan", "--scheme", "explicit", "--heads", "4,4", "--layers", "2",
      "--total-heads", "8", says="--total-heads"),
    c("plan-explicit-no-heads", "plan", "--scheme", "explicit", says="--heads"),
    c("plan-heads-not-ints", "plan", "--scheme", "explicit", "--heads", "2,x", says="comma-separated"),
    c("plan-heads-count", "plan", "--scheme", "explicit", "--layers", "2", "--heads", "1,2,3", says="per layer"),
    c("plan-heads-divide", "plan", "--scheme", "explicit", "--d-model", "100", "--layers", "2", "--heads", "3,3",
      says="does not divide"),
    c("plan-layers-0", "plan", "--layers", "0", "--total-heads", "4", says="n_layers"),
    c("plan-layerwise-no-head-dim", "plan", "--scheme", "layerwise", says="--head-dim"),
    c("plan-layerwise-with-budget", "plan", "--scheme", "layerwise", "--head-dim", "64", "--total-heads", "8",
      says="--total-heads"),
    c("plan-layerwise-flag-elsewhere", "plan", "--total-heads", "8", "--ffn-multipliers", "1,2",
      says="--ffn-multipliers applies only to --scheme layerwise"),
    c("plan-layerwise-one-multiplier", "plan", "--scheme", "layerwise", "--head-dim", "64", "--qkv-multipliers", "1",
      says="two comma-separated numbers"),
    c("plan-layerwise-zero-multiplier", "plan", "--scheme", "layerwise", "--head-dim", "64", "--qkv-multipliers",
      "0,1", says="qkv_multipliers"),
    c("plan-d-model-negative", "plan", "--d-model", "-4", "--total-heads", "4", says="d_model"),
    c("plan-unknown-scheme", "plan", "--scheme", "spiral", says="invalid choice"),
    c("plan-ratio-0", "plan", "--scheme", "descending", "--total-heads", "8", "--ratio", "0", says="ratio"),
    c("plan-head-dim-negative", "plan", "--total-heads", "8", "--head-dim", "-1", says="head_dim"),
    c("plan-mlp-hidden-0", "plan", "--total-heads", "4", "--mlp-hidden", "0", says="mlp_hidden"),
    c("plan-vocab-0", "plan", "--total-heads", "4", "--vocab-size", "0", says="vocab_size"),
    c("plan-layers-not-int", "plan", "--layers", "four", says="invalid int"),
    # train: the config file and the run directory
    c("train-no-config", "train", says="config file"),
    c("train-missing-config", "train", "nope.toml", "--out", "new-run", says="does not exist"),
    c("train-config-is-dir", "train", "empty", "--out", "new-run", says=("directory", ".toml")),
    c("train-config-is-run-dir", "train", "run", "--out", "new-run", says=("directory", "--resume")),
    c("train-invalid-toml", "train", "bad.toml", "--out", "new-run", says="not valid TOML"),
    c("train-not-utf8", "train", "latin1.toml", "--out", "new-run", says="not UTF-8"),
    c("train-no-task", "train", "notask.toml", "--out", "new-run", says="task"),
    c("train-unknown-task-kind", "train", "tk.toml", "--out", "new-run", says="unknown task kind 'translate'; use one of: glue, images, lm, lra, mlm, nearest"),
    c("train-empty-config", "train", "blank.toml", "--out", "new-run", says="missing required key 'model'"),
    c("train-model-not-table", "train", "model5.toml", "--out", "new-run", says=("model", "table")),
    c("train-resume-empty-dir", "train", "--resume", "--out", "empty", says="holds no run to resume"),
    c("train-resume-missing-dir", "train", "--resume", "--out", "missing", says="no run to resume"),
    c("train-resume-config-empty-dir", "train", "nn.toml", "--resume", "--out", "empty", says="no run to resume"),
    c("train-out-is-file", "train", "nn.toml", "--out", "notes.txt", says="file"),
    c("train-out-exists", "train", "nn.toml", "--out", "run", says="--resume"),
    c("train-resume-and-overwrite", "train", "nn.toml", "--out", "run", "--resume", "--overwrite",
      says="not allowed with"),
    c("train-resume-other-config", "train", "nn.toml", "--out", "run", "--resume", "--set", "optim.lr=0.02",
      says="lr"),
    c("train-resume-damaged", "train", "--resume", "--out", "damaged", code=1, says="damaged"),
    # image classification: the data's shape against the model's, and damaged image data
    train("model.patch_size=3", config="img.toml", says=("not divisible by patch_size 3", "4")),
    train("task.num_classes=7", config="img.toml", says=("num_classes = 7", "has 4")),
    train("model.num_classes=7", config="img.toml", says="num_classes = 7, but the task's data has 4"),
    train("model.image_size=32", config="img.toml", says="image_size = 32, but the task's data has 8"),
    train("task.channels=3", config="img.toml", says=("channels = 3", "has 1")),
    train("task.source=imgs-magic", config="img.toml", says="bad magic"),
    train("task.source=imgs-trunc", config="img.toml", says="truncated"),
    train("task.source=imgs-empty", config="img.toml", says="holds no images"),
    train("task.source=imgs-mixed", config="img.toml", says=("5x5x3", "image_size")),
    train("task.source=imgs-chan", config="img.toml", says="mixed channels"),
    train("task.source=imgs-label", config="img.toml", says="outside the 2 classes"),
    train("task.source=imgs-none", config="img.toml", says="not found"),
    train("task.image_size=0", config="img.toml", says="image_size"),
    # Long Range Arena: the model against the data, and damaged LRA files
    train("model.max_seq_len=50", config="lra.toml", says="max_seq_len 50 is shorter than the task's sequences (100)"),
    train("model.pad_id=3", config="lra.toml", says="pad_id = 3, but the task's data has 0"),
    train("model.causal=true", config="lra.toml", says="causal = false"),
    train("model.nystrom_conv=4", config="lra.toml", says="odd"),
    train("task.source=lo-bad", config="lra_files.toml", says="basic_train.tsv"),
    train("task.source=lo-empty", config="lra_files.toml", says="test split is empty"),
    train("task.task=text", "task.source=imdb-bad", config="lra_files.toml", says="label 2"),
    train("task.source=lo-none", config="lra.toml", says="task.listops"),
    train("task.task=retrieval", config="lra_files.toml", says="task.source"),
    train("task.listops.variant=huge", config="lra.toml", says="variant"),
    c("data-prepare-image-config", "data", "prepare", "--config", "img_bad.toml", says="bad magic"),
    # --set overrides
    c("set-no-equals", "train", "nn.toml", "--out", "new-run", "--set", "optim.lr", says="key=value"),
    c("set-empty-key", "train", "nn.toml", "--out", "new-run", "--set", "=3", says="empty key"),
    c("set-into-value", "train", "nn.toml", "--out", "new-run", "--set", "model.d_model.x=1", says="not a section"),
    train("model.attention=[local,local]", says=("quote", "--set 'model.attention=[\"local\",\"local\"]'")),
    train("model.attention=local", says="local attention layers need causal = true"),  # one kind: every layer
    train('optim.lr="abc', says="quote"),
    train("foo.bar=1", says=("unknown key 'foo'", "valid keys")),
    train("task=5", says=("task", "table")),
    # [model] and [model.plan]
    train("model.preset=nope", says="preset"),
    train("model.d_model=0", says="d_model"),
    train("model.n_layers=2", says="one per layer"),
    train("model.dropout=1.5", says="dropout"),
    train("model.norm=batch", says="norm"),
    train("model.window=0", says="window"),
    train("model.vocab_size=100", says="vocab"),
    train("model.inputs=tokens", says="inputs"),
    train("model.max_seq_len=4", says="max_seq_len"),
    train("model.plan.scheme=weird", says="scheme"),
    train("model.plan.total_heads=0", says="scheme"),
    train("model.plan.scheme=descending", says="total_heads"),
    train("model.heads=[0]", says="at least 1 head"),
    train("model.dmodel=16", says="did you mean 'd_model'"),
    # [task]: nearest, then lm (config checks before any data is read)
    train("task.dim=0", says="task.dim"),
    train("task.n_points=1", says="n_points"),
    train("task.variant=foo", says="variant"),
    train("task.foo=1", says="unknown key 'task.foo'"),
    train("task.kind=lm", says="unknown key 'task.dim'"),
    train("task.tokenizer=bpe:0", config="lm.toml", says="tokenizer"),
    train("task.tokenizer=spacy", config="lm.toml", says="tokenizer"),
    train("task.block_size=0", config="lm.toml", says="block_size"),
    train("task.validation=fraction:2", config="lm.toml", says="fraction"),
    train("task.format=xml", config="lm.toml", says="format"),
    train("task.subset=0", config="lm.toml", says="subset"),
    # a file found neither as given, nor under HEADWISE_DATA, nor among the bundled samples
    c("train-lm-no-data", "train", "lm.toml", "--out", "new-run", "--set", "task.source=my-stories.txt",
      says="HEADWISE_DATA"),
    # [optim], [schedule], [train], [eval], [checkpoint], [analysis]
    train("optim.lr=0", says="optim.lr"),
    train("optim.weight_decay=-0.1", says="weight_decay"),
    train("optim.betaz=1", says="did you mean 'betas'"),
    train("optim.betas=[0.9]", says=("optim.betas", "too few items")),
    train("schedule.warmup_frac=2", says="warmup_frac"),
    train("schedule.warmup_steps=1", says="not both"),
    train("train.steps=1.5", says="fractional"),
    train("train.micro_batch=0", says="micro_batch"),
    train("train.epochs=1", says="exactly one of steps"),
    train("train.precision=fp8", says="precision"),
    train("train.device=tpu", says="device"),
    train("train.tokens_per_step=7", says="multiple"),
    train("train.steps=abc", says="train.steps"),
    train("eval.every=-1", says="eval.every"),
    train("eval.at_end=maybe", says="at_end"),
    train("checkpoint.keep=0", says="checkpoint.keep"),
    train("checkpoint.every=-5", says="checkpoint.every"),
    train("analysis.every=-1", says="analysis.every"),
    train("analysis.foo=1", says="valid keys: every"),
    # a failure while running: exit 1, and nothing that was there before touched
    train("optim.lr=1e30", "train.grad_clip=0", "train.steps=3", code=1, says="non-finite"),
    # generate
    c("generate-missing", "generate", "missing", says="not a headwise run"),
    c("generate-empty", "generate", "empty", says="no config.toml"),
    c("generate-a-file", "generate", "nn.toml", says="not a headwise run"),
    c("generate-max-new-0", "generate", "run", "--max-new-tokens", "0", says="--max-new-tokens"),
    c("generate-temperature", "generate", "run", "--temperature", "-1", says="--temperature"),
    c("generate-top-k", "generate", "run", "--top-k", "0", says="--top-k"),
    c("generate-top-p", "generate", "run", "--top-p", "2", says="--top-p"),
    c("generate-bad-checkpoint", "generate", "run", "--checkpoint", "empty", says="not a saved headwise model"),
    c("generate-checkpoint-a-file", "generate", "run", "--checkpoint", "nn.toml", says="not a saved headwise model"),
    c("generate-vector-run-prompt", "generate", "run", "--prompt", "hi", says=("'nearest' run", "--prompt")),
    c("generate-vector-run-sampling", "generate", "run", "--temperature", "0", "--top-k", "3",
      says=("--temperature, --top-k", "nothing to do")),
    c("generate-checkpoint-and-untrained", "generate", "run", "--checkpoint", "run/model", "--untrained",
      says="not allowed with"),
    c("generate-damaged", "generate", "damaged", says="damaged"),
    # data
    c("data-no-action", "data", says="required"),
    c("data-prepare-offline-hub", "data", "prepare", says="HEADWISE_DATA"),
    c("data-prepare-missing", "data", "prepare", "nope.txt", says="not found"),
    c("data-prepare-bpe-0", "data", "prepare", "tinystories-tiny-fixture.txt", "--tokenizer", "bpe:0",
      data="shared", says="bpe"),
    c("data-prepare-tokenizer", "data", "prepare", "tinystories-tiny-fixture.txt", "--tokenizer", "foo",
      data="shared", says="tokenizer"),
    c("data-prepare-subset-0", "data", "prepare", "tinystories-tiny-fixture.txt", "--subset", "0", data="shared",
      says="subset"),
    c("data-prepare-validation", "data", "prepare", "tinystories-tiny-fixture.txt", "--validation", "fraction:2",
      data="shared", says="fraction"),
    c("data-prepare-bpe-too-big", "data", "prepare", "tinystories-tiny-fixture.txt", "--tokenizer", "bpe:300000",
      "--quiet", data="shared", says="bpe"),
    c("data-prepare-nearest-config", "data", "prepare", "x", "--config", "nn.toml", says="no text"),
    c("data-prepare-unknown-kind", "data", "prepare", "x", "--config", "tk.toml", says="unknown task kind"),
    c("data-config-is-dir", "data", "prepare", "x", "--config", "empty", says="directory"),
    c("data-info-missing", "data", "info", "nope.txt", says="not found"),
    c("data-info-empty-folder", "data", "info", "empty", says="empty"),
    c("data-list-file", "data", "list", "--cache-dir", "nn.toml", says="file"),
    c("data-list-missing", "data", "list", "--cache-dir", "missing", says="does not exist"),
    # study (--dry-run where the study itself is good, so nothing runs)
    c("study-nothing", "study", says="--list"),
    c("study-unknown", "study", "nope", says="unknown study"),
    c("study-a-directory", "study", "empty", says="directory"),
    c("study-unknown-preset", "study", "progression", "--preset", "nope", says="no preset 'nope'"),
    c("study-seeds-0", "study", "s_ok.toml", "--seeds", "0", "--dry-run", says="--seeds"),
    c("study-jobs-0", "study", "s_ok.toml", "--jobs", "0", "--out", "new-study", says="--jobs"),
    c("study-set-bad", "study", "s_ok.toml", "--set", "train.steps=x", "--dry-run", says="train.steps"),
    c("study-set-no-equals", "study", "s_ok.toml", "--set", "foo", "--dry-run", says="key=value"),
    c("study-set-unquoted-list", "study", "s_ok.toml", "--set", "model.attention=[local]", "--dry-run",
      says=("quote", "--set 'model.attention=[\"local\"]'")),
    c("study-invalid-toml", "study", "s_badtoml.toml", "--dry-run", says="not valid TOML"),
    c("study-top-key", "study", "s_top.toml", "--dry-run", says="unknown key 'colour'"),
    c("study-seeds-key", "study", "s_seeds.toml", "--dry-run", says="seeds"),
    c("study-no-variants", "study", "s_novariants.toml", "--dry-run", says="axes"),
    c("study-axis-empty", "study", "s_axis_empty.toml", "--dry-run", says="axes.values"),
    c("study-axis-name", "study", "s_axis_name.toml", "--dry-run", says="axis name"),
    c("study-axis-label", "study", "s_axis_label.toml", "--dry-run", says="{value}"),
    c("study-axis-no-key", "study", "s_axis_nokey.toml", "--dry-run", says="key"),
    c("study-axis-bad-key", "study", "s_axis_badkey.toml", "--dry-run", says="did you mean 'lr'"),
    c("study-variant-key", "study", "s_variant_key.toml", "--dry-run", says="did you mean 'steps'"),
    c("study-variant-name", "study", "s_variant_name.toml", "--dry-run", says="variant name"),
    c("study-presets-not-table", "study", "s_presets.toml", "--dry-run", says="presets"),
    c("study-preset-extends-unknown", "study", "s_preset_unknown.toml", "--preset", "p", "--dry-run",
      says="unknown preset 'q'"),
    c("study-preset-loop", "study", "s_preset_loop.toml", "--preset", "p", "--dry-run", says="loop"),
    # the report checks [report] before any run (a dry run lists the variants without the report)
    c("study-report-kind", "study", "s_report_kind.toml", "--out", "new-study", says="report kind"),
    c("study-report-no-kind", "study", "s_report_nokind.toml", "--out", "new-study", says="kind"),
    c("study-report-key", "study", "s_report_key.toml", "--out", "new-study", says="did you mean 'series'"),
    c("study-report-temperature", "study", "s_report_temp.toml", "--out", "new-study", says="temperature"),
    c("study-runner-jobs", "study", "s_runner.toml", "--dry-run", says="runner.jobs"),
    c("study-threads-0", "study", "s_ok.toml", "--threads", "0", "--out", "new-study", says="--threads"),
    c("study-address-without-ray", "study", "s_ok.toml", "--address", "auto", "--out", "new-study", says="--backend ray"),
    c("study-out-is-file", "study", "s_ok.toml", "--out", "notes.txt", says="file"),
    c("study-out-other-study", "study", "s_ok.toml", "--out", "rank-study", says="different study"),
    c("study-backend", "study", "s_ok.toml", "--backend", "slurm", says="invalid choice"),
    c("study-data-preflight", "study", "s_lm.toml", "--out", "new-study", says="HEADWISE_DATA"),
    # report
    c("report-missing", "report", "missing", says="not a study directory"),
    c("report-a-file", "report", "nn.toml", says="not a study directory"),
    c("report-at-heads-rank-study", "report", "rank-study", "--at-heads", "5", says=("'rank'", "--at-heads")),
    c("report-broken-study", "report", "broken-study", says="damaged"),
    c("report-a-run", "report", "run", says="not a study directory"),
    c("report-at-heads-negative", "report", "run", "--at-heads", "-5", says="positive"),
    c("report-at-heads-zero", "report", "run", "--at-heads", "0", says="positive"),
    c("report-at-heads-nan", "report", "run", "--at-heads", "nan", says="finite"),
    c("report-at-heads-text", "report", "run", "--at-heads", "many", says="not a number"),
    # analyze
    c("analyze-nothing", "analyze", says="--theory"),
    c("analyze-missing", "analyze", "missing", says="not a directory"),
    c("analyze-empty", "analyze", "empty", says="no run"),
    c("analyze-theory-and-dir", "analyze", "--theory", "run", says="--theory"),
    c("analyze-batches-0", "analyze", "run", "--batches", "0", says="at least 1"),
    c("analyze-checkpoints-some", "analyze", "run", "--checkpoints", "some", says="invalid choice"),
    c("analyze-checkpoints-study", "analyze", "empty", "--checkpoints", "all", says="not a run directory"),
    c("analyze-theory-seeds-0", "analyze", "--theory", "--seeds", "0", says="at least 1"),
    c("analyze-out-is-file", "analyze", "run", "--out", "nn.toml", says=("--out", "file")),
    c("analyze-theory-out-is-file", "analyze", "--theory", "--out", "nn.toml", says=("--out", "file")),
    c("analyze-a-file", "analyze", "nn.toml", says="not a directory"),
    c("analyze-damaged", "analyze", "damaged", says="damaged"),
    # bench (argument checks, before anything is measured)
    c("bench-rounds-0", "bench", "--rounds", "0", says="positive"),
    c("bench-seq-lens", "bench", "--seq-lens", "0", says="sequence lengths"),
    c("bench-only", "bench", "--only", "nope", says="unknown section"),
    c("bench-threads", "bench", "--threads", "-1", says="positive"),
]


def _set_data_env(monkeypatch, which: str | None) -> None:
    if which == "shared":
        monkeypatch.setenv("HEADWISE_DATA", str(DATA))
    else:
        monkeypatch.delenv("HEADWISE_DATA", raising=False)




@pytest.mark.parametrize("case", [pytest.param(k, id=k.id, marks=k.marks) for k in CASES])
def test_bad_input(case: Case, world: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(world)
    monkeypatch.setenv("HEADWISE_CACHE", str(world / "cache"))
    _set_data_env(monkeypatch, case.data)
    before = snapshot(world)
    capsys.readouterr()
    try:
        code = main(case.argv)
    except SystemExit as exc:  # argparse: --help-style exit with a usage error
        code = exc.code if isinstance(exc.code, int) else 1
    err = capsys.readouterr().err
    try:
        check_outcome(case, code, err, before, snapshot(world))
    finally:  # what a failing run left (new files only) goes, so the next case starts from the same world
        for name in ("new-run", "new-study"):
            shutil.rmtree(world / name, ignore_errors=True)


def test_case_ids_are_distinct() -> None:
    ids = [k.id for k in CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 60


SUBPROCESS_CASES = [
    c("argparse-error", "plan", "--layers", "four", says="invalid int"),
    c("bad-set", "train", "nn.toml", "--out", "new-run", "--set", "model.attention=[local,local]", says="quote"),
    c("config-is-dir", "train", "empty", says="directory"),
    c("unknown-task-kind", "train", "tk.toml", "--out", "new-run", says="unknown task kind"),
]


@pytest.mark.parametrize("case", [pytest.param(k, id=k.id) for k in SUBPROCESS_CASES])
def test_bad_input_process(case: Case, world: Path) -> None:
    """The same checks across the process boundary: the real exit status and all of stderr."""
    env = {k: v for k, v in os.environ.items() if k != "HEADWISE_DATA"}
    env["HEADWISE_CACHE"] = str(world / "cache")
    before = snapshot(world)
    proc = subprocess.run([sys.executable, "-m", "headwise", *case.argv], cwd=world, env=env,
                          capture_output=True, text=True, timeout=120)
    check_outcome(case, proc.returncode, proc.stderr, before, snapshot(world))


def test_analyze_says_why_few_points(world: Path, tmp_path: Path, capsys) -> None:
    """A run that keeps 2 checkpoints draws a 2-point curve; the output says why and how to get more."""
    assert main(["analyze", str(world / "run"), "--checkpoints", "all", "--batches", "1",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "only 2 points" in out
    assert "checkpoint.keep = 2" in out and "analysis.every" in out


def test_whole_table_checks_name_no_made_up_location() -> None:
    """A check of a whole table (a model validator) reports its own words, without "(top level)"."""
    from headwise.errors import HeadwiseError
    from headwise.spec import ModelSpec
    from headwise.study.definition import StudyConfig

    for cls, data in ((ModelSpec, {"vocab_size": 10, "d_model": 8, "n_layers": 1, "heads": [2], "mlp_hidden": 0}),
                      (StudyConfig, {"name": "x", "base": {}})):
        with pytest.raises(HeadwiseError) as info:
            cls.parse(data, source="src")
        assert "top level" not in str(info.value) and str(info.value).startswith("src: ")


@pytest.mark.parametrize("kind, kept", [("lm", True), ("nearest", False)])
def test_at_heads_is_kept_for_heads_reports(tmp_path: Path, kind: str, kept: bool) -> None:
    """--at-heads is refused only where the layout fits no curves: a language study (heads layout)
    keeps it, the same study file on the nearest-neighbour task (rank layout) refuses it, so the
    check ran on the study's layout rather than returning early."""
    from headwise.commands.report import _check_at_heads
    from headwise.errors import HeadwiseError

    (tmp_path / "study.toml").write_text('name = "lm"\nseeds = 1\nfingerprint = "0"\nvariants = []\n'
                                         f'[definition.base.task]\nkind = "{kind}"\n')
    if kept:
        assert _check_at_heads(str(tmp_path), 90.0) is None
    else:
        with pytest.raises(HeadwiseError, match="'rank' report"):
            _check_at_heads(str(tmp_path), 90.0)
