"""Token caches: text tokenized once into flat token files, reused while the request is the same.

A cache is a folder ``<cache_dir>/<source>-<tokenizer>-<key>/`` holding

- ``train.bin``, ``valid.bin``: token ids, uint16 when the vocabulary fits, else uint32; every
  document is followed by the end-of-text id
- ``tokenizer.json``: the trained BPE (``bpe:N`` only), which runs save in their own folder
- ``meta.json``: the request (source files with sizes and times, subset, validation, tokenizer),
  the tokenizer's hash, token and document counts, each file's sha256 and the format version

``key`` is a hash of the request: the same request finds the same folder, a different one builds
a new folder beside it (a local file that changes size or time is a new request; a hub dataset is
known by its name and split only). A request to encode with a given tokenizer (a run's saved one,
rather than a BPE trained on the text) adds that tokenizer's hash. A cache is built, opened and
refused as every cache is (:mod:`headwise.data.cache_files`); opening it checks the format, the
request, the tokenizer's hash, the file sizes (truncation) and the sha256 of every file
(corruption).
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from headwise.config import sha256_file
from headwise.data.cache_files import (
    META, CacheFolder, CacheInvalid, HashedFile, Invalid, build_in_temporary, cache_root, meta_field, read_meta,
    request_key, slug,
)
from headwise.errors import HeadwiseError
from headwise.text.data_plan import DataConfig, DataPlan, plan_data
from headwise.text.tokenizer import (
    TOKENIZER_FILE, BPETokenizer, Tokenizer, gpt_neo_tokenizer, parse_tokenizer_spec, read_tokenizer,
)

SPLITS = ("train", "valid")
# Documents are encoded in groups of about this many characters (parallel inside a group).
_GROUP_CHARS = 1 << 22
_GROUP_DOCS = 8192


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits, else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def cache_name(plan: DataPlan, request: dict[str, Any] | None = None) -> str:
    """The folder name of a plan's cache: readable prefix plus the key of ``request`` (by default
    the plan's)."""
    train = plan.train
    base = Path(train.name).stem if train.kind != "hub" or Path(train.name).exists() else train.name.replace("/", "--")
    if train.split and train.split != "train":
        base += f"-{train.split}"
    return f"{slug(base)}-{plan.tokenizer.replace(':', '')}-{request_key(request or plan.request())}"


@dataclass
class TokenCache(CacheFolder):
    """An opened, checked token cache (its ``meta.json`` records no ``kind``: token caches predate
    the field)."""

    WHAT = "token cache"
    BUILT_FROM = "source files, subset, validation or tokenizer"
    REBUILD = "headwise data prepare --rebuild"

    tokenizer: Tokenizer

    dtype = meta_field(np.dtype, "dtype", "dtype of the token files.")

    @property
    def vocab_size(self) -> int:
        """Size of the tokenizer's vocabulary (the model's vocab_size)."""
        return int(self.meta["tokenizer"]["vocab_size"])

    def num_tokens(self, split: str) -> int:
        """Tokens in ``split`` ("train" or "valid")."""
        return int(self.meta["splits"][split]["tokens"])

    def tokens(self, split: str) -> np.ndarray:
        """The token ids of ``split`` as a read-only memory map (not loaded into memory)."""
        info = self.meta["splits"][split]
        return np.memmap(self.path / info["file"], dtype=self.dtype, mode="r", shape=(int(info["tokens"]),))

    def summary(self) -> dict[str, Any]:
        """What ``headwise data info`` and ``list`` show of the cache."""
        meta = self.meta
        return {
            "cache": str(self.path),
            "data": meta.get("description", ""),
            "tokenizer": meta["tokenizer"]["spec"],
            "vocab_size": self.vocab_size,
            "dtype": meta["dtype"],
            "train_tokens": self.num_tokens("train"),
            "valid_tokens": self.num_tokens("valid"),
            "train_documents": meta["splits"]["train"]["documents"],
            "valid_documents": meta["splits"]["valid"]["documents"],
        }

    def headline(self) -> str:
        """The cache in one line (``headwise data list``)."""
        return (f"{self.num_tokens('train'):,} train tokens, {self.meta['tokenizer']['spec']}; "
                f"{self.meta.get('description', '')}")

    @classmethod
    def read(cls, path: Path, invalid: Invalid) -> dict[str, Any]:
        """Its ``meta.json``, of this format (token caches record no kind, and words of their own)."""
        meta = read_meta(path, "cache", invalid)
        if not isinstance(meta, dict) or meta.get("format") != cls.FORMAT:
            found = meta.get("format") if isinstance(meta, dict) else None
            raise invalid(f"format version {found!r}, this headwise reads {cls.FORMAT}")
        return meta

    @classmethod
    def checked(cls, path: Path, meta: dict[str, Any], verify: bool, invalid: Invalid) -> "TokenCache":
        """The cache once its tokenizer, vocabulary and token files pass the checks."""
        tokenizer = _cache_tokenizer(path, meta)
        if tokenizer.sha256 != meta["tokenizer"]["sha256"]:
            raise invalid("its tokenizer differs from the one it was built with")
        _check_vocab(meta, tokenizer, invalid)
        itemsize = np.dtype(meta["dtype"]).itemsize
        for split in SPLITS:
            info = meta["splits"][split]
            file = path / info["file"]
            if not file.is_file():
                raise invalid(f"{info['file']} is missing")
            expected = int(info["tokens"]) * itemsize
            if file.stat().st_size != expected:
                raise invalid(f"{info['file']} has {file.stat().st_size} bytes, expected {expected} (truncated?)")
            if verify and sha256_file(file) != info["sha256"]:
                raise invalid(f"{info['file']} does not match its recorded sha256 (corrupted)")
        return cls(path=path, meta=meta, tokenizer=tokenizer)


