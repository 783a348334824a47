"""``headwise data``: tokenize text (or prepare a task's own data, such as images) into caches and
inspect them.

    headwise data prepare tinystories-train-sample.txt --tokenizer bpe:4096 --validation tinystories-valid-sample.txt
    headwise data prepare --config run.toml          # the run's [task] table (text, images, ...)
    headwise data info tinystories-train-sample.txt  # the plan and whether its cache is ready
    headwise data info ~/.cache/headwise/<cache>     # a cache's contents, checked
    headwise data list
    headwise data verify ~/.cache/headwise/<cache>   # every file's sha256 (default: every cache)

Text is the shared text layer's (:mod:`headwise.text`: a data request, a token cache), whichever
family's ``[task]`` names it (:meth:`~headwise.tasks.family.TaskConfigBase.data_options`); a
``[task]`` with data of another kind prepares its own cache
(:meth:`~headwise.tasks.family.TaskConfigBase.cache`), and ``info``, ``list`` and ``verify`` open
a cache folder by the kind its metadata records, through the families' ``caches``.

Opening an image cache (a run start, ``info``) checks its metadata and file sizes only, which is
quick at any size; ``verify`` reads every byte of every file and exits 1 if any cache is damaged.

``bpe:N`` is refused when the training text cannot fill N tokens (the error names how many it
supports): a cache's vocabulary is always what its tokenizer spec says, as the model's shape
computed before the data exists assumes.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from headwise.config import read_toml
from headwise.data.cache_files import META, CacheInvalid, cache_root, default_cache_dir, list_caches
from headwise.errors import HeadwiseError, RunFailure
from headwise.tasks.family import families
from headwise.text.data_plan import DataConfig, plan_data
from headwise.text.token_cache import TokenCache, cache_name, prepare

NAME = "data"
HELP = ("prepare token caches from text (TinyStories by default; hub or local files), or a run config's own data "
        "cache (images, sequences), and inspect them")

# DataConfig fields that have a command-line option of the same name
_OPTIONS = ("format", "field", "split", "tokenizer", "subset", "subset_order", "validation", "seed", "cache_dir")


def _data_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "source", nargs="?", help="file, folder or hub name (default: the config's, else roneneldan/TinyStories)"
    )
    p.add_argument("--config", metavar="TOML", help="take the data settings from this run config's [task] table")
    p.add_argument("--format", choices=["auto", "stories", "stream", "jsonl", "parquet", "hub"], help="default: auto")
    p.add_argument("--field", help="text field of jsonl/parquet/hub data (default: text, else story)")
    p.add_argument("--split", help="hub split to train on (default: train)")
    p.add_argument("--tokenizer", help="gpt-neo (default) or bpe:N")
    p.add_argument("--subset", type=int, metavar="K", help="use only K training stories")
    p.add_argument("--subset-order", choices=["first", "random"], help="the first K (default) or a seeded random K")
    p.add_argument("--validation", help="auto, split:NAME, fraction:F, fraction:F:K/N (part K of N of the hold-out), or a path / hub name")
    p.add_argument("--seed", type=int, help="seed of the random subset and the hold-out (default 0)")
    p.add_argument("--cache-dir", help=f"where caches live (default: $HEADWISE_CACHE or {default_cache_dir()})")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``prepare``, ``info`` and ``list`` sub-commands."""
    sub = parser.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    p = sub.add_parser("prepare", help="tokenize a source into a cache (reused when already built)")
    _data_options(p)
    p.add_argument(
        "--rebuild", action="store_true", help="build again even if a cache exists (also replaces a bad one)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar (one is drawn only when stderr is a terminal)")
    p = sub.add_parser("info", help="show a cache folder (checked), or what a source would give")
    _data_options(p)
    p = sub.add_parser("list", help="list the caches in the cache folder")
    p.add_argument("--cache-dir", help="default: $HEADWISE_CACHE or ~/.cache/headwise")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p = sub.add_parser("verify", help="hash every file of caches against meta.json (exit 1 if any is damaged)")
    p.add_argument("caches", nargs="*", metavar="CACHE", help="cache folders (default: every cache in --cache-dir)")
    p.add_argument("--cache-dir",
                   help="verify every cache in this folder (default: $HEADWISE_CACHE or ~/.cache/headwise)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")


