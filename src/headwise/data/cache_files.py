"""What every headwise cache (token, image and sequence caches) does with its folder and files.

A cache is a folder under a cache root (:func:`cache_root`) named by the key of the request it was
built from (:func:`request_key`), holding data files and ``meta.json``, which records the request
and each file's size and sha256. :class:`CacheFolder` is an opened, checked cache: each kind of
cache subclasses it, naming itself and checking its own files (:meth:`CacheFolder.checked`).

Building happens in a hidden temporary folder beside the final one (:func:`build_in_temporary`):
the data files are written, hashed and synced on the way (:class:`HashedFile`,
:func:`write_array`), ``meta.json`` last (:meth:`CacheFolder.write_meta`), then the folder is
given ordinary permissions and renamed into place (:func:`install`), so an interrupted build never
leaves a folder that looks complete (hidden ``.tmp`` folders are leftovers and may be deleted).
Opening a cache reads ``meta.json`` (:func:`read_meta`) and checks every file's size and, when
asked, its sha256 against it (:func:`check_file`); an unusable cache is refused with one line
(:class:`CacheInvalid`), and an existing one found unusable when preparing is refused with how to
rebuild it (:meth:`CacheFolder.existing`).

A cache too large to hash on every open (images) also records a digest of its own metadata
(:attr:`CacheFolder.DIGEST`, checked by :meth:`CacheFolder.read`): opening it then checks the
metadata and every large file's size without reading the data (files small enough to hash at
every open, an image cache's labels, are still hashed), and the sha256 of the rest is compared
once after writing and on ``headwise data verify``. Token and sequence caches record no digest
and hash their files whenever they are opened with ``verify``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Self

import numpy as np

from headwise.config import atomic_write_text, sha256_file
from headwise.errors import HeadwiseError

META = "meta.json"
#: the key of ``meta.json`` holding the sha256 of the rest of it (see :func:`meta_digest`)
META_DIGEST = "meta_sha256"
_BLOCK = 1 << 24  # bytes written (and hashed) at a time: no second full copy in memory

#: part of every cache's folder name (:func:`request_key`): bumping it renames, so rebuilds, every cache
KEY_VERSION = 1


class CacheInvalid(HeadwiseError):
    """A cache folder that must not be used (incomplete, truncated, corrupted or mismatched)."""


#: the error of one cache folder, given the reason
Invalid = Callable[[str], CacheInvalid]


# --- opening ---------------------------------------------------------------------------------


def read_meta(
    path: Path, what: str, invalid: Invalid, kind: str | None = None, version: int | None = None,
) -> Any:
    """``meta.json`` of the cache folder ``path``, parsed. With ``kind``, it must be a dict recording
    that kind and the format ``version``, or the folder is not a ``what`` ("image cache") of it."""
    try:
        meta = json.loads((path / META).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise invalid(f"{META} is missing (an interrupted build, or not a headwise {what})") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise invalid(f"{META} is not valid JSON") from None
    if kind is not None and (not isinstance(meta, dict) or meta.get("format") != version or meta.get("kind") != kind):
        found = meta.get("format") if isinstance(meta, dict) else None
        article = "an" if what[:1] in ("a", "e", "i", "o", "u") else "a"
        raise invalid(f"not {article} {what} of format {version} (format {found!r})")
    return meta


def check_file(
    path: Path, record: dict[str, Any], expected: int | None, verify: bool, invalid: Invalid,
) -> None:
    """The file ``record`` names (``file``, ``bytes``, ``sha256``, as :func:`write_array` returns)
    in the cache folder ``path`` must exist and hold ``expected`` bytes (None: the recorded size),
    as recorded; ``verify`` also compares its sha256."""
    name = record["file"]
    file = path / name
    if not file.is_file():
        raise invalid(f"{name} is missing")
    size = file.stat().st_size
    if expected is None:
        expected = int(record["bytes"])
    if size != expected or size != int(record["bytes"]):
        how = "truncated" if size < expected else "grown or replaced"
        raise invalid(f"{name} has {size:,} bytes, expected {expected:,} ({how})")
    if verify and sha256_file(file) != record["sha256"]:
        raise invalid(f"{name} does not match its recorded sha256 (corrupted)")


def meta_digest(meta: dict[str, Any]) -> str:
    """The sha256 of ``meta`` without its own :data:`META_DIGEST`, as canonical JSON (sorted keys,
    no spaces): the same for the dict written and the one read back, however the file is laid out."""
    body = {k: v for k, v in meta.items() if k != META_DIGEST}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def meta_field(convert: Callable[[Any], Any], key: str, doc: str | None = None) -> property:
    """A read-only property: ``convert`` of the value ``meta.json`` records under ``key``."""
    return property(lambda self: convert(self.meta[key]), doc=doc)


@dataclass
class CacheFolder(ABC):
    """An opened, checked cache folder: its ``path`` and parsed ``meta.json``. A subclass names its
    kind and checks its own files (:meth:`checked`); opening, refusing and writing the metadata
    are the same for every kind."""

    #: the ``kind`` its ``meta.json`` records (None: token caches, which predate the field)
    KIND: ClassVar[str | None] = None
    #: the format version its ``meta.json`` records
    FORMAT: ClassVar[int] = 1
    #: what it is called in messages ("image cache")
    WHAT: ClassVar[str]
    #: what a request it was not built from may differ in, for the message refusing it
    BUILT_FROM: ClassVar[str]
    #: how to rebuild a refused cache, in its one line
    REBUILD: ClassVar[str] = "rebuild=True, or --rebuild"
    #: ``meta.json`` records its own digest, and an open hashes the large files only when asked
    DIGEST: ClassVar[bool] = False

    path: Path
    meta: dict[str, Any]

    @classmethod
    def open(cls, path: str | Path, request: dict[str, Any] | None = None, verify: bool | None = None) -> Self:
        """Open a cache folder, checking its metadata and files (and, when given, that it was built
        from ``request``); ``verify`` hashes every file (None: unless the kind records its
        :attr:`DIGEST`, whose large files are then only measured). Raises :class:`CacheInvalid`
        with the reason."""
        path = Path(path)

        def invalid(reason: str) -> CacheInvalid:
            return CacheInvalid(f"{cls.WHAT} {path} is unusable: {reason}")

        meta = cls.read(path, invalid)
        try:
            if request is not None and meta["request"] != request:
                raise invalid(f"it was built from a different request ({cls.BUILT_FROM})")
            return cls.checked(path, meta, not cls.DIGEST if verify is None else verify, invalid)
        except CacheInvalid:
            raise
        except HeadwiseError as exc:  # e.g. a token cache's tokenizer file is missing or unreadable
            raise invalid(str(exc)) from None
        except (KeyError, TypeError, ValueError) as exc:
            raise invalid(f"{META} lacks or garbles {exc}") from None

    @classmethod
    def read(cls, path: Path, invalid: Invalid) -> dict[str, Any]:
        """Its ``meta.json``, of this kind and format; a digest it records must match the rest of it
        (caches built before digests were recorded, and token and sequence caches, record none)."""
        meta = read_meta(path, cls.WHAT, invalid, kind=cls.KIND, version=cls.FORMAT)
        recorded = meta.get(META_DIGEST)
        if recorded is not None and recorded != meta_digest(meta):
            raise invalid(f"{META} does not match its recorded digest (edited or damaged)")
        return meta

    @classmethod
    @abstractmethod
    def checked(cls, path: Path, meta: dict[str, Any], verify: bool, invalid: Invalid) -> Self:
        """The cache of ``meta`` at ``path`` once its files pass the checks (``verify``: their sha256
        too); else ``invalid(reason)`` is raised. A missing or garbled key of ``meta`` may raise."""

    @classmethod
    def existing(cls, final: Path, request: dict[str, Any], rebuild: bool) -> Self | None:
        """The cache already at ``final``, unless there is none or ``rebuild`` (None: build it); an
        unusable one is refused with its reason and how to rebuild it."""
        if rebuild or not final.exists():
            return None
        try:
            return cls.open(final, request)
        except CacheInvalid as exc:
            raise CacheInvalid(f"{exc}; rebuild it ({cls.REBUILD}) or delete the folder") from None

    @classmethod
    def write_meta(cls, folder: Path, request: dict[str, Any], fields: dict[str, Any], seconds: float) -> None:
        """Write ``meta.json`` of a build: the kind, format and ``request``, the cache's own
        ``fields``, the ``seconds`` the build took and when. It is written last: a folder without it
        is never taken for a complete cache."""
        kind = {"kind": cls.KIND} if cls.KIND is not None else {}
        meta = {**kind, "format": cls.FORMAT, "request": request, **fields, "seconds": round(seconds, 3),
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        if cls.DIGEST:
            meta[META_DIGEST] = meta_digest(meta)
        atomic_write_text(folder / META, json.dumps(meta, indent=2) + "\n")


# --- building --------------------------------------------------------------------------------


class HashedFile:
    """A file written block by block, counted and hashed on the way; :meth:`finish` syncs it to
    disk and returns its record. Used as a context manager, it is closed whatever happens."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = open(path, "wb")
        self.sha = hashlib.sha256()
        self.bytes = 0

    def __enter__(self) -> "HashedFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.file.close()

    def write(self, block: bytes | memoryview) -> None:
        self.file.write(block)
        self.sha.update(block)
        self.bytes += len(block)

    def finish(self) -> dict[str, Any]:
        """Flush, sync and close; the file's name, size in bytes and sha256."""
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        return {"file": self.path.name, "bytes": self.bytes, "sha256": self.sha.hexdigest()}


