"""Typed configuration: pydantic models loaded from TOML, overridable with ``key=value``.

Every config object in headwise derives from :class:`Config`. Validation errors become a
single-line :class:`~headwise.errors.HeadwiseError` (with a "did you mean" for misspelt keys),
so the CLI can report them without a traceback.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import hashlib
import math
import os
import tempfile
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TypeVar

import tomli_w
from pydantic import BaseModel, ConfigDict, ValidationError

from headwise.errors import HeadwiseError

C = TypeVar("C", bound="Config")


class Config(BaseModel):
    """Base for all config objects: strict about unknown keys, validated on assignment, and every
    float finite (TOML reads ``nan`` and ``inf`` as numbers, which no setting means)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, allow_inf_nan=False)

    @classmethod
    def parse(cls: type[C], data: dict[str, Any], source: str = "config") -> C:
        """Validate ``data`` into this class, raising a one-line HeadwiseError on failure (with a
        hint at quoting under :func:`quoting_hints`)."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            message = describe_validation_error(cls, exc, source)
            raise HeadwiseError(message + _quoting_hint(cls, exc, _BARE.get())) from None

    @classmethod
    def load(cls: type[C], path: str | Path, overrides: list[str] | None = None) -> C:
        """Load from a TOML file, apply ``key=value`` overrides, validate."""
        data = read_toml(path)
        with quoting_hints(apply_overrides(data, overrides or [])):
            return cls.parse(data, source=str(path))

    def to_dict(self) -> dict[str, Any]:
        """A plain dict, None values dropped (TOML has no null), ready for TOML or JSON."""
        return _drop_none(self.model_dump(mode="json"))

    def save(self, path: str | Path) -> None:
        """Write this config as TOML, atomically."""
        atomic_write_text(Path(path), tomli_w.dumps(self.to_dict()))


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def finite_float(text: str) -> float:
    """A number on the command line (the argparse ``type`` of every float option): ``nan`` and
    ``inf``, which ``float()`` reads, are refused, as :class:`Config` refuses them in files."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def read_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file; a missing or malformed file is a HeadwiseError."""
    p = Path(path)
    if p.is_dir():
        inside = p / "config.toml"
        hint = (f" (a run's own config is {inside}; `--resume --out {p}` continues that run)"
                if inside.is_file() else "")
        raise HeadwiseError(f"config file {p} is a directory, not a file: pass the path of a .toml file{hint}")
    if not p.is_file():
        raise HeadwiseError(f"config file {p} does not exist: pass the path of a .toml file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise HeadwiseError(f"{p} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}): "
                            "save it as UTF-8, as TOML requires") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise HeadwiseError(f"{p} is not valid TOML: {exc}") from None


def parse_value(text: str, key: str = "KEY") -> Any:
    """Parse an override's value as a TOML literal (numbers, booleans, lists, quoted strings);
    anything else is taken as a bare string, except what looks like a list, table or quoted
    string but is not valid TOML (the shell ate its quotes): that is a HeadwiseError with a hint
    at quoting (``key`` names the override in it)."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        if text[:1] in ("[", "{", '"', "'"):
            raise HeadwiseError(f"--set {key}={text}: {text} is not a valid TOML value; "
                                f"{quoting_example(key, text)}") from None
        return text


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """Set ``a.b.c`` in a nested dict, creating tables on the way."""
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise HeadwiseError(f"override {key}={value!r} has an empty key: give KEY=VALUE, e.g. optim.lr=3e-4")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise HeadwiseError(f"key {key!r}: {part!r} is a value, not a section")
        node = child
    node[parts[-1]] = copy.deepcopy(value)  # the same value may be set into several configs


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` merged into a copy of ``base``: tables merge recursively, everything else replaces."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``: a nested config as dotted keys (the ``--set`` names)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, str]:
    """Apply ``section.key=value`` overrides to a nested dict, in place. Returns the overrides
    whose value was not a TOML literal and was taken as a bare string (key -> text), so that a
    validation error on one of them can hint at quoting. A value that looks like a list, table or
    quoted string but is not valid TOML (the shell ate its quotes) is refused with that hint
    (see :func:`parse_value`)."""
    bare: dict[str, str] = {}
    for item in overrides:
        if "=" not in item:
            raise HeadwiseError(f"override {item!r} is not of the form key=value (e.g. optim.lr=3e-4)")
        key, _, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        value = parse_value(raw, key)
        if isinstance(value, str) and value == raw:  # a TOML string literal always loses its quotes
            bare[key] = raw
        set_dotted(data, key, value)
    return bare


#: the bare overrides (key -> text) of what is being validated: see :func:`quoting_hints`
_BARE: ContextVar[dict[str, str]] = ContextVar("bare_overrides", default={})


@contextmanager
def quoting_hints(bare: dict[str, str]) -> Iterator[None]:
    """Within it, a config that fails validation on a key set by one of ``bare`` (what
    :func:`apply_overrides` returns) hints at quoting. A context rather than an argument: the
    definitions of studies and searches validate their runs' configs deep in what they call."""
    token = _BARE.set(bare)
    try:
        yield
    finally:
        _BARE.reset(token)


