"""``headwise data``: tokenize text (or decode images) into caches and inspect them.

    headwise data prepare tinystories-train-sample.txt --tokenizer bpe:4096 --validation tinystories-valid-sample.txt
    headwise data prepare --config run.toml          # the run's [task] table (text or images)
    headwise data info tinystories-train-sample.txt  # the plan and whether its cache is ready
    headwise data info ~/.cache/headwise/<cache>     # a cache's contents, checked
    headwise data list

``bpe:N`` is refused when the training text cannot fill N tokens (the error names how many it
supports): a cache's vocabulary is always what its tokenizer spec says, as the model's shape
computed before the data exists assumes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from headwise.config import read_toml
from headwise.data.cache_files import META, CacheInvalid, default_cache_dir, list_caches
from headwise.errors import HeadwiseError
from headwise.families.lm.data_plan import DataConfig, plan_data
from headwise.families.lm.token_cache import TokenCache, cache_name, prepare
from headwise.tasks.union import parse_task_config
from headwise.tasks.family import families

NAME = "data"
HELP = "prepare token caches from TinyStories (hub or local files), or image caches from a run config, and inspect them"

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
    p.add_argument("--validation", help="auto, split:NAME, fraction:F, or a path / hub name")
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


def data_config(args: argparse.Namespace) -> DataConfig:
    """The data request of the command line: the config's ``[task]`` table (if any), then the options."""
    values: dict[str, Any] = {}
    if args.config:
        table = read_toml(args.config).get("task", {})
        task = parse_task_config(table, source=f"{args.config} [task]")
        options = task.data_options()
        if options is None:
            raise HeadwiseError(f"the [task] of {args.config} is a {task.kind!r} task: it has no text to prepare")
        values = options
    if args.source is not None:
        values["source"] = args.source
    for name in _OPTIONS:
        value = getattr(args, name)
        if value is not None:
            values[name] = value
    return DataConfig.parse(values, source="headwise data")


def _open_cache(path: Path, verify: bool = True) -> Any:
    """A cache folder of any family's kind (see :attr:`~headwise.tasks.family.TaskFamily.caches`),
    found by the ``kind`` its metadata records (none: the caches that record none)."""
    kinds = {cls.KIND: cls for family in families().values() for cls in family.caches}
    try:
        kind = json.loads((path / META).read_text()).get("kind")
    except (OSError, ValueError, AttributeError):
        kind = None
    return kinds.get(kind, kinds[None]).open(path, verify=verify)


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
    if args.data_command == "list":
        rows = []
        details = []
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
    if args.data_command == "prepare" and args.config:
        task = parse_task_config(read_toml(args.config).get("task", {}), source=f"{args.config} [task]")
        if task.data_options() is None:  # no text options: the table says it all
            cache = task.cache(rebuild=args.rebuild, progress=not args.quiet and not args.json)
            if cache is not None:
                _print(cache.summary(), args.json)
                return 0
    cfg = data_config(args)
    if args.data_command == "prepare":
        cache = prepare(cfg, rebuild=args.rebuild, progress=not args.quiet and not args.json)
        _print(cache.summary(), args.json)
        return 0
    plan = plan_data(cfg)
    folder = Path(cfg.cache_dir or default_cache_dir()).expanduser() / cache_name(plan)
    summary: dict[str, Any] = {"data": plan.describe(), "cache": str(folder), "ready": False}
    if folder.exists():
        try:
            summary.update(TokenCache.open(folder, plan.request()).summary())
            summary["ready"] = True
        except CacheInvalid as exc:
            summary["problem"] = str(exc)
    _print(summary, args.json)
    return 0