def data_config(args: argparse.Namespace) -> DataConfig:
    """The data request of the command line: the config's ``[task]`` table (if any), then the options."""
    values: dict[str, Any] = {}
    if args.config:
        from headwise.tasks.union import parse_task_config  # every family's task: torch

        table = read_toml(args.config).get("task", {})
        task = parse_task_config(table, source=f"{args.config} [task]")
        options = task.data_options()
        if options is None:
            raise HeadwiseError(f"the [task] of {args.config} is {_a(task.kind)} task: it has no text to prepare")
        values = options
    if args.source is not None:
        values["source"] = args.source
    for name in _OPTIONS:
        value = getattr(args, name)
        if value is not None:
            values[name] = value
    return DataConfig.parse(values, source="headwise data")


def _a(kind: str) -> str:
    return f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind!r}"


def _open_cache(path: Path, verify: bool | None = None) -> Any:
    """A cache folder of any family's kind (see :attr:`~headwise.tasks.family.TaskFamily.caches`),
    found by the ``kind`` its metadata records (none: the caches that record none); ``verify``
    None opens it as a run does (as its class decides: image caches cheaply, token and sequence
    caches hashed). A ``meta.json`` that does not parse, or records a kind no family makes, is
    CacheInvalid naming no kind: its kind is unknown (a damaged image cache is no token cache)."""
    kinds = {cls.KIND: cls for family in families().values() for cls in family.caches}
    kind = None
    if (path / META).is_file():
        try:
            meta = json.loads((path / META).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise CacheInvalid(f"cache {path} is unusable: {META} is not valid JSON") from None
        if not isinstance(meta, dict):
            raise CacheInvalid(f"cache {path} is unusable: {META} is not a JSON object")
        kind = meta.get("kind")
    if kind not in kinds:
        known = ", ".join(sorted(str(k) for k in kinds if k is not None))
        raise CacheInvalid(f"cache {path} is unusable: {META} records kind {kind!r}, which no task family makes "
                           f"(known kinds: {known}, or none)")
    return kinds[kind].open(path, verify=verify)


def _text_options(args: argparse.Namespace) -> list[str]:
    """The text-data options given on the command line (the positional source among them)."""
    given = ["SOURCE"] if args.source is not None else []
    options = [name for name in _OPTIONS if name != "cache_dir" and getattr(args, name) is not None]
    return given + [f"--{name.replace('_', '-')}" for name in options]


def _no_text_options(args: argparse.Namespace, task: Any) -> None:
    """Refuse text-data options for a ``--config`` whose task has no text: they would be ignored."""
    given = _text_options(args)
    if given:
        raise HeadwiseError(
            f"the [task] of {args.config} is {_a(task.kind)} task, with no text to prepare: drop {', '.join(given)} "
            "(options of text data); its data is set in its [task] table"
        )


def _verify_targets(args: argparse.Namespace) -> list[Path]:
    """The cache folders ``data verify`` hashes: those named (each checked to be a cache), else
    every cache in the cache folder."""
    if args.caches and args.cache_dir:
        raise HeadwiseError("give cache folders or --cache-dir (every cache in it), not both")
    paths = []
    for name in args.caches:
        path = Path(name).expanduser()
        if not path.exists():
            raise HeadwiseError(f"cache folder {name} does not exist (`headwise data list` shows the caches)")
        if not path.is_dir():
            raise HeadwiseError(f"{name} is a file, not a cache folder (`headwise data list` shows the caches)")
        if not (path / META).is_file():
            if any((p / META).is_file() for p in path.iterdir() if p.is_dir()):
                raise HeadwiseError(f"{name} is a folder of caches, not a cache: give --cache-dir {name} to verify all")
            raise HeadwiseError(f"{name} is not a cache folder (no {META}; `headwise data list` shows the caches)")
        paths.append(path)
    if paths:
        return paths
    paths = list_caches(args.cache_dir)
    if not paths:
        raise HeadwiseError(f"cache folder {cache_root(args.cache_dir)} holds no caches to verify (`headwise data prepare` makes them)")
    return paths


def _size(n: int) -> str:
    return f"{n / 1e9:,.2f} GB" if n >= 1e9 else f"{n / 1e6:,.1f} MB"


def _verify(args: argparse.Namespace) -> int:
    """``data verify``: one line per cache; RunFailure (exit 1) naming the damaged ones."""
    rows, damaged = [], []
    for path in _verify_targets(args):
        started = time.perf_counter()
        try:
            _open_cache(path, verify=True)
        except CacheInvalid as exc:
            rows.append({"cache": str(path), "ok": False, "problem": str(exc)})
            damaged.append(str(exc))
            continue
        size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
        rows.append({"cache": str(path), "ok": True, "bytes": size, "seconds": round(time.perf_counter() - started, 3)})
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            if row["ok"]:
                print(f"ok       {row['cache']}  ({_size(row['bytes'])} hashed in {row['seconds']:.1f} s)")
            else:
                print(f"DAMAGED  {row['problem']}")
    if len(damaged) == 1:
        raise RunFailure(f"{damaged[0]}; rebuild it (`headwise data prepare ... --rebuild`) or delete the folder")
    if damaged:
        raise RunFailure(f"{len(damaged)} of {len(rows)} caches are damaged (listed above): rebuild each "
                         "(`headwise data prepare ... --rebuild`) or delete its folder")
    return 0


def _print(summary: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    width = max(len(k) for k in summary)
    for key, value in summary.items():
        shown = f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else value
        print(f"{key:<{width}}  {shown}")


def run(args: argparse.Namespace) -> int:
    """Run ``headwise data ACTION``."""
    if args.data_command == "verify":
        return _verify(args)
    if args.data_command == "list":
        rows, details = [], []
        for path in list_caches(args.cache_dir):
            try:
                cache = _open_cache(path, verify=False)
                rows.append({**cache.summary(), "ok": True})
                details.append(cache.headline())
            except CacheInvalid as exc:
                rows.append({"cache": str(path), "ok": False, "problem": str(exc)})
                details.append(str(exc))
        if args.json:
            print(json.dumps(rows, indent=2))
            return 0
        for row, detail in zip(rows, details):
            print(f"{row['cache']}  {detail}")
        return 0
    if args.data_command == "info" and args.source and (Path(args.source).expanduser() / META).is_file():
        _print(_open_cache(Path(args.source).expanduser()).summary(), args.json)
        return 0
    if args.config:
        from headwise.tasks.union import parse_task_config

        task = parse_task_config(read_toml(args.config).get("task", {}), source=f"{args.config} [task]")
        if task.data_options() is None:  # no text options: the table says it all
            _no_text_options(args, task)
            if args.data_command == "info" and (summary := task.cache_info(args.cache_dir)) is not None:
                _print(summary, args.json)
                return 0
            if args.data_command == "prepare":
                cache = task.cache(cache_dir=args.cache_dir, rebuild=args.rebuild,
                                   progress=not args.quiet and not args.json)
                if cache is not None:
                    _print(cache.summary(), args.json)
                    return 0
    cfg = data_config(args)
    if args.data_command == "prepare":
        cache = prepare(cfg, rebuild=args.rebuild, progress=not args.quiet and not args.json)
        _print(cache.summary(), args.json)
        return 0
    plan = plan_data(cfg)
    folder = cache_root(cfg.cache_dir) / cache_name(plan)
    summary: dict[str, Any] = {"data": plan.describe(), "cache": str(folder), "ready": False}
    if folder.exists():
        try:
            summary.update(TokenCache.open(folder, plan.request()).summary())
            summary["ready"] = True
        except CacheInvalid as exc:
            summary["problem"] = str(exc)
    _print(summary, args.json)
    return 0
