"""timm models trained by headwise, exported in timm's own convention: small models of each family
with random weights, exported, then loaded by ``timm.create_model`` itself (from the local file,
never the network) to the same logits; the arguments against hand-written ones; every refusal
one line."""

from __future__ import annotations

import json
import socket

import pytest

timm = pytest.importorskip("timm", reason="timm (with torch >= 2.14 and torchvision) is not installed")

import torch  # noqa: E402
from timm.layers import Attention  # noqa: E402

from headwise.errors import HeadwiseError  # noqa: E402
from headwise.families.vision.timm_export import create_model_arguments, export_timm, pretrained_overlay  # noqa: E402
from headwise.families.vision.timm_models import TimmChanges, build_timm_model  # noqa: E402

HELD_VIT = TimmChanges(depth=2, heads=6, mlp_ratio=2.0, embed_dim=48, head_dim=16)
# (name, changes, image side, channels): the families' smallest registered models, scaled down
# where create_model can scale them; VOLO's entrypoints fix all but its MLP ratios
SMALL = {
    "vit-held-width": ("vit_base_patch16_224", HELD_VIT, 32, 1),
    "deit": ("deit_tiny_patch16_224", TimmChanges(depth=2, heads=4, mlp_ratio=2.0, embed_dim=32), 32, 3),
    "xcit": ("xcit_nano_12_p16_224", TimmChanges(depth=2, heads=4, embed_dim=32), 32, 3),
    "davit-stages": ("davit_tiny", TimmChanges(depth=(1, 1, 2, 1), heads=(1, 2, 8, 8), embed_dim=(16, 32, 64, 128)),
                     32, 3),
    "volo-stage-ratios": ("volo_d1_224", TimmChanges(mlp_ratio=(2.0, 3.0, 3.0, 4.0)), 32, 3),
    "unchanged": ("test_resnet", TimmChanges(), 160, 3),
}


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Loading from the exported file must not reach the hub: any connection fails the test."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def refuse(*args, **kwargs):
        raise AssertionError("a test of the timm export opened a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)


def _exported(tmp_path, key: str, num_classes: int = 7, **kwargs):
    name, changes, size, chans = SMALL[key]
    torch.manual_seed(0)
    model = build_timm_model(name, changes, num_classes=num_classes, image_size=size, in_chans=chans).eval()
    out = export_timm(model, name, changes, num_classes=num_classes, image_size=size, in_chans=chans,
                      out_dir=tmp_path / "export", **kwargs)
    arguments = create_model_arguments(name, changes, num_classes=num_classes, image_size=size, in_chans=chans)
    return model, out, name, arguments, torch.randn(2, chans, size, size)


def _assert_same_logits(ours, theirs, x):
    with torch.no_grad():
        torch.testing.assert_close(theirs.eval()(x), ours(x), rtol=0, atol=1e-5)


@pytest.mark.parametrize("key", SMALL)
def test_timm_loads_the_export_to_the_same_logits(tmp_path, key):
    chans = SMALL[key][3]
    ours, out, name, arguments, x = _exported(tmp_path, key, mean=[0.25] * chans, std=[0.5] * chans)
    theirs = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=pretrained_overlay(out), **arguments)
    _assert_same_logits(ours, theirs, x)
    assert theirs.pretrained_cfg["mean"] == [0.25] * chans  # the training normalisation travels
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "headwise.json", "model.safetensors"]
    assert [p.name for p in out.parent.iterdir()] == ["export"]  # no staging folder left


@pytest.mark.parametrize("key", ["vit-held-width", "xcit", "davit-stages", "unchanged"])
def test_timms_local_folder_convention_loads_it_too(tmp_path, key):
    """config.json's arguments rebuild the model; a held width's attention class is not JSON: passed."""
    ours, out, name, arguments, x = _exported(tmp_path, key)
    held = {k: v for k, v in arguments.items() if k == "attn_layer"}
    _assert_same_logits(ours, timm.create_model(f"local-dir:{out}", pretrained=True, **held), x)


def test_the_issues_call_loads_a_model_of_the_names_own_class_count(tmp_path):
    ours, out, name, arguments, x = _exported(tmp_path, "deit", num_classes=1000)
    theirs = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=str(out / "model.safetensors")),
                               **arguments)
    _assert_same_logits(ours, theirs, x)


def test_the_file_alone_loses_another_class_counts_classifier_which_the_overlay_keeps(tmp_path):
    """timm drops the classifier when the model's classes differ from the registered weights' (1,000)."""
    ours, out, name, arguments, x = _exported(tmp_path, "deit")
    alone = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=str(out / "model.safetensors")),
                              **arguments)
    assert not torch.equal(alone.head.weight, ours.head.weight)
    assert torch.equal(alone.blocks[0].attn.qkv.weight, ours.blocks[0].attn.qkv.weight)
    kept = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=str(out / "model.safetensors"),
                                                                                num_classes=7), **arguments)
    _assert_same_logits(ours, kept, x)


