"""Where a search keeps things, its saved definition (``search.toml``), and the checks a rerun
must pass before anything is written.

    SEARCH_DIR/
      search.toml          the resolved search (definition after the preset), its fingerprint, the
                           environment its trials ran in (torch threads, torch version), the store
      optuna.db            the Optuna store (SQLite), unless --storage names another
      trials.json          the trials record (headwise.search.trials), rewritten as trials end
      driver.json          the driver's own time against the trials' (its overhead), this sitting's
                           on top, each earlier sitting's under "earlier"
      trials/NNNN/         trial NNNN's run (an ordinary headwise run directory)
      configs/NNNN.toml    its input config
      logs/NNNN.log        its output
      locks/NNNN.lock      held by its run (headwise.study.worker)
      locks/NNNN.claim     held by the driver that runs it
      locks/ask.lock       held by a driver while it counts the trials and asks for one
      confirm/             the confirmation: a study directory (headwise.search.confirm)
      previous-N/          an earlier search moved aside by --new
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import tomli_w

from headwise.config import atomic_write_text, read_toml
from headwise.errors import HeadwiseError
from headwise.search.definition import Search, search_identity
from headwise.search.record import SEARCH_TOML
from headwise.study.layout import job_paths

DRIVER_JSON = "driver.json"
#: files a driver makes before anything else (not a search's content)
LOCKS = (".lock", ".init.lock")


def save_driver_timing(search_dir: Path, timing: dict[str, Any]) -> None:
    """Write this sitting's driver timing, keeping every earlier sitting's under ``earlier``: a
    resumed search (which may run no trial at all) must not erase the sitting that ran them."""
    path = search_dir / DRIVER_JSON
    earlier: list[dict[str, Any]] = []
    try:
        before = json.loads(path.read_text())
    except (OSError, ValueError):  # none yet, or unreadable: nothing to keep
        before = None
    if isinstance(before, dict):
        earlier = before.pop("earlier", []) + [before]
    atomic_write_text(path, json.dumps({**timing, "earlier": earlier} if earlier else timing, indent=1) + "\n")


def trial_name(number: int) -> str:
    return f"{number:04d}"


def trial_paths(search_dir: Path, number: int) -> dict[str, Path]:
    """Trial ``number``'s run directory, input config, log and lock (a RunJob's paths)."""
    return job_paths(search_dir, search_dir / "trials" / trial_name(number), trial_name(number))


def load_saved(search_dir: Path) -> dict[str, Any]:
    """The saved ``search.toml`` ({} when there is none)."""
    path = search_dir / SEARCH_TOML
    if not path.is_file():
        return {}
    data = read_toml(path)
    if not isinstance(data.get("definition"), dict) or "fingerprint" not in data:
        raise HeadwiseError(f"{path} is damaged (no definition or fingerprint); move the folder aside and start again")
    return data


def check_search_dir(search: Search, search_dir: Path, new: bool) -> dict[str, Any]:
    """Refuse an ``--out`` that is a file, holds something else, or holds another search (unless
    ``new``); returns what it holds of this search ({} for a new one). Writes nothing."""
    if not search_dir.exists():
        return {}
    if not search_dir.is_dir():
        raise HeadwiseError(f"--out {search_dir} is a file, not a directory")
    saved = load_saved(search_dir)
    if not saved:
        # a driver starting beside this one may be mid-way through writing search.toml (its temp file)
        if any(p.name not in LOCKS and not (p.name.startswith(f".{SEARCH_TOML}.") and p.name.endswith(".tmp"))
               for p in search_dir.iterdir()):
            raise HeadwiseError(f"--out {search_dir} is not empty and holds no search; choose another directory")
        return {}
    if new:
        return {}
    mine, theirs = search.identity(), search_identity(saved.get("name"), saved.get("preset"), saved["definition"])
    if json.dumps(theirs, sort_keys=True, default=str) != json.dumps(mine, sort_keys=True, default=str):
        changed = sorted(k for k in {*theirs["definition"], *mine["definition"]}
                         if theirs["definition"].get(k) != mine["definition"].get(k))
        what = ", ".join(changed) or "its name or preset"
        raise HeadwiseError(f"--out {search_dir} holds search {saved.get('name')!r} defined differently (changed: "
                            f"{what}); rerun its own command, choose another --out, or pass --new to start a new "
                            "search there (the old one is moved into previous-N/)")
    return saved


def move_aside(search_dir: Path) -> Path:
    """Move an earlier search's files into ``SEARCH_DIR/previous-N`` (``--new``)."""
    n = 1
    while (search_dir / f"previous-{n}").exists():
        n += 1
    target = search_dir / f"previous-{n}"
    target.mkdir()
    for entry in search_dir.iterdir():
        if entry.name not in LOCKS and not entry.name.startswith("previous-"):
            entry.rename(target / entry.name)
    return target


def save_search(search: Search, search_dir: Path, environment: dict[str, Any], storage: str, study_name: str) -> None:
    """Write ``search.toml`` (atomically)."""
    data = search.to_dict()
    data.update(environment=environment, storage=storage, study_name=study_name)
    atomic_write_text(search_dir / SEARCH_TOML, tomli_w.dumps(data))

