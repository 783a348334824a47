"""timm models through headwise's trainer (``[model.timm]``): a scaled-down DeiT, XCiT and DaViT
learn the brightness task, a run interrupted and resumed equals one that was not, checkpoints read
back as the same timm model, and what a timm model cannot take is refused in one line."""

from __future__ import annotations

import json

import pytest
import torch

from headwise.errors import HeadwiseError
from headwise.families.vision.cache import ImageCache
from headwise.families.vision.model_source_timm import TimmSpec
from headwise.families.vision.timm_export import export_timm_run, pretrained_overlay
from headwise.hf.export import export_hf
from headwise.model.pretrained import load_pretrained, read_spec
from headwise.run import read_metrics
from headwise.train import RunConfig, run_training
from headwise.train.config import resolve_run_model
from test_image_task import RECIPE, Interrupting, build, cache_dir, idx_folder, task_table  # noqa: F401 - fixtures

pytest.importorskip("timm", reason="timm models need the vision extra (torch 2.14.1, torchvision, timm)")

DEIT = {"name": "deit_tiny_patch16_224", "depth": 2, "heads": 4, "embed_dim": 32, "patch_size": 4}


def timm_config(folder, cache_dir, table, steps: int, task: dict | None = None) -> RunConfig:
    return RunConfig.parse({
        "model": {"timm": table},
        "task": task or task_table(folder, cache_dir=str(cache_dir), augment={"crop_padding": 1}),
        "optim": {"lr": 3e-3, "weight_decay": 0.0},
        "train": {"micro_batch": 32, "steps": steps, "device": "cpu", "log_every": 2},
        "eval": {"every": 10},
        "checkpoint": {"every": 8},
        "analysis": {"every": 20},
    })