def test_the_arguments_are_timms_names_for_the_changes():
    arguments = create_model_arguments("vit_base_patch16_224", HELD_VIT, num_classes=7, image_size=32, in_chans=1)
    held = arguments.pop("attn_layer")
    assert arguments == dict(depth=2, num_heads=6, embed_dim=48, mlp_ratio=2.0, img_size=32, num_classes=7, in_chans=1)
    assert issubclass(held, Attention) and held(48, num_heads=6).qkv.weight.shape == (3 * 6 * 16, 48)
    # timm's own head width needs no class of headwise's
    assert create_model_arguments("vit_base_patch16_224", TimmChanges(heads=16, head_dim=48)) == \
        dict(num_heads=16, img_size=224, num_classes=1000, in_chans=3)
    assert create_model_arguments("davit_tiny", SMALL["davit-stages"][1], num_classes=5) == \
        dict(depths=(1, 1, 2, 1), num_heads=(1, 2, 8, 8), embed_dims=(16, 32, 64, 128), num_classes=5, in_chans=3)
    assert create_model_arguments("volo_d1_224", TimmChanges(mlp_ratio=2.0), image_size=64) == \
        dict(mlp_ratio=2.0, img_size=64, num_classes=1000, in_chans=3)
    assert create_model_arguments("xcit_nano_12_p16_224", TimmChanges(patch_size=8), image_size=32) == \
        dict(patch_size=8, img_size=32, num_classes=1000, in_chans=3)
    assert create_model_arguments("test_resnet", image_size=160) == dict(num_classes=1000, in_chans=3)


def test_the_record_and_config_say_how_to_load_it(tmp_path):
    _, out, *_ = _exported(tmp_path, "vit-held-width", label_names=[f"c{i}" for i in range(7)])
    record = json.loads((out / "headwise.json").read_text())
    assert record == dict(
        timm_model="vit_base_patch16_224",
        changes=dict(depth=2, heads=6, mlp_ratio=2.0, embed_dim=48, head_dim=16),
        num_classes=7, image_size=32, in_chans=1,
        create_model=dict(depth=2, num_heads=6, embed_dim=48, mlp_ratio=2.0, img_size=32, num_classes=7, in_chans=1,
                          attn_layer="headwise.families.vision.timm_attention.held_width_attention(16)"),
        pretrained_cfg_overlay=dict(file="model.safetensors", num_classes=7))
    config = json.loads((out / "config.json").read_text())
    assert (config["architecture"], config["num_classes"], config["label_names"][6]) == ("vit_base_patch16_224", 7, "c6")
    assert config["pretrained_cfg"]["input_size"] == [1, 32, 32]
    assert config["pretrained_cfg"]["tag"] is None  # not the registered weights' recipe


def test_an_existing_folder_is_kept_unless_overwritten(tmp_path):
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "old.txt").write_text("mine")
    with pytest.raises(HeadwiseError, match="exists and is not empty: pass overwrite"):
        _exported(tmp_path, "deit")
    assert (tmp_path / "export" / "old.txt").read_text() == "mine"
    ours, out, name, arguments, x = _exported(tmp_path, "deit", overwrite=True)
    assert not (out / "old.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["export"]


def test_a_failed_export_leaves_nothing(tmp_path, monkeypatch):
    def fail(model, directory, **kwargs):
        (directory / "model.safetensors").write_text("half")
        raise OSError("disk full")

    monkeypatch.setattr(timm.models, "save_for_hf", fail)
    with pytest.raises(OSError, match="disk full"):
        _exported(tmp_path / "a" / "b", "deit")
    assert list(tmp_path.iterdir()) == []  # nor the folders made above the export


@pytest.mark.parametrize("name, changes, message", [
    ("xcit_nano_12_p16_224", TimmChanges(depth=2, heads=4, embed_dim=32, head_dim=16),
     "XCiT 'xcit_nano_12_p16_224' with head_dim=16: timm.create_model cannot hold XCiT's head width"),
    ("volo_d1_224", TimmChanges(depth=(1, 1, 1, 1)),
     "VOLO 'volo_d1_224': timm.create_model cannot express depth=1,1,1,1 (its entrypoint fixes the architecture: "),
    ("davit_tiny", TimmChanges(head_dim=64), "cannot hold head_dim=64"),  # headwise's own refusals stand
    ("test_resnet", TimmChanges(depth=2), "timm model 'test_resnet' takes no changes (depth=2)"),
])
def test_what_create_model_cannot_express_is_refused_in_one_line(name, changes, message):
    with pytest.raises(HeadwiseError) as caught:
        create_model_arguments(name, changes, image_size=32)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_an_xcit_at_timms_own_head_width_exports(tmp_path):
    """head_dim equal to timm's width // heads swaps no attention, so create_model can build it."""
    assert create_model_arguments("xcit_nano_12_p16_224", TimmChanges(depth=2, heads=4, embed_dim=32, head_dim=8),
                                  image_size=32)["depth"] == 2


@pytest.mark.parametrize("changes, mean, message", [
    (TimmChanges(depth=2, heads=4, mlp_ratio=2.0, embed_dim=32), [0.5, 0.5], "one value per channel (3)"),
    (TimmChanges(depth=3, heads=4, mlp_ratio=2.0, embed_dim=32), None, "the model is not timm's 'deit_tiny_patch16_224'"
     " with these changes (12 tensors differ: blocks.2.attn.proj.bias missing vs timm's (32,)"),
])
def test_an_export_that_would_not_load_is_refused_in_one_line(tmp_path, changes, mean, message):
    model = build_timm_model("deit_tiny_patch16_224", SMALL["deit"][1], num_classes=7, image_size=32)
    with pytest.raises(HeadwiseError) as caught:
        export_timm(model, "deit_tiny_patch16_224", changes, num_classes=7, image_size=32, out_dir=tmp_path / "x",
                    mean=mean, std=mean)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert list(tmp_path.iterdir()) == []
