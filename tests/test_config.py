"""The config machinery every TOML file and --set override goes through."""

import pytest

from headwise.config import apply_overrides, parse_value, read_toml
from headwise.errors import HeadwiseError
from headwise.spec import ModelSpec


def test_parse_value_uses_toml_literals():
    assert parse_value("3e-4") == 3e-4
    assert parse_value("[8,4,2,1]") == [8, 4, 2, 1]
    assert parse_value("true") is True
    assert parse_value('"x y"') == "x y"
    assert parse_value("gelu_new") == "gelu_new"  # not a literal: taken as a bare string


def test_overrides_nest_and_replace():
    data = {"model": {"heads": [1, 1]}}
    apply_overrides(data, ["model.heads=[2,2]", "optim.lr=0.01", "train.seed=3"])
    assert data == {"model": {"heads": [2, 2]}, "optim": {"lr": 0.01}, "train": {"seed": 3}}


@pytest.mark.parametrize("bad,needle", [("novalue", "key=value"), ("=3", "empty key"),
                                         ("model.heads.x=1", "is a value, not a section")])
def test_bad_overrides(bad, needle):
    with pytest.raises(HeadwiseError, match=needle):
        apply_overrides({"model": {"heads": [1]}}, [bad])


def test_spec_roundtrips_through_toml(tmp_path):
    spec = ModelSpec(vocab_size=None, d_model=16, n_layers=2, heads=[2, 8], head_dim=[8, 2],
                     norm="unitnorm_post", causal=False, positions="none")
    spec.save(tmp_path / "spec.toml")
    assert ModelSpec.load(tmp_path / "spec.toml") == spec
    assert ModelSpec.load(tmp_path / "spec.toml", ["heads=[4,4]"]).heads == [4, 4]


def test_a_bare_string_where_a_list_belongs_hints_at_quoting(tmp_path):
    ModelSpec(d_model=8, n_layers=2, heads=[2, 2]).save(tmp_path / "spec.toml")
    with pytest.raises(HeadwiseError, match=r"""heads=a,b was read as the string 'a,b'.*--set 'heads=\["a","b"\]'"""):
        ModelSpec.load(tmp_path / "spec.toml", ["heads=a,b"])
    with pytest.raises(HeadwiseError) as refused:  # the hint belongs to the overrides of that load only
        ModelSpec.parse({"d_model": 8, "n_layers": 2, "heads": "a,b"})
    assert "quote" not in str(refused.value)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(HeadwiseError, match="does not exist"):
        read_toml(tmp_path / "nope.toml")
    (tmp_path / "bad.toml").write_text("heads = [1,\n")
    with pytest.raises(HeadwiseError, match="not valid TOML"):
        read_toml(tmp_path / "bad.toml")


def test_type_errors_name_the_key():
    with pytest.raises(HeadwiseError, match=r"d_model: .*got 'wide'"):
        ModelSpec.parse({"d_model": "wide", "n_layers": 1, "heads": [1]})


def test_unknown_key_inside_a_tagged_union_suggests_from_the_right_member():
    from typing import Annotated, Literal, Union

    from pydantic import Field

    from headwise.config import Config

    class A(Config):
        kind: Literal["a"] = "a"
        block_size: int = 1

    class B(Config):
        kind: Literal["b"]
        n_points: int = 1

    class Run(Config):
        task: Annotated[Union[A, B], Field(discriminator="kind")]

    with pytest.raises(HeadwiseError, match=r"unknown key 'task.blok_size'; did you mean 'block_size'\?"):
        Run.parse({"task": {"kind": "a", "blok_size": 3}})
    with pytest.raises(HeadwiseError, match=r"unknown key 'task.n_pionts'; did you mean 'n_points'\?"):
        Run.parse({"task": {"kind": "b", "n_pionts": 3}})
