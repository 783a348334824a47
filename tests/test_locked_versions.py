"""In CI, the packages that decide headwise's numbers are the versions requirements.lock names:
a machine that kept older releases from an earlier install can no longer hide a break that a new
install meets."""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

LOCK = Path(__file__).resolve().parents[1] / "requirements.lock"
#: the packages whose versions change what the tests compute or check against
CHECKED = ("torch", "torchvision", "timm", "transformers", "lm-eval", "datasets", "tokenizers")


def locked_versions(text: str) -> dict[str, str]:
    """Package name -> pinned version, from a lock's ``name==version ; marker`` lines, keeping the
    lines whose environment marker holds for this interpreter and platform."""
    pins: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate():
            continue
        (spec,) = req.specifier
        pins[canonicalize_name(req.name)] = spec.version
    return pins


def mismatches(installed: dict[str, str | None], locked: dict[str, str]) -> list[str]:
    """One line for each package whose installed version is not its locked one (a local build
    label such as torch's ``+cpu`` is not a difference)."""
    lines = []
    for name, have in installed.items():
        want = locked.get(canonicalize_name(name))
        if want is None:
            lines.append(f"{name} is not in {LOCK.name}: refresh the lock (see README.md)")
        elif have is None:
            lines.append(f"{name} is not installed; {LOCK.name} has {want}")
        elif Version(have).public != Version(want).public:
            lines.append(f"{name} {have} is installed but {LOCK.name} has {want}: "
                         "reinstall with the README's install command")
    return lines


def test_the_lock_parser_keeps_the_pins_for_this_interpreter():
    lock = ("# comment\nnumpy==1.0 ; python_full_version < '3.0'\nnumpy==2.4.6 ; python_full_version >= '3.0'\n"
            "    # via torch\nLM_Eval==0.4.13\n")
    assert locked_versions(lock) == {"numpy": "2.4.6", "lm-eval": "0.4.13"}


def test_a_version_difference_is_one_line_naming_both_versions():
    locked = {"torch": "2.13.0", "transformers": "5.24.0"}
    assert mismatches({"torch": "2.13.0+cpu", "transformers": "5.24.0"}, locked) == []
    assert mismatches({"transformers": "5.23.0"}, locked) == [
        "transformers 5.23.0 is installed but requirements.lock has 5.24.0: reinstall with the README's install command"]
    assert mismatches({"tokenizers": None}, {"tokenizers": "0.23.3"}) == [
        "tokenizers is not installed; requirements.lock has 0.23.3"]


@pytest.mark.skipif(os.environ.get("CI") != "true" or os.environ.get("HEADWISE_DEPS", "lock") != "lock",
                    reason="checked where CI=true installs from the lock; elsewhere other versions may be installed "
                           "on purpose (HEADWISE_DEPS=latest, a developer's own environment)")
def test_ci_runs_the_locked_versions():
    def installed(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    problems = mismatches({name: installed(name) for name in CHECKED}, locked_versions(LOCK.read_text()))
    assert not problems, "\n".join(problems)
