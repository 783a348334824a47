"""Where documents come from: local files in TinyStories' shapes, or the Hugging Face hub.

A :class:`Source` is a re-iterable sequence of documents (stories, or whole text streams):

- ``stories``: ``.txt`` with stories separated by lines ``<|endoftext|>`` (TinyStories-train.txt)
- ``stream``: ``.txt`` used as one text stream, one document per file
- ``jsonl``: one JSON object per line, the text in a field (``text`` or ``story`` by default)
- ``parquet``: a string column
- ``hub``: a dataset through ``datasets`` (a hub name, or a local folder in the hub's layout)

A folder holds shards of one of the local formats, read in sorted order. Stories are stripped of
surrounding whitespace and empty ones are skipped; a stream is kept as it is.
"""

from __future__ import annotations

import json
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar
from urllib.parse import urlparse

from headwise.data.bundled import sample_path, samples_folder
from headwise.errors import HeadwiseError

KINDS = ("stories", "stream", "jsonl", "parquet", "hub")
FORMATS = ("auto", *KINDS)
SUFFIXES = {".txt": "txt", ".jsonl": "jsonl", ".parquet": "parquet"}
DEFAULT_FIELDS = ("text", "story")

_SEPARATOR = re.compile(rb"^[ \t]*<\|endoftext\|>[ \t\r]*(?:\n|\Z)", re.MULTILINE)
#: what a hub dataset name looks like (``owner/name``)
HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# Shard names that mark a split other than training: a folder holding them mixes splits.
_OTHER_SPLIT = re.compile(r"(?:^|[-_.])(?:valid|validation|val|test|eval)(?:[-_.]|$)", re.IGNORECASE)
_CHUNK = 1 << 23
T = TypeVar("T")
_SNIFF = 1 << 20

LOCAL_HINT = (
    "point headwise at local files instead: a path (a .txt, .jsonl or .parquet file, or a folder of "
    "them) as the source, or set HEADWISE_DATA to the folder that holds them"
)


def data_root() -> Path | None:
    """The folder named by ``HEADWISE_DATA``, where relative source paths are also looked up."""
    value = os.environ.get("HEADWISE_DATA")
    return Path(value).expanduser() if value else None


def find_local(name: str) -> Path | None:
    """``name`` as a local path if it exists as given, else under ``HEADWISE_DATA``, else the
    TinyStories sample of that name that ships with headwise (:mod:`headwise.data.bundled`); else None."""
    path = Path(name).expanduser()
    if path.exists():
        return path.resolve()
    root = data_root()
    if root is not None and not path.is_absolute() and (root / path).exists():
        return (root / path).resolve()
    return sample_path(name)


def hidden(path: Path, root: Path) -> bool:
    """Whether ``path`` is hidden, or in a hidden folder, below ``root``."""
    return any(part.startswith(".") for part in path.relative_to(root).parts)


