"""The image classification family: the task on a hand-made IDX dataset (batches, normalisation,
metrics, a resumable augmented stream), the model fields the data dictates, and training a ViT
end to end, interrupted and resumed exactly."""

from __future__ import annotations

import math
import os
import signal
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch

from headwise.errors import HeadwiseError
from headwise.params import count_params, flops_per_token
from headwise.run import read_metrics
from headwise.tasks.union import parse_task_config
from headwise.data.shuffled import evenly_spaced
from headwise.tasks.classify import topk_accuracy
from headwise.families.vision.image_task import ImageTask
from headwise.train import RunConfig, run_training
from headwise.train.config import resolve_spec

SIDE, CLASSES = 16, 4


def write_idx(path, array: np.ndarray) -> None:
    """An uncompressed IDX file of uint8 ``array`` (MNIST's format)."""
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def brightness(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Noise images whose class k (0..3) is their brightness band, 50 k .. 50 k + 80."""
    labels = np.arange(n) % CLASSES
    images = rng.integers(0, 80, size=(n, SIDE, SIDE)) + 50 * labels[:, None, None]
    return images.astype(np.uint8), labels.astype(np.uint8)


@pytest.fixture(scope="module")
def idx_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("brightness")
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 512), ("t10k", 128)):
        images, labels = brightness(n, rng)
        write_idx(folder / f"{prefix}-images-idx3-ubyte", images)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte", labels)
    return folder


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("image-cache")


def task_table(folder, **extra):
    return {"kind": "images", "source": str(folder), "eval_batch_size": 50, **extra}


def build(folder, cache_dir, **extra) -> ImageTask:
    return parse_task_config(task_table(folder, **extra)).build(cache_dir=cache_dir)


def test_batches_are_the_cached_pixels_normalised(idx_folder, cache_dir):
    task = build(idx_folder, cache_dir)
    assert (task.num_classes, task.seq_len, task.unit, task.vocab_size) == (CLASSES, 1, "images", None)
    assert task.spec_fields() == {"image_size": SIDE, "channels": 1, "num_classes": CLASSES}
    assert task.metric_names == ("accuracy",)  # top-5 only above 10 classes
    raw = task.cache.images("test")
    mean, std = raw.astype(np.float64).mean() / 255, (raw.astype(np.float64) / 255).std()
    batches = task.eval_batches()
    assert [b.inputs.shape[0] for b in batches] == [50, 50, 28]  # every test image, unaugmented
    first = batches[0]
    assert first.inputs.shape == (50, 1, SIDE, SIDE) and first.inputs.dtype == torch.float32
    # the cache's statistics are the training split's; check the formula on the test pixels
    train = task.cache.images("train").astype(np.float64) / 255
    assert task.cache.mean[0] == pytest.approx(train.mean()) and task.cache.std[0] == pytest.approx(train.std())
    expected = (raw[:50, :, :, 0] / 255 - task.cache.mean[0]) / task.cache.std[0]
    assert np.allclose(first.inputs[:, 0].numpy(), expected, atol=1e-6)
    assert first.targets.tolist() == list(np.arange(50) % CLASSES)
    assert math.isfinite(mean) and std > 0


def test_subsets_are_evenly_spaced_and_stay_balanced(idx_folder, cache_dir):
    assert evenly_spaced(10, 4).tolist() == [0, 3, 6, 9] and evenly_spaced(3, None).tolist() == [0, 1, 2]
    task = build(idx_folder, cache_dir, train_examples=100, eval_examples=40)
    assert len(task.train_index) == 100 and task.tokens_per_epoch() == 100
    labels = task.cache.labels("test")[task.eval_index]
    assert all(9 <= n <= 11 for n in np.bincount(labels, minlength=CLASSES))
    # data stored class by class (as class folders are) keeps every class exactly
    assert np.bincount(np.repeat(np.arange(4), 128)[evenly_spaced(512, 40)]).tolist() == [10, 10, 10, 10]


def test_a_holdout_of_the_training_images_is_the_selection_split(idx_folder, cache_dir):
    task = build(idx_folder, cache_dir, holdout=64, train_examples=100)
    held = evenly_spaced(512, 64)
    # evaluation reads the held-out training images, which training never sees
    assert task.eval_split == "train" and task.eval_index.tolist() == held.tolist()
    assert not set(task.train_index.tolist()) & set(held.tolist()) and len(task.train_index) == 100
    first = task.eval_batches()[0]
    assert first.targets.tolist() == task.cache.labels("train")[held[:50]].tolist()
    assert task.describe()["eval_split"] == "train" and build(idx_folder, cache_dir).eval_split == "test"
    with pytest.raises(HeadwiseError, match="leaves no training images of 512"):
        build(idx_folder, cache_dir, holdout=512)


def test_topk_accuracy_by_hand():
    logits = torch.tensor([[0.1, 0.5, 0.2, 0.0, -1.0, 0.3], [3.0, 2.0, 1.0, 0.0, -1.0, -2.0]])
    assert topk_accuracy(logits, torch.tensor([1, 4]), 1).item() == 0.5
    assert topk_accuracy(logits, torch.tensor([5, 4]), 1).item() == 0.0
    assert topk_accuracy(logits, torch.tensor([5, 4]), 5).item() == 1.0  # 4 is the second's 5th
    assert topk_accuracy(logits, torch.tensor([4, 5]), 5).item() == 0.0


def assert_resumes_exactly(task, stream, micro_batch: int = 32, seed: int = 3) -> None:
    """A fresh stream given ``stream``'s saved position draws the next 3 batches exactly as it does."""
    state = stream.state_dict()
    after = [next(stream) for _ in range(3)]
    fresh = task.train_stream(micro_batch, seed=seed)
    fresh.load_state_dict(state)
    for batch in after:
        again = next(fresh)
        assert torch.equal(again.inputs, batch.inputs) and torch.equal(again.targets, batch.targets)


def test_the_augmented_stream_is_seeded_resumable_and_shared_among_ranks(idx_folder, cache_dir):
    task = build(idx_folder, cache_dir, augment={"crop_padding": 2, "flip": True})
    a, b = task.train_stream(32, seed=3), task.train_stream(32, seed=3)
    for _ in range(20):  # past the end of an epoch (16 steps of 32)
        x, y = next(a), next(b)
        assert torch.equal(x.inputs, y.inputs) and torch.equal(x.targets, y.targets)
    assert_resumes_exactly(task, a)
    # augmentation changes the pixels, not the labels; another seed another order
    plain = build(idx_folder, cache_dir).train_stream(32, seed=3)
    aug = task.train_stream(32, seed=3)
    p, q = next(plain), next(aug)
    assert torch.equal(p.targets, q.targets) and not torch.equal(p.inputs, q.inputs)
    assert not torch.equal(next(task.train_stream(32, seed=4)).targets, p.targets)
    # two ranks read disjoint halves of each epoch
    r0, r1 = task.train_stream(16, seed=0, rank=0, world_size=2), task.train_stream(16, seed=0, rank=1, world_size=2)
    seen = np.concatenate([np.concatenate([r0.indices(p), r1.indices(p)]) for p in range(0, 512, 32)])
    assert sorted(seen.tolist()) == list(range(512))
    with pytest.raises(HeadwiseError, match="training images"):
        build(idx_folder, cache_dir, train_examples=100).train_stream(32, seed=3).load_state_dict(a.state_dict())


def test_the_data_sets_the_model_shape_and_refuses_a_contradiction(idx_folder, cache_dir):
    cfg = RunConfig.parse({"model": {"preset": "vit-b16", "patch_size": 4, "d_model": 32, "n_layers": 2,
                                     "heads": [2, 4], "head_dim": 8},
                           "task": task_table(idx_folder), "train": {"steps": 1}})
    spec, plan = resolve_spec(cfg.model, build(idx_folder, cache_dir))
    assert (spec.image_size, spec.channels, spec.num_classes, spec.max_seq_len) == (SIDE, 1, CLASSES, 17)
    assert plan.heads == (2, 4) and spec.inputs == "images" and spec.output_head == "classes"
    # per image: T = 16 patches + the class token, 6N per position plus the attention products
    n = count_params(spec) - 17 * 32
    assert flops_per_token(spec, 1) == 17 * 6 * n + 12 * 17 * 17 * (16 + 32)
    cfg.model.num_classes = 10
    with pytest.raises(HeadwiseError, match="num_classes = 10, but the task's data has 4"):
        resolve_spec(cfg.model, build(idx_folder, cache_dir))
    with pytest.raises(HeadwiseError, match=r"num_classes = 5, but .* has 4"):
        build(idx_folder, cache_dir, num_classes=5)


def vit_config(folder, cache_dir, steps: int, **train) -> RunConfig:
    return RunConfig.parse({
        "model": {"preset": "vit-tiny-28", "patch_size": 4, "d_model": 32, "n_layers": 2, "heads": [2, 4],
                  "head_dim": 8},
        "task": task_table(folder, cache_dir=str(cache_dir), augment={"crop_padding": 1}),
        "optim": {"lr": 3e-3, "weight_decay": 0.0},
        "train": {"micro_batch": 32, "steps": steps, "device": "cpu", "log_every": 2, **train},
        "eval": {"every": 10},
        "checkpoint": {"every": 8},
        "analysis": {"every": 20},
    })


class Interrupting(ImageTask):
    """The task, sending this process SIGTERM while fetching the batch at one stream position."""

    def __init__(self, task: ImageTask, at: int) -> None:
        self.__dict__.update(task.__dict__)
        self.at, self.calls = at, 0

    def batch(self, split, index, generator=None):
        if split == "train":
            self.calls += 1
            if self.calls == self.at:
                os.kill(os.getpid(), signal.SIGTERM)
        return super().batch(split, index, generator)


def test_a_vit_learns_the_task_and_resumes_exactly(tmp_path, idx_folder, cache_dir):
    cfg = vit_config(idx_folder, cache_dir, steps=40)
    whole = run_training(cfg, tmp_path / "whole")
    assert whole.status == "completed" and whole.unit == "images" and whole.tokens == 40 * 32
    assert whole.eval_metrics["accuracy"] > 0.9  # chance is 0.25
    assert whole.task["chance_accuracy"] == 0.25 and whole.flops_per_token > 0
    rows = read_metrics(tmp_path / "whole")
    assert rows[-1]["eval_accuracy"] == whole.eval_metrics["accuracy"]
    assert "cond_mean" in next(r for r in rows if r["step"] == 20)

    out = tmp_path / "cut"
    cut = run_training(cfg, out, task=Interrupting(build(idx_folder, cache_dir, augment={"crop_padding": 1}), at=13))
    assert cut.status == "interrupted" and cut.steps == 13
    resumed = run_training(cfg, out, resume=True)
    assert resumed.status == "completed"
    keys = ("step", "train_loss", "eval_loss", "eval_accuracy")
    assert [[r.get(k) for k in keys] for r in read_metrics(out)] == \
           [[r.get(k) for k in keys] for r in read_metrics(tmp_path / "whole")]


def test_bf16_training_and_top5_above_ten_classes(tmp_path):
    rng = np.random.default_rng(1)
    folder = tmp_path / "twelve"
    folder.mkdir()
    for prefix, n in (("train", 96), ("t10k", 48)):
        labels = np.arange(n) % 12
        write_idx(folder / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, size=(n, SIDE, SIDE)))
        write_idx(folder / f"{prefix}-labels-idx1-ubyte", labels)
    cfg = vit_config(folder, tmp_path / "cache", steps=3, precision="bf16")
    cfg.analysis.every = 0
    summary = run_training(cfg, tmp_path / "run")
    assert summary.status == "completed" and summary.precision == "bf16"
    assert set(summary.eval_metrics) == {"accuracy", "top5_accuracy"}
    assert summary.eval_metrics["top5_accuracy"] >= summary.eval_metrics["accuracy"]


