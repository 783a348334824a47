"""NaN and infinity wherever a user gives a number: every float option of every command, every
float key of a run config (``--set``), a study's claim margin.

``float()`` and TOML both read ``nan``, ``inf`` and ``-inf`` as numbers, and NaN passes every check
written as a comparison (``ratio <= 0`` is false), so each must be refused where it enters. The
options and keys are found by walking the argparse tree and the run config's models, so a float
added later is swept without a new case. Each case checks what every sweep checks
(:mod:`bad_input_harness`): exit status 2, one line on stderr naming the option or key, no
traceback, nothing on disk changed and no new file.
"""

from __future__ import annotations

import argparse
import shutil
import typing
from pathlib import Path

import pytest
import tomli_w

from bad_input_harness import Case, c, run_case
from conftest import REPO
from headwise.cli import build_parser
from headwise.config import Config, _model_in
from headwise.train.config import RunConfig
from helpers import tiny_nearest_config

BAD = ("nan", "inf", "-inf")


def _subcommands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command words, parser) of every command that runs, subcommands included."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
    for action in subs:
        for name, sub in action.choices.items():
            yield from _subcommands(sub, (*path, name))


def _reads(action: argparse.Action, text: str) -> object:
    try:
        return action.type(text) if callable(action.type) else None
    except (argparse.ArgumentTypeError, TypeError, ValueError):
        return None


def float_option_cases() -> list[Case]:
    """One case per float option (its ``type`` reads ``0.5`` as a float, or ``0.5,0.5`` as
    floats) and bad value; required positionals get a placeholder, as the option is refused first."""
    cases = []
    for path, parser in _subcommands(build_parser()):
        positionals = ["x" for a in parser._actions if not a.option_strings and a.required]
        for action in parser._actions:
            if not action.option_strings:
                continue
            flag = action.option_strings[-1]
            one, pair = _reads(action, "0.5"), _reads(action, "0.5,0.5")
            if isinstance(one, float):
                values = BAD
            elif isinstance(pair, (tuple, list)) and all(isinstance(v, float) for v in pair):
                values = tuple(f"0.5,{b}" for b in BAD)
            else:
                continue
            # FLAG=VALUE: argparse would take a bare -inf for an option
            cases += [c(f"{' '.join(path)} {flag}={v}", *path, *positionals, f"{flag}={v}", says=(flag, v))
                      for v in values]
    return cases


OPTION_CASES = float_option_cases()


def test_the_walk_finds_the_float_options() -> None:
    """The walk is not vacuous: it finds the options of the issue."""
    found = {case.argv[-1].split("=")[0] for case in OPTION_CASES if case.argv[0] == "plan"}
    assert {"--ratio", "--kv-ratio", "--qkv-multipliers", "--ffn-multipliers"} <= found


@pytest.mark.parametrize("case", [pytest.param(k, id=k.id) for k in OPTION_CASES])
def test_every_float_option_refuses_what_is_not_finite(case: Case, tmp_path: Path, monkeypatch, capsys) -> None:
    run_case(case, tmp_path, monkeypatch, capsys)


def _toml_value(annotation: object, bad: str) -> str | None:
    """``bad`` as the TOML value of a field of this type: itself for a float, a list or table of
    it for floats in a container; None for a field that holds no float."""
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if annotation is float or float in args and origin is not tuple and origin is not list:
        return bad
    if origin in (tuple, list) and float in args:
        return f"[{bad}, {bad}]"
    if origin is dict:
        inner = _toml_value(args[1], bad)
        return None if inner is None else f"{{ a = {inner} }}"
    for arg in args:
        if (inner := _toml_value(arg, bad)) is not None:
            return inner
    return None


def float_keys(model: type[Config], tag: str, prefix: str = "") -> dict[str, typing.Any]:
    """Every float key of ``model`` (its tables followed; a union of tables, the one tagged
    ``tag``), dotted, with its annotation."""
    out: dict[str, typing.Any] = {}
    for name, field in model.model_fields.items():
        inner = _model_in(field.annotation, tag=tag)
        if inner is not None:
            out.update(float_keys(inner, tag, f"{prefix}{name}."))
        elif _toml_value(field.annotation, "nan") is not None:
            out[f"{prefix}{name}"] = field.annotation
    return out


def required_beside(model: type[Config], key: str, tag: str) -> list[str]:
    """``--set`` arguments for the required text keys of the table holding ``key`` (a table the
    tiny config lacks, such as [train.distill], needs its teacher before a float in it is read)."""
    *tables, _ = key.split(".")
    for name in tables:
        model = _model_in(model.model_fields[name].annotation, tag=tag)
    prefix = ".".join(tables)
    return [arg for name, field in model.model_fields.items() if field.is_required() and field.annotation is str
            and f"{prefix}.{name}" != key for arg in ("--set", f"{prefix}.{name}=x")]


#: the float keys of the tiny LM config's run config ([model] with its plan, the lm [task], ...)
RUN_KEYS = float_keys(RunConfig, tag="lm")
CONFIG_CASES = [c(f"train --set {key}={value}", "train", "lm.toml", "--out", "new-run", "--set", f"{key}={value}",
                  *required_beside(RunConfig, key, "lm"), says=("finite number", key))
                for key, annotation in RUN_KEYS.items() for value in (_toml_value(annotation, b) for b in BAD)]


def test_the_walk_finds_the_float_keys() -> None:
    assert {"optim.lr", "optim.betas", "model.rope_theta", "model.partial_rotary_factor", "model.plan.ratio",
            "model.plan.qkv_multipliers", "schedule.cycle_beta1", "train.grad_clip"} <= set(RUN_KEYS)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """The tiny LM config as a user would copy it, and a study of the tiny nearest-neighbour
    config whose claim's margin is infinite."""
    root = tmp_path_factory.mktemp("bad-floats")
    shutil.copy(REPO / "configs" / "lm-tiny.toml", root / "lm.toml")
    for bad in BAD:
        study = {"name": "mini", "base": tiny_nearest_config(2, 1, 0),
                 "variants": [{"name": "h1", "set": {"model.heads": [1]}},
                              {"name": "h2", "set": {"model.heads": [2], "model.head_dim": 4}}],
                 "claims": [{"name": "as good", "test": "as_good", "metric": "pick_accuracy", "better": "higher",
                             "margin": float(bad), "pairs": [["h2", "h1"]]}]}
        (root / f"study{bad}.toml").write_text(tomli_w.dumps(study))
    return root


STUDY_CASES = [c(f"study claim margin {bad}", "study", f"study{bad}.toml", "--dry-run",
                 says=("finite number", "claims.margin")) for bad in BAD]


@pytest.mark.parametrize("case", [pytest.param(k, id=k.id) for k in CONFIG_CASES + STUDY_CASES])
def test_every_float_key_refuses_what_is_not_finite(case: Case, world: Path, monkeypatch, capsys) -> None:
    run_case(case, world, monkeypatch, capsys, leftovers=("new-run",))