def visible_files(folder: Path) -> list[Path]:
    """The files under ``folder``, sorted, but those :func:`hidden` below it."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and not hidden(p, folder))


def origin(path: Path) -> str:
    """Where a resolved local source came from: ``HEADWISE_DATA``, the bundled samples, or a path."""
    root = data_root()
    if path.parent == samples_folder():
        return "bundled sample"
    if root is not None and path.is_relative_to(root.resolve()):
        return "HEADWISE_DATA"
    return "path"


@dataclass(frozen=True)
class Source:
    """A re-iterable sequence of documents from local files or a hub dataset."""

    kind: str
    #: resolved local path, or hub name
    name: str
    files: tuple[Path, ...] = ()
    field: str | None = None
    split: str | None = None
    #: where a local source was found: "path", "HEADWISE_DATA" or "bundled sample" (see :func:`origin`)
    found: str | None = None

    def identity(self) -> dict[str, Any]:
        """Everything that decides the documents (with each file's size and mtime), for cache keys."""
        out: dict[str, Any] = {"kind": self.kind, "name": self.name, "field": self.field, "split": self.split}
        if self.files:
            out["files"] = [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in self.files]
        return out

    def label(self) -> str:
        """A short human description."""
        extra = f" split {self.split}" if self.split else ""
        extra += f" field {self.field}" if self.field else ""
        extra += f", from {self.found}" if self.found else ""
        return f"{self.name} ({self.kind}{extra})"

    def documents(self) -> Iterator[str]:
        """The documents, in order."""
        if self.kind == "hub":
            yield from _hub_documents(self)
            return
        for path in self.files:
            if self.kind == "stories":
                yield from _txt_stories(path)
            elif self.kind == "stream":
                text = _decode(path.read_bytes(), path, 0, final=True)
                if text.strip():
                    yield text
            elif self.kind == "jsonl":
                yield from _jsonl_documents(path, self.field)
            else:
                yield from _parquet_documents(path, self.field)

    def count(self) -> int:
        """Number of documents (one pass over the data)."""
        return sum(1 for _ in self.documents())


def open_source(
    name: str, format: str = "auto", field: str | None = None, split: str = "train", strict_field: bool = True
) -> Source:
    """Resolve a source: a local file or folder (as given or under ``HEADWISE_DATA``), else a hub
    dataset name such as ``roneneldan/TinyStories``. Checks that it exists, is not empty and has
    the text field, so bad input fails here with one line, before anything is written.

    A ``field`` given for plain text is an error, unless ``strict_field`` is false (then it is
    ignored: a validation file may be text while the training data is a table)."""
    if format not in FORMATS:
        raise HeadwiseError(f"unknown data format {format!r}: use one of {', '.join(FORMATS)}")
    local = find_local(name)
    # "owner/name" is a hub dataset unless it exists locally or names a data file.
    looks_like_hub = HUB_NAME.fullmatch(name) and Path(name).suffix not in SUFFIXES
    if format == "hub" or (local is None and looks_like_hub):
        return _open_hub(str(local) if local else name, field, split)
    if local is None:
        if data_root() is not None:
            where = f" or under HEADWISE_DATA={data_root()}"
        elif not Path(name).is_absolute():
            where = " (HEADWISE_DATA is not set: set it to the folder that holds this file, or give its full path)"
        else:
            where = ""
        raise HeadwiseError(
            f"data source {name!r} not found as a path{where}; give a file or folder, "
            "or a hub name like roneneldan/TinyStories"
        )
    files = _shards(local) if local.is_dir() else (local,)
    for f in files:
        if f.stat().st_size == 0:
            raise HeadwiseError(f"data file {f} is empty")
    kind = _kind(files, format)
    if kind in ("stories", "stream"):
        _check_text(files[0])
    if kind in ("jsonl", "parquet"):
        field = _choose_field(field, _fields_of(files[0], kind), str(files[0]))
    elif field is not None and strict_field:
        raise HeadwiseError(f"field {field!r} was given but {local} is plain text ({kind}); drop the field")
    else:
        field = None
    return Source(kind=kind, name=str(local), files=files, field=field, found=origin(local))


def _shards(folder: Path) -> tuple[Path, ...]:
    files = [p for p in visible_files(folder) if p.suffix in SUFFIXES]
    if not files:
        raise HeadwiseError(f"folder {folder} holds no .txt, .jsonl or .parquet files")
    suffixes = sorted({p.suffix for p in files})
    if len(suffixes) > 1:
        raise HeadwiseError(f"folder {folder} mixes {', '.join(suffixes)} files: point the source at one kind")
    other = [p.name for p in files if _OTHER_SPLIT.search(p.stem)]
    if other:
        raise HeadwiseError(
            f"folder {folder} holds files of other splits ({other[0]}): point the source at the training "
            "files, or use format = 'hub' to let datasets read the splits"
        )
    return tuple(files)


def _kind(files: tuple[Path, ...], format: str) -> str:
    if format != "auto":
        return format
    suffix = SUFFIXES.get(files[0].suffix)
    if suffix is None:
        raise HeadwiseError(
            f"cannot tell the format of {files[0]} from its name: set format to one of {', '.join(KINDS)}"
        )
    if suffix != "txt":
        return suffix
    # A .txt holds separated stories if a separator line appears near its start.
    with open(files[0], "rb") as f:
        head = f.read(_SNIFF)
    return "stories" if _SEPARATOR.search(head) else "stream"


def _check_text(path: Path) -> None:
    """Refuse a file that is not UTF-8 text (binary data, another encoding) when it is opened,
    before anything else is said about it."""
    with open(path, "rb") as f:
        head = f.read(_SNIFF)
    _decode(head, path, 0, final=True)  # a character cut by the sniff's end is not an error


def _fields_of(path: Path, kind: str) -> list[str]:
    if kind == "parquet":
        import pyarrow.parquet as pq

        return list(read_parquet(path, pq.read_schema).names)
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                return list(_json_record(line, path, lineno))
    raise HeadwiseError(f"data file {path} holds no JSON records")


def _choose_field(field: str | None, fields: list[str], where: str) -> str:
    if field is not None:
        if field not in fields:
            raise HeadwiseError(f"{where} has no field {field!r}; its fields are: {', '.join(fields)}")
        return field
    for name in DEFAULT_FIELDS:
        if name in fields:
            return name
    raise HeadwiseError(f"{where} has neither a 'text' nor a 'story' field ({', '.join(fields)}): set field")


def read_parquet(path: Path, read: Callable[..., T], **options: Any) -> T:
    """``read(path, **options)``, a pyarrow.parquet reader, whose failure is one line naming the file."""
    try:
        return read(path, **options)
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ... by what is wrong with the file
        raise HeadwiseError(f"{path} is not a readable parquet file: {first_line(exc)}") from None


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none), for one-line errors."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _decode(data: bytes, path: Path, offset: int, final: bool = False) -> str:
    """Strict UTF-8; at the very end of a file, an incomplete character (a file cut mid-character)
    is dropped rather than refused."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if final and exc.reason == "unexpected end of data" and exc.end == len(data):
            return data[:exc.start].decode("utf-8")
        raise HeadwiseError(f"{path} is not UTF-8 text (invalid byte at offset {offset + exc.start})") from None


def _txt_stories(path: Path) -> Iterator[str]:
    offset, carry = 0, b""
    with open(path, "rb") as f:
        while True:
            block = f.read(_CHUNK)
            buf = carry + block
            # Only complete lines are split, so a separator is never cut in two.
            end = len(buf) if not block else buf.rfind(b"\n") + 1
            start = 0
            for m in _SEPARATOR.finditer(buf, 0, end):
                story = _decode(buf[start:m.start()], path, offset + start).strip()
                if story:
                    yield story
                start = m.end()
            if not block:
                story = _decode(buf[start:], path, offset + start, final=True).strip()
                if story:
                    yield story
                return
            carry, offset = buf[start:], offset + start


def _json_record(line: bytes, path: Path, lineno: int) -> dict:
    try:
        record = json.loads(line)
    except UnicodeDecodeError:
        raise HeadwiseError(f"{path} line {lineno} is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise HeadwiseError(f"{path} line {lineno} is not valid JSON: {exc.msg}") from None
    if not isinstance(record, dict):
        raise HeadwiseError(f"{path} line {lineno} is not a JSON object")
    return record


def _text_value(value: Any, field: str, where: str) -> str:
    if not isinstance(value, str):
        raise HeadwiseError(f"{where}: field {field!r} holds {type(value).__name__}, not text")
    return value.strip()


def _jsonl_documents(path: Path, field: str | None) -> Iterator[str]:
    assert field is not None
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            record = _json_record(line, path, lineno)
            if field not in record:
                raise HeadwiseError(f"{path} line {lineno} has no field {field!r}")
            text = _text_value(record[field], field, f"{path} line {lineno}")
            if text:
                yield text


def _parquet_documents(path: Path, field: str | None) -> Iterator[str]:
    import pyarrow.parquet as pq

    assert field is not None
    pf = read_parquet(path, pq.ParquetFile)
    if field not in pf.schema_arrow.names:
        raise HeadwiseError(f"{path} has no field {field!r}; its fields are: {', '.join(pf.schema_arrow.names)}")
    for batch in pf.iter_batches(columns=[field], batch_size=4096):
        for value in batch.column(0).to_pylist():
            if value is None:
                continue
            text = _text_value(value, field, str(path))
            if text:
                yield text


# --- the Hugging Face hub -------------------------------------------------------------------


def hub_offline() -> bool:
    """Whether ``datasets`` is told to stay offline (``HF_HUB_OFFLINE``)."""
    import datasets

    return bool(datasets.config.HF_HUB_OFFLINE)


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the hub's host accepts a connection within ``timeout`` seconds. Without network
    ``datasets`` retries for half a minute; this lets headwise fail at once with a clear line."""
    from huggingface_hub import constants

    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True  # only the proxy knows; let datasets try
    url = urlparse(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout).close()
        return True
    except OSError:
        return False