def _check_vocab(meta: dict[str, Any], tokenizer: Tokenizer, invalid: Invalid) -> None:
    """The recorded vocabulary must be the tokenizer's, and every id must fit the token dtype."""
    vocab, dtype = int(meta["tokenizer"]["vocab_size"]), meta["dtype"]
    if dtype not in ("uint16", "uint32"):
        raise invalid(f"{META} records dtype {dtype!r}; token files are uint16 or uint32 (damaged)")
    if vocab - 1 > np.iinfo(np.dtype(dtype)).max:
        raise invalid(f"{META} records dtype {dtype} for a vocabulary of {vocab:,}, whose ids do not fit it (damaged)")
    if vocab != tokenizer.vocab_size:
        raise invalid(
            f"{META} records vocab_size {vocab:,}, but its tokenizer {tokenizer.spec} has {tokenizer.vocab_size:,} (damaged)"
        )


def _cache_tokenizer(path: Path, meta: dict[str, Any]) -> Tokenizer:
    return read_tokenizer(meta["tokenizer"], path / TOKENIZER_FILE)


def prepare(
    cfg: DataConfig, cache_dir: str | Path | None = None, rebuild: bool = False, progress: bool = False,
    tokenizer: Tokenizer | None = None,
) -> TokenCache:
    """Tokenize the data of ``cfg`` into a cache, or reuse the cache of the same request.

    ``cache_dir`` overrides ``cfg.cache_dir`` (default :func:`default_cache_dir`). A valid cache is
    reused unless ``rebuild``; an unusable one is refused with its reason unless ``rebuild``.
    Bad input fails with one line and leaves nothing behind: most of it is caught before anything
    is written, the rest (a bad byte deep in a file) while building in the temporary folder.

    ``tokenizer`` (a run's saved one, of ``cfg``'s spec) encodes the text instead of a BPE trained
    on it: the request's own cache serves when it was built with that very tokenizer, else a cache
    of the request and that tokenizer's hash is built (or reused) beside it.
    """
    plan = plan_data(cfg)
    if tokenizer is None and plan.tokenizer.startswith("hf:"):
        raise HeadwiseError(f"tokenizer {plan.tokenizer} is a converted model's own, saved in the run headwise convert "
                            "wrote: it encodes that run's text (headwise analyze, eval), and a new run cannot learn it; "
                            "fine-tune that run (train.init_from names it; its tokenizer is read from there), "
                            "or use 'gpt-neo' or 'bpe:N'")
    root = cache_root(cache_dir or cfg.cache_dir)
    request = plan.request()
    if tokenizer is not None:
        if tokenizer.spec != plan.tokenizer:
            raise HeadwiseError(f"the saved tokenizer is {tokenizer.spec} but the [task] names tokenizer "
                                f"{plan.tokenizer}: the run's config was edited after it trained; restore it")
        own = root / cache_name(plan, request)
        if own.exists() and not rebuild:
            with contextlib.suppress(CacheInvalid):  # unusable or another BPE: the tokenizer's own cache serves
                cache = TokenCache.open(own, request)
                if cache.tokenizer.sha256 == tokenizer.sha256:
                    return cache
        request = {**request, "tokenizer_sha256": tokenizer.sha256}
    final = root / cache_name(plan, request)
    if (cache := TokenCache.existing(final, request, rebuild)) is not None:
        return cache
    _check_not_empty(plan)
    build_in_temporary(final, lambda tmp: _build(plan, request, tmp, progress, tokenizer), rebuild)
    return TokenCache.open(final, request)


