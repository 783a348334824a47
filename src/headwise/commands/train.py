"""``headwise train``: train a model from a run config; ``--resume`` continues a run exactly.

    headwise train configs/lm-tiny.toml --out runs/lm-tiny
    headwise train configs/lm-tiny.toml --set model.heads=[8,4,2,1] --set train.seed=3
    headwise train --resume --out runs/lm-tiny          # after a crash, a kill or Ctrl-C
    torchrun --nproc_per_node=2 -m headwise train configs/lm-tiny.toml --out runs/ddp
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from headwise.errors import HeadwiseError
from headwise.paths import unwritable

NAME = "train"
HELP = "train a model from a run config (TOML); resume a run after a crash"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="run config (TOML); with --resume, default: the run's own config.toml")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set optim.lr=1e-3 --set model.heads=[8,4,2,1]")
    p.add_argument("--out", metavar="DIR", help="run directory (default: runs/<config name>)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    mode.add_argument("--overwrite", action="store_true", help="replace the run already in --out")
    p.add_argument("--json", action="store_true", help="print the summary as JSON at the end")


def run(args: argparse.Namespace) -> int:
    from headwise.train import RunConfig, run_training
    from headwise.run import RunDir, RunStatus

    if args.config is None:
        if not (args.resume and args.out):
            raise HeadwiseError("give a config file (or --resume --out DIR to continue a run with its own config)")
        run_dir = RunDir(args.out)
        if not run_dir.path.is_dir():
            raise HeadwiseError(f"{args.out} does not exist, so it holds no run to resume: give the --out of a "
                                "run, or a config file to start one")
        if not run_dir.has_run():
            raise HeadwiseError(f"{args.out} holds no run to resume (no {run_dir.config.name}): give the --out of "
                                "a run, or a config file to start one")
        config = run_dir.config
    else:
        config = Path(args.config)
    out = Path(args.out) if args.out else Path("runs") / config.stem
    blocked = unwritable(out)
    if blocked is not None:
        raise HeadwiseError(f"--out {out}: {blocked} is not writable, so the run cannot be written there; choose "
                            "another --out")
    cfg = RunConfig.load(config, args.overrides)
    summary = run_training(cfg, out, resume=args.resume, overwrite=args.overwrite)
    if args.json:
        print(json.dumps(summary.model_dump(mode="json")))
    return 130 if summary.status is RunStatus.INTERRUPTED else 0