def quoting_example(key: str, raw: str, as_list: bool = False) -> str:
    """How to quote ``key=raw`` on a shell command line so that TOML reads it as meant (a list
    when ``raw`` looks like one or ``as_list``)."""
    text = raw.strip("[]{}\"'")
    if raw.startswith("[") or as_list:
        items = [t.strip().strip("\"'") for t in text.split(",") if t.strip()]
        shown = ",".join(t if _is_number(t) else f'"{t}"' for t in items)
        example = f"[{shown}]"
    else:
        example = f'"{text}"'
    return f"quote strings inside it and the whole argument for the shell, e.g. --set '{key}={example}'"


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return text in ("true", "false")


#: pydantic errors of a string where a list was wanted (the quotes of its items lost to the shell)
_LIST_ERRORS = ("list_type", "tuple_type", "set_type")


def _quoting_hint(cls: type[BaseModel], exc: ValidationError, bare: dict[str, str]) -> str:
    """A hint at quoting when the failing key was set by ``--set`` with a bare (unquoted) string."""
    if not bare:
        return ""
    err = _chosen_error(exc)
    path, _ = _resolve_loc(cls, tuple(err["loc"]))
    key = ".".join(path)
    if err["type"] not in _LIST_ERRORS:  # a wrong value, not a lost quote: quoting would not help
        return ""
    for set_key, raw in bare.items():
        if key == set_key or key.startswith(set_key + "."):
            return f" ({set_key}={raw} was read as the string {raw!r}: {quoting_example(set_key, raw, as_list=True)})"
    return ""


def _model_in(annotation: Any, tag: Any = None) -> type[BaseModel] | None:
    """The pydantic model inside an annotation (Optional, Annotated, or a union tagged ``tag``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    members = []
    for arg in getattr(annotation, "__args__", None) or ():
        model = _model_in(arg)
        if model is not None:
            members.append(model)
    for model in members:
        kind = model.model_fields.get("kind")
        if tag is not None and kind is not None and tag in getattr(kind.annotation, "__args__", ()):
            return model
    return members[0] if len(members) == 1 else None


def _resolve_loc(cls: type[BaseModel], loc: tuple[Any, ...]) -> tuple[list[str], list[str]]:
    """Follow an error location from ``cls``: the readable path (union tags and list indices
    dropped) and the field names of the model the path ends in."""
    model: Any = cls
    path: list[str] = []
    i = 0
    while i < len(loc):
        part = loc[i]
        field = model.model_fields.get(part) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None:
            path.extend(str(p) for p in loc[i:] if not isinstance(p, int))
            return path, []
        path.append(str(part))
        nxt = loc[i + 1] if i + 1 < len(loc) else None
        inner = _model_in(field.annotation, tag=nxt)
        # A tagged union puts the tag in the location: skip it.
        if inner is not None and nxt is not None and "kind" in inner.model_fields and nxt not in inner.model_fields:
            i += 1
        model = inner
        i += 1
    return path, list(model.model_fields) if isinstance(model, type) and issubclass(model, BaseModel) else []


def _chosen_error(exc: ValidationError) -> dict[str, Any]:
    """The error to report: a misspelt key first, since it usually also explains a "missing" one."""
    errors = exc.errors()
    return next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])


def describe_validation_error(cls: type[BaseModel], exc: ValidationError, source: str) -> str:
    """Turn the most useful pydantic error into one readable line (a misspelt key first, since
    it usually also explains a "missing" one)."""
    err = _chosen_error(exc)
    loc = tuple(err["loc"])
    path, _ = _resolve_loc(cls, loc)
    where = ".".join(path)
    kind, value = err["type"], err.get("input")
    if kind == "extra_forbidden":
        name = str(loc[-1])
        _, known = _resolve_loc(cls, loc[:-1])
        hint = difflib.get_close_matches(name, known, n=1)
        suggestion = f"; did you mean {hint[0]!r}?" if hint else f"; valid keys: {', '.join(known)}"
        return f"{source}: unknown key {where!r}{suggestion}"
    ctx = err.get("ctx") or {}
    # A check of a whole table (a model validator) names its own keys: no location to add.
    prefix = f"{source}: {where}: " if where else f"{source}: "
    if kind == "union_tag_invalid":
        tags = ", ".join(sorted(t.strip().strip("'") for t in str(ctx.get("expected_tags", "")).split(",")))
        table = path[-1] if path else "table"
        return f"{prefix}unknown {table} kind {ctx.get('tag')!r}; use one of: {tags}"
    if kind in ("union_tag_not_found", "model_type", "dict_type"):
        table = f"[{where}]" if where else "the config"
        return f"{prefix}expected a table ({table} with its keys), got {value!r}"
    if kind == "missing":
        if loc and isinstance(loc[-1], int):  # a fixed-length list (tuple) is short of items
            return f"{prefix}too few items (item {loc[-1] + 1} is missing), got {value!r}"
        return f"{source}: missing required key {where!r}"
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    shown = "" if isinstance(value, dict) else f" (got {value!r})"
    return f"{prefix}{msg}{shown}"


def sha256_file(path: Path) -> str:
    """The sha256 of a file's bytes (hex), read in blocks so that large files need no memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def atomic_write_text(path: Path, text: str) -> None:
    """Write a file so that a crash leaves either the old content or the new, never half."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write bytes to ``path`` via a temporary file, fsync and rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp creates 0600 files; give the result the permissions a plain open() would.
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