def write_array(path: Path, array: np.ndarray) -> dict[str, Any]:
    """Write ``array``'s bytes (row-major, no header) to ``path``; its record, as :meth:`HashedFile.finish`."""
    data = np.ascontiguousarray(array)
    view = memoryview(data).cast("B") if data.size else memoryview(b"")
    with HashedFile(path) as out:
        for start in range(0, len(view), _BLOCK):
            out.write(view[start:start + _BLOCK])
        return out.finish()


def make_root(root: Path) -> None:
    """Create the cache root (and its parents), refusing a file in its place in one line."""
    if root.exists() and not root.is_dir():
        raise HeadwiseError(f"cache folder {root} is a file: give a folder (--cache-dir, cache_dir or HEADWISE_CACHE)")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HeadwiseError(f"cannot create cache folder {root}: {exc.strerror}; give another (--cache-dir or HEADWISE_CACHE)") from None


def share(folder: Path) -> None:
    """Give the build the permissions of an ordinary folder (temporary files are private)."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for f in folder.iterdir():
        f.chmod(0o666 & ~umask)


def install(tmp: Path, final: Path, replace: bool) -> None:
    """Move a complete build into place (atomic rename; an old cache is removed only after)."""
    old = None
    if replace and final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        final.rename(old)
    try:
        tmp.rename(final)
    except OSError:
        if not final.exists():
            raise
        # Another process finished the same cache first: keep theirs (opened and checked next).
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def build_in_temporary(
    final: Path, build: Callable[[Path], None], replace: bool, remove_new_root: bool = False,
) -> None:
    """Make the cache ``final`` under its cache root: ``build`` fills a new hidden temporary folder
    beside it, which is then shared and installed (replacing an old cache when ``replace``). The
    temporary folder is removed whatever happens; on a failure, with ``remove_new_root``, so are
    the root and the parents made for it by this build, those still empty."""
    root = final.parent
    made = [p for p in (root, *root.parents) if not p.exists()]  # deepest first
    make_root(root)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{final.name}.", suffix=".tmp"))
    try:
        build(tmp)
        share(tmp)
        install(tmp, final, replace=replace)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for folder in made if remove_new_root else ():
            try:
                folder.rmdir()  # only if still empty
            except OSError:
                break
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class Status:
    """A one-line status on stderr while a cache is built (only on a terminal: a log gains nothing)."""

    def __init__(self, enabled: bool, text: str) -> None:
        self.enabled, self.text = enabled and sys.stderr.isatty(), text

    def __enter__(self) -> "Status":
        if self.enabled:
            from rich.console import Console

            self.status = Console(file=sys.stderr).status(self.text)
            self.status.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.enabled:
            self.status.stop()

    def update(self, progress: str) -> None:
        """Add ``progress`` (a count of what is done) to the status line."""
        if self.enabled:
            self.status.update(f"{self.text}: {progress}")


# --- naming and finding ----------------------------------------------------------------------


def default_cache_dir() -> Path:
    """``$HEADWISE_CACHE``, else ``~/.cache/headwise``."""
    value = os.environ.get("HEADWISE_CACHE")
    return Path(value).expanduser() if value else Path.home() / ".cache" / "headwise"


def cache_root(given: str | Path | None = None) -> Path:
    """The cache folder ``given`` (``~`` expanded), else :func:`default_cache_dir`."""
    return Path(given).expanduser() if given else default_cache_dir()


def request_key(request: dict[str, Any]) -> str:
    """A short stable hash of a request."""
    canonical = json.dumps({"format": KEY_VERSION, **request}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def slug(base: str) -> str:
    """``base`` made a short readable part of a folder name (``data`` when nothing is left of it)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", base).strip("-.")[:40] or "data"


