"""The scripts under ``benchmarks/`` report failures as the ``headwise`` command does
(:func:`headwise.errors.run_guarded`): bad input one line and 2, a runtime failure 1."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

from bad_input_harness import c, check_outcome, snapshot
from headwise.errors import HeadwiseError, RunFailure, run_guarded

ROOT = Path(__file__).resolve().parents[1]
#: the scripts whose ``main`` takes the user's arguments (bench_tokenize.py calls the package's own)
SCRIPTS = sorted(p for p in (ROOT / "benchmarks").glob("*.py")
                 if any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in ast.parse(p.read_text()).body))


def test_every_script_s_main_is_guarded():
    assert len(SCRIPTS) >= 7
    for path in SCRIPTS:
        main = next(n for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef) and n.name == "main")
        decorators = [ast.unparse(d) for d in main.decorator_list]
        assert decorators == [f"guarded({path.stem!r})"], f"{path.name}: main is decorated {decorators}"


def _raise(exc: BaseException):
    def body():
        raise exc
    return body


@pytest.mark.parametrize("exc, code, line", [(HeadwiseError("no such study"), 2, "tool: error: no such study"),
                                             (RunFailure("3 runs diverged"), 1, "tool: failed: 3 runs diverged"),
                                             (KeyboardInterrupt(), 130, "tool: interrupted")])
def test_run_guarded_is_one_line_and_the_house_status(capsys, exc, code, line):
    assert run_guarded(_raise(exc), "tool") == code
    assert capsys.readouterr().err == line + "\n"


def test_a_script_s_bad_input_is_one_line(tmp_path, monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("image_cache_open", ROOT / "benchmarks" / "image_cache_open.py")
    module = sys.modules["image_cache_open"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        module.main(["--dir", "missing", "--gb", "0.001"])
    check_outcome(c("missing-dir", says="--dir missing is not a folder"), exit_.value.code,
                  capsys.readouterr().err, before, snapshot(tmp_path))