# --- the ViT recipe (Leaner Transformers' Table 6) on the task --------------------------------------

RECIPE = {"augment": {"crop_padding": 2, "flip": True, "randaugment": {"ops": 2, "magnitude": 9, "magnitude_std": 0.5},
                      "mix": {"mixup": 0.8, "cutmix": 1.0}},
          "label_smoothing": 0.1}


def test_the_recipe_stream_is_seeded_resumable_and_leaves_the_global_generator_alone(idx_folder, cache_dir):
    task = build(idx_folder, cache_dir, **RECIPE)
    a, b = task.train_stream(32, seed=3), task.train_stream(32, seed=3)
    torch.manual_seed(1)
    before = torch.get_rng_state()
    first = [next(a) for _ in range(18)]  # past the end of an epoch (16 steps of 32)
    assert torch.equal(torch.get_rng_state(), before)
    torch.manual_seed(2)  # another global state draws the same batches
    for x in first:
        y = next(b)
        assert torch.equal(x.inputs, y.inputs) and torch.equal(x.targets, y.targets)
    assert_resumes_exactly(task, a)
    # training targets are class distributions holding the smoothing; evaluation keeps class ids
    targets = first[0].targets
    assert targets.shape == (32, CLASSES) and targets.dtype == torch.float32
    assert torch.allclose(targets.sum(1), torch.ones(32)) and targets.min() >= 0.1 / CLASSES - 1e-7
    assert task.eval_batches()[0].targets.dtype == torch.int64
    # lam * smooth(y) + (1 - lam) * smooth(mirror's y), one lam for the batch, y in the stream's order
    labels = next(build(idx_folder, cache_dir).train_stream(32, seed=3)).targets
    smoothed = 0.9 * torch.nn.functional.one_hot(labels, CLASSES) + 0.1 / CLASSES
    i = int(torch.nonzero(labels != labels.flip(0))[0])
    lam = (targets[i, labels[i]] - 0.1 / CLASSES) / 0.9
    assert torch.allclose(targets, lam * smoothed + (1 - lam) * smoothed.flip(0), atol=1e-6)
    facts = task.describe()["augment"]
    assert facts["randaugment"]["magnitude"] == 9 and facts["mix"]["mixup"] == 0.8 and facts["label_smoothing"] == 0.1
    assert build(idx_folder, cache_dir).describe()["augment"] == {"crop_padding": 0, "flip": False}


