"""ModelSpec validation: None is the only "unset", every given width is a positive integer, and
the command line refuses a bad one in one line before anything is written."""

import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from headwise.errors import HeadwiseError
from headwise.spec import READ_ONLY_WITH, ModelSpec

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
BASE = dict(d_model=768, n_layers=4, heads=[12] * 4)


@pytest.mark.parametrize("fields,needle", [
    (dict(head_dim=-1), "head_dim = -1"),
    (dict(head_dim=0), "head_dim = 0"),
    (dict(head_dim=[64, -1, 64, 64]), "layer 1: head_dim = -1"),
    (dict(mlp_hidden=-1), "mlp_hidden = -1"),
    (dict(mlp_hidden=[3072, 3072, 3072, -1]), "layer 3: mlp_hidden = -1"),
])
def test_non_positive_widths_are_refused_in_one_line(fields, needle):
    with pytest.raises(HeadwiseError) as exc:
        ModelSpec.parse({**BASE, **fields}, source="spec")
    message = str(exc.value)
    assert needle in message and "positive integer" in message and "\n" not in message


def test_unset_widths_resolve_to_the_defaults():
    spec = ModelSpec.parse({**BASE, "head_dim": None, "mlp_hidden": None})
    assert spec.head_dims == [64] * 4 and [s.mlp_hidden for s in spec.layers()] == [3072] * 4
    spec = ModelSpec.parse({**BASE, "head_dim": [1, 2, 3, 4], "mlp_hidden": 1})
    assert spec.head_dims == [1, 2, 3, 4] and spec.layer(0).mlp_hidden == 1


def _settings(field: str) -> tuple:
    return typing.get_args(ModelSpec.model_fields[field].annotation)


@pytest.mark.parametrize("name, other", [(name, other) for name, (field, setting) in READ_ONLY_WITH.items()
                                         for other in _settings(field) if other != setting])
def test_an_option_the_model_would_ignore_is_refused_in_one_line(name, other):
    """rope_theta or partial_rotary_factor set while positions are learned did nothing, silently."""
    field, setting = READ_ONLY_WITH[name]
    value = ModelSpec.model_fields[name].default / 2
    assert ModelSpec.parse({**BASE, field: setting, name: value}).model_dump()[name] == value
    with pytest.raises(HeadwiseError) as exc:
        ModelSpec.parse({**BASE, field: other, name: value}, source="spec")
    message = str(exc.value)
    assert f"{name} = {value} has no effect with {field} = {other!r}" in message and f"{setting!r}" in message
    assert "\n" not in message


def _headwise(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "headwise", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)


def _one_line_refusal(proc: subprocess.CompletedProcess, needle: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert needle in proc.stderr


@pytest.mark.parametrize("field", ["head_dim", "mlp_hidden"])
def test_cli_train_refuses_a_negative_width_before_writing(tmp_path, shared_data, field):
    out = tmp_path / "run"
    proc = _headwise("train", str(CONFIGS / "lm-tiny.toml"), "--set", f"model.{field}=-1", "--out", str(out),
                     HEADWISE_DATA=str(shared_data), HEADWISE_CACHE=str(tmp_path / "cache"))
    _one_line_refusal(proc, f"{field} = -1")
    assert not out.exists() or not any(out.iterdir())


def test_cli_plan_refuses_a_negative_head_dim():
    _one_line_refusal(_headwise("plan", "--scheme", "constant", "--total-heads", "8", "--head-dim", "-1"), "head_dim")


@pytest.mark.parametrize("fields", [
    dict(heads=[12, 6, 3, 2]),
    dict(heads=[8, 8, 4, 4], kv_heads=[2, 4, 2, 1], head_dim=[64, 32, 64, 16], mlp_hidden=[512, 1024, 256, 64],
         attention=["global", "local", "global", "local"]),
])
def test_a_spec_with_its_own_layers_is_itself(fields):
    spec = ModelSpec(**{**BASE, **fields})
    again = spec.with_layers(spec.layers())
    assert again.layers() == spec.layers() and again.n_layers == spec.n_layers


def test_layers_replace_depth_and_the_fields_they_set_and_keep_the_rest():
    from headwise.layer_shape import LayerShape

    spec = ModelSpec(**BASE, head_dim=32, mlp_hidden=1000, window=8)
    got = spec.with_layers([LayerShape(heads=2, kv_heads=1), LayerShape(heads=4, kv_heads=4)])
    assert got.n_layers == 2 and got.heads == [2, 4] and got.kv_heads == [1, 4]
    # head width and MLP width left None in every layer: the spec's own
    assert [(s.head_dim, s.mlp_hidden) for s in got.layers()] == [(32, 1000), (32, 1000)] and got.window == 8
    with pytest.raises(ValueError, match="head_dim is set in some layers and not in others"):
        spec.with_layers([LayerShape(heads=2, head_dim=16), LayerShape(heads=2)])