def hub_call(name: str, fn, *args, **kwargs):
    """Call a ``datasets`` function for ``name``, turning its failures into one-line errors."""
    is_local = Path(name).exists()
    if not is_local and not hub_offline() and not hub_reachable():
        raise HeadwiseError(f"cannot reach the Hugging Face hub to load {name!r} (offline?); {LOCAL_HINT}")
    try:
        return fn(name, *args, **kwargs)
    except ValueError as exc:
        msg = first_line(exc)
        if msg.startswith("Bad split"):
            raise HeadwiseError(f"dataset {name!r} has no split {kwargs.get('split')!r} ({msg})") from None
        raise HeadwiseError(f"cannot load dataset {name!r}: {msg}") from None
    except Exception as exc:  # datasets raises many types (ConnectionError, DatasetNotFoundError, ...)
        hint = "" if is_local else f"; {LOCAL_HINT}"
        raise HeadwiseError(f"cannot load dataset {name!r}: {first_line(exc)}{hint}") from None


def hub_splits(name: str) -> list[str]:
    """The split names of a hub dataset (or a local folder in the hub's layout)."""
    import datasets

    return list(hub_call(name, datasets.get_dataset_split_names))


def _hub_stream(name: str, split: str):
    import datasets

    return hub_call(name, datasets.load_dataset, split=split, streaming=True)


def _open_hub(name: str, field: str | None, split: str) -> Source:
    ds = _hub_stream(name, split)
    if ds.features is not None:
        fields = list(ds.features)
    else:
        first = next(iter(ds), None)
        if first is None:
            raise HeadwiseError(f"dataset {name!r} split {split!r} is empty")
        fields = list(first)
    field = _choose_field(field, fields, f"dataset {name!r}")
    files: tuple[Path, ...] = ()
    if Path(name).is_dir():
        # A local folder in the hub's layout: its files' sizes and times key the cache.
        files = tuple(sorted(p for p in Path(name).rglob("*") if p.is_file() and ".cache" not in p.parts))
    return Source(kind="hub", name=name, files=files, field=field, split=split)


def _hub_documents(source: Source) -> Iterator[str]:
    # Streaming reads only as far as the documents are consumed (a first-K subset stops early).
    for row in _hub_stream(source.name, source.split or "train"):
        value = row.get(source.field)
        if value is None:
            continue
        text = _text_value(value, source.field or "", f"dataset {source.name!r}")
        if text:
            yield text