def _check_not_empty(plan: DataPlan) -> None:
    """Refuse a source without a single document before anything is drawn or written."""
    for source, what in ((plan.train, "training"), (plan.valid, "validation")):
        if source is not None and next(iter(source.documents()), None) is None:
            raise HeadwiseError(f"the {what} source {source.label()} holds no text: check the source")


def _build(plan: DataPlan, request: dict[str, Any], tmp: Path, progress: bool, given: Tokenizer | None) -> None:
    n = parse_tokenizer_spec(plan.tokenizer)
    with _Progress(progress, plan) as bar:
        if given is not None:
            tokenizer: Tokenizer = given
        elif n is None:
            tokenizer = gpt_neo_tokenizer()
        else:
            bar.status(f"training {plan.tokenizer} on the training stories")
            tokenizer = BPETokenizer.train(plan.train_documents(), n)
        tokenizer.save(tmp / TOKENIZER_FILE)
        dtype = token_dtype(tokenizer.vocab_size)
        documents = dict.fromkeys(SPLITS, 0)
        started = time.perf_counter()
        with HashedFile(tmp / "train.bin") as train, HashedFile(tmp / "valid.bin") as valid:
            files = {"train": train, "valid": valid}
            for role, texts in _groups(plan.documents()):
                ids = tokenizer.encode_documents(texts)
                files[role].write(ids.astype(dtype).tobytes())
                documents[role] += len(texts)
                bar.advance(role, len(texts), len(ids))
            written = {split: f.finish() for split, f in files.items()}
        for split, what in (("train", "training"), ("valid", "validation")):  # raised with the bar up: erased
            if written[split]["bytes"] == 0:
                hint = "check the source"
                if split == "valid":
                    hint = "raise the fraction (validation = 'fraction:0.2') or give a validation file"
                raise HeadwiseError(f"the {what} set is empty ({plan.describe()}): {hint}")
    splits = {
        split: {"file": w["file"], "tokens": w["bytes"] // dtype.itemsize, "documents": documents[split],
                "sha256": w["sha256"]}
        for split, w in written.items()
    }
    TokenCache.write_meta(tmp, request, {"description": plan.describe(), "tokenizer": tokenizer.describe(),
                                         "dtype": dtype.name, "splits": splits}, time.perf_counter() - started)


def _groups(documents: Iterator[tuple[str, str]]) -> Iterator[tuple[str, list[str]]]:
    """Consecutive documents of one role, in groups big enough to encode in parallel."""
    role, group, chars = None, [], 0
    for r, text in documents:
        if group and (r != role or chars >= _GROUP_CHARS or len(group) >= _GROUP_DOCS):
            yield role, group
            group, chars = [], 0
        role = r
        group.append(text)
        chars += len(text)
    if group:
        yield role, group


class _Progress:
    """A rich progress display on stderr while a cache is built (silent when disabled)."""

    def __init__(self, enabled: bool, plan: DataPlan) -> None:
        # Bars redrawn into a log file or a pipe only fill it with frames.
        self.enabled = enabled and sys.stderr.isatty()
        self.total = plan.subset
        self.tokens = 0

    def __enter__(self) -> "_Progress":
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[tokens]}"),
                TimeElapsedColumn(),
                console=Console(file=sys.stderr),
            )
            self.progress.start()
            self.task = self.progress.add_task("stories", total=self.total, tokens="")
        return self

    def status(self, text: str) -> None:
        if self.enabled:
            self.progress.update(self.task, description=text)

    def advance(self, role: str, documents: int, tokens: int) -> None:
        if self.enabled:
            self.tokens += tokens
            self.progress.update(
                self.task, description=f"tokenizing ({role})", advance=documents if role == "train" else 0,
                tokens=f"{self.tokens:,} tokens",
            )

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if self.enabled:
            # A failed build erases its bar, so that the error line stands alone.
            self.progress.live.transient = exc_type is not None
            self.progress.stop()