def test_a_timm_deit_learns_and_resumes_exactly(tmp_path, idx_folder, cache_dir):
    cfg = timm_config(idx_folder, cache_dir, DEIT, steps=40)
    whole = run_training(cfg, tmp_path / "whole")
    # chance: accuracy 0.25, loss log 4 = 1.39
    assert whole.status == "completed" and whole.eval_metrics["accuracy"] > 0.4 and whole.final_eval_loss < 0.8
    model = load_pretrained(tmp_path / "whole" / "model")
    assert type(model).__name__ == "VisionTransformer" and isinstance(model.spec, TimmSpec)
    assert whole.params == sum(p.numel() for p in model.parameters())
    # the blocks' heads are the plan; the data set the image side, channels and classes
    assert list(whole.plan.heads) == [4, 4] and (model.spec.image_size, model.spec.num_classes) == (16, 4)
    rows = read_metrics(tmp_path / "whole")
    assert "cond_mean" in next(r for r in rows if r["step"] == 20)

    out = tmp_path / "cut"
    cut = run_training(cfg, out, task=Interrupting(build(idx_folder, cache_dir, augment={"crop_padding": 1}), at=13))
    assert cut.status == "interrupted" and cut.steps == 13
    assert run_training(cfg, out, resume=True).status == "completed"
    keys = ("step", "train_loss", "eval_loss", "eval_accuracy")
    assert [[r.get(k) for k in keys] for r in read_metrics(out)] == [[r.get(k) for k in keys] for r in rows]
    again = load_pretrained(out / "model")
    images = torch.randn(3, 1, 16, 16)
    assert torch.equal(again.eval()(images), model.eval()(images))

    # exported in timm's convention: timm.create_model loads it to the same logits, normalised as trained
    folder, name = export_timm_run(tmp_path / "whole", tmp_path / "exported")
    record = json.loads((folder / "headwise.json").read_text())
    timm = pytest.importorskip("timm")
    loaded = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=pretrained_overlay(folder),
                               **record["create_model"]).eval()
    assert torch.equal(loaded(images), model(images))
    assert loaded.pretrained_cfg["mean"] == pytest.approx(ImageCache.open(whole.task["cache"]).mean)
    with pytest.raises(HeadwiseError, match="is a run of a timm model: export it with --timm"):
        export_hf(tmp_path / "whole", tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("table", [
    # XCiT with head width held at 16 as heads double (Leaner's reduced XCiT-M, scaled down)
    {"name": "xcit_nano_12_p16_224", "depth": 2, "heads": 4, "embed_dim": 32, "head_dim": 16, "patch_size": 8},
    # DaViT, per stage
    {"name": "davit_tiny", "depth": [1, 1, 1, 1], "heads": [1, 2, 2, 4], "embed_dim": [8, 16, 16, 32]},
])
def test_staged_and_held_width_timm_models_train_with_the_recipe_and_resume(tmp_path, idx_folder, cache_dir, table):
    pytest.importorskip("kornia", reason="the recipe's RandAugment runs on kornia")
    task = task_table(idx_folder, cache_dir=str(cache_dir), **RECIPE)
    cfg = timm_config(idx_folder, cache_dir, {**table, "drop_path": 0.1}, steps=8, task=task)
    cfg.checkpoint.every, cfg.analysis.every = 4, 0
    whole = run_training(cfg, tmp_path / "whole")
    assert whole.status == "completed"
    out = tmp_path / "cut"
    assert run_training(cfg, out, task=Interrupting(build(idx_folder, cache_dir, **RECIPE), at=5)).status == "interrupted"
    assert run_training(cfg, out, resume=True).status == "completed"
    keys = ("step", "train_loss", "eval_loss")
    assert [[r.get(k) for k in keys] for r in read_metrics(out)] == \
           [[r.get(k) for k in keys] for r in read_metrics(tmp_path / "whole")]
    assert read_spec(out / "model" / "spec.json") == read_spec(tmp_path / "whole" / "model" / "spec.json")


def run_model(table: dict, **task) -> tuple:
    cfg = {"model": table, "task": {"kind": "images", "source": "x", "image_size": 16, "channels": 1,
                                    "num_classes": 4, **task}, "train": {"steps": 1, "micro_batch": 2}}
    return resolve_run_model(cfg)


def test_a_preset_resolves_to_the_papers_model_and_the_data_sets_its_shape():
    spec, plan = run_model({"preset": "timm-xcit-m-reduced"}, image_size=224, channels=3, num_classes=1000)
    assert spec.parameter_count() == 59_002_600 and list(plan.heads) == [16] * 12 and set(plan.head_dims) == {64}
    # changes over a preset's table
    spec, plan = run_model({"preset": "timm-deit-b-reduced", "timm": {"depth": 3}}, image_size=224, channels=3,
                           num_classes=10)
    assert spec.depth == 3 and list(plan.heads) == [16] * 3 and spec.num_classes == 10


@pytest.mark.parametrize("table, message", [
    ({"preset": "timm-vit-b"}, "image_size = 224, but the task's data has 16"),
    ({"timm": {"name": "deit_tiny_patch16_224"}, "n_layers": 3}, "n_layers does not apply to a model of"),
    ({"timm": {"name": "deit_tiny_patch16_224", "patch_size": 4}, "plan": {"scheme": "constant", "total_heads": 4}},
     "plan does not apply"),
    ({"timm": {"name": "deit_tinyy"}}, r"unknown timm model 'deit_tinyy' \(closest: .*deit_tiny"),
    ({"timm": {"name": "deit_tiny_patch16_224", "heads": 5, "patch_size": 4}}, "num_heads=5 does not divide embed_dim=192"),
    ({"timm": {"name": "davit_tiny", "depth": [1, 2]}}, "has 4 stages: depth has 2 values"),
    ({"timm": {"name": "tnt_s_patch16_224", "head_dim": 32}}, "cannot hold head_dim=32"),
    ({"timm": {"name": "xcit_nano_12_p16_224", "patch_size": 4}}, "takes patch_size 8 or 16, got 4"),
    ({"timm": {"name": "deit_tiny_patch16_224", "patch_size": 3}}, "takes images whose side is a multiple of 3; got 16"),
    ({"timm": {"name": "deit_tiny_patch16_224", "depth": 0}}, "must be positive"),
])
def test_what_a_timm_model_cannot_take_is_refused_in_one_line(table, message):
    with pytest.raises(HeadwiseError, match=message) as info:
        run_model(table)
    assert "\n" not in str(info.value)