def test_smoothing_alone_gives_smoothed_one_hot_targets(idx_folder, cache_dir):
    plain = next(build(idx_folder, cache_dir).train_stream(16, seed=0))
    smooth = next(build(idx_folder, cache_dir, label_smoothing=0.2).train_stream(16, seed=0))
    assert torch.equal(smooth.inputs, plain.inputs)
    assert torch.allclose(smooth.targets, 0.8 * torch.nn.functional.one_hot(plain.targets, CLASSES) + 0.05)


def test_a_run_without_the_recipe_never_imports_kornia(idx_folder, cache_dir):
    code = ("import sys\nfrom headwise.tasks.union import parse_task_config\n"
            f"task = parse_task_config({task_table(idx_folder, augment={'crop_padding': 1})!r})"
            f".build(cache_dir={str(cache_dir)!r})\n"
            "next(task.train_stream(8, seed=0))\nassert 'kornia' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.slow
def test_a_vit_with_the_recipe_and_drop_path_resumes_exactly(tmp_path, idx_folder, cache_dir):
    cfg = vit_config(idx_folder, cache_dir, steps=16)
    cfg.model.drop_path = 0.2
    cfg.task = parse_task_config(task_table(idx_folder, cache_dir=str(cache_dir), **RECIPE))
    cfg.checkpoint.every, cfg.analysis.every = 4, 0
    whole = run_training(cfg, tmp_path / "whole")
    assert whole.status == "completed" and whole.task["augment"]["mix"]["cutmix"] == 1.0
    out = tmp_path / "cut"
    cut = run_training(cfg, out, task=Interrupting(build(idx_folder, cache_dir, **RECIPE), at=7))
    assert cut.status == "interrupted"
    assert run_training(cfg, out, resume=True).status == "completed"
    keys = ("step", "train_loss", "eval_loss", "eval_accuracy")
    assert [[r.get(k) for k in keys] for r in read_metrics(out)] == \
           [[r.get(k) for k in keys] for r in read_metrics(tmp_path / "whole")]
