"""What study and search files share: a TOML definition found by a built-in name or a path, its
presets (``[presets.NAME]`` tables merged over the file, one may ``extends`` another), its
identity and fingerprint, and the objective shape. Both apply ``--set`` overrides to their
``[base]`` run config with :func:`headwise.config.apply_overrides`, under its quoting hints.

The built-ins are the family folders' ``*.toml`` (:func:`headwise.families.family_files`): a
``search-NAME.toml`` is the search NAME (:mod:`headwise.search.definition`), any other file the
study of its name (:mod:`headwise.study.definition`).
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from headwise.config import Config, deep_merge, read_toml
from headwise.errors import HeadwiseError
from headwise.families import family_files

#: the prefix of a family folder's search files, which are not studies
SEARCH_PREFIX = "search-"


@dataclass(frozen=True)
class FileKind:
    """A kind of definition file: what messages call it and which family files are its built-ins."""

    what: str
    plural: str
    #: its built-ins are the family files ``PREFIX + NAME.toml``; "" (the study's): those of no other kind
    prefix: str = ""
    #: said of a directory holding a saved ``WHAT.toml`` (what to do with it), if anything
    saved_hint: str = ""

    def builtins(self) -> dict[str, Any]:
        """This kind's built-in files by name (a family file without the prefix and ``.toml``)."""
        found: dict[str, Any] = {}
        for p in family_files(".toml"):
            if p.name.startswith(SEARCH_PREFIX) != (self.prefix == SEARCH_PREFIX):
                continue
            name = p.name.removeprefix(self.prefix).removesuffix(".toml")
            if name in found:  # one would shadow the other: a packaging bug, not a user's
                raise HeadwiseError(f"two families hold {p.name}: {found[name]} and {p}; rename one")
            found[name] = p
        return found

    def load(self, name_or_path: str) -> tuple[dict[str, Any], str]:
        """The raw TOML of a built-in file (by name) or of a file, and where it came from."""
        builtins = self.builtins()
        if name_or_path in builtins:
            with resources.as_file(builtins[name_or_path]) as path:
                return read_toml(path), f"builtin:{self.prefix}{name_or_path}"
        path = Path(name_or_path)
        if path.is_file():
            return read_toml(path), str(path.resolve())
        if path.is_dir():
            saved = self.saved_hint and (path / f"{self.what}.toml").is_file()
            hint = f" ({self.saved_hint})" if saved else ""
            raise HeadwiseError(f"{name_or_path} is a directory{hint}; pass a {self.what}'s name or a {self.what} "
                                ".toml file")
        if path.suffix == ".toml" or "/" in name_or_path:
            raise HeadwiseError(f"{self.what} file {name_or_path} does not exist")
        hint = difflib.get_close_matches(name_or_path, builtins, n=1)
        extra = f"; did you mean {hint[0]!r}?" if hint else ""
        raise HeadwiseError(f"unknown {self.what} {name_or_path!r}{extra} (built-in {self.plural}: "
                            f"{', '.join(sorted(builtins))}; or pass a .toml file)")


def builtin_listing(entries: dict[str, Any]) -> list[str]:
    """The lines ``--list`` prints for built-in study or search files: each name with its
    description, then each preset with its summary."""
    lines = []
    for name, entry in sorted(entries.items()):
        with resources.as_file(entry) as path:
            raw = read_toml(path)
        lines.append(f"{name}: {' '.join(str(raw.get('description', '')).split())}")
        presets = raw.get("presets", {})
        width = max((len(p) for p in presets), default=0)
        lines += [f"  --preset {preset:<{width}} {body.get('summary', '')}" for preset, body in presets.items()]
    return lines


def merge_preset(raw: dict[str, Any], source: str, preset: str | None,
                 what: str = "study") -> tuple[dict[str, Any], str | None, str]:
    """A copy of a raw study (or search) file with ``preset`` (default: its ``default_preset``)
    deep-merged in, after the presets it ``extends``; returns it without its ``presets`` and
    ``default_preset`` keys, the preset's name and its one-line summary."""
    raw = copy.deepcopy(raw)
    presets = raw.pop("presets", {}) or {}
    default = raw.pop("default_preset", None)
    if not isinstance(presets, dict):
        raise HeadwiseError(f"{source}: `presets` must be a table of named presets")
    preset = default if preset is None else preset
    if preset is None:
        return raw, None, ""
    if preset not in presets:
        known = ", ".join(sorted(presets)) or "none"
        hint = difflib.get_close_matches(preset, presets, n=1)
        extra = f"; did you mean {hint[0]!r}?" if hint else ""
        raise HeadwiseError(f"{what} {raw.get('name', source)!r} has no preset {preset!r}{extra} (presets: {known})")
    chain = _preset_chain(presets, preset, raw.get("name", source))
    summary = str(presets[preset].get("summary", ""))  # one line about the preset, for listings
    for name in chain:
        over = {k: v for k, v in presets[name].items() if k not in ("summary", "extends")}
        raw = deep_merge(raw, over)
    return raw, preset, summary


def _preset_chain(presets: dict[str, Any], name: str, study: str) -> list[str]:
    """The presets to merge, base first: a preset may ``extends = "other"`` another preset."""
    chain: list[str] = []
    while name is not None:
        if name in chain:
            raise HeadwiseError(f"study {study!r}: presets extend each other in a loop ({' -> '.join(chain + [name])})")
        if name not in presets or not isinstance(presets[name], dict):
            raise HeadwiseError(f"study {study!r}: preset {chain[-1]!r} extends unknown preset {name!r}")
        chain.append(name)
        name = presets[name].get("extends")
    return chain[::-1]


def identity(name: str, preset: str | None, what_runs: dict[str, Any]) -> dict[str, Any]:
    """What a rerun must match: the name, the preset and what of the definition decides the runs."""
    return {"name": name, "preset": preset or None, "definition": what_runs}


@dataclass
class Definition:
    """A resolved study or search: its config, where it came from and its preset."""

    config: Any
    source: str
    preset: str | None
    preset_summary: str

    @property
    def name(self) -> str:
        return self.config.name

    def default_out(self, root: str) -> Path:
        """Where it writes without ``--out``: ``ROOT/NAME-PRESET`` under the current directory."""
        return Path(root) / (self.name + (f"-{self.preset}" if self.preset else ""))

    def identity(self) -> dict[str, Any]:
        """See :func:`identity`; each kind keeps what decides its runs."""
        raise NotImplementedError

    def fingerprint(self) -> str:
        """A short hash of :meth:`identity`."""
        return short_hash(self.identity())


def short_hash(data: Any) -> str:
    """A short hash of JSON-like ``data`` (keys sorted: equal data, equal hash)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Objective(Config):
    """One objective of a search: a metric (an eval metric the runs report, ``loss``,
    ``accuracy``..., or a budget metric) and which way is better; what a search file declares and
    what its record reads back."""

    metric: str = "loss"
    direction: Literal["minimize", "maximize"] = "minimize"