def listing_identity(fmt: str, root: Path, files: list[Path]) -> dict[str, Any]:
    """A local source for cache keys: its ``fmt``, its path ``root`` and each of its ``files`` (``root``
    itself, or files under it) with size and mtime (a digest of them past 64 files: a huge folder
    would make ``meta.json`` huge, and the digest keys it as well)."""
    rows = [[str(p.relative_to(root)) if p != root else p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]
    out: dict[str, Any] = {"format": fmt, "path": str(root), "count": len(rows)}
    if len(rows) <= 64:
        out["files"] = rows
    else:
        out["files_sha256"] = hashlib.sha256(json.dumps(rows).encode()).hexdigest()
    return out


def list_caches(root: str | Path | None = None) -> list[Path]:
    """Cache folders under ``root`` (default :func:`default_cache_dir`), hidden temporaries
    excluded. A ``root`` given that is missing, and any root that is a file, are HeadwiseErrors;
    the default folder not made yet holds no caches."""
    given = root is not None
    root = cache_root(root)
    if root.exists() and not root.is_dir():
        raise HeadwiseError(f"cache folder {root} is a file, not a folder of caches")
    if not root.is_dir():
        if given:
            raise HeadwiseError(f"cache folder {root} does not exist (caches are made by `headwise data prepare`)")
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
