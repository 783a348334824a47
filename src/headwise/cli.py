"""The ``headwise`` command. Subcommands live in :mod:`headwise.commands`, one module each.

Each command module defines ``NAME``, ``HELP``, ``configure(parser)`` and ``run(args) -> int``.
Bad input (:class:`HeadwiseError`) prints one line and exits 2; a runtime failure exits 1
(:func:`headwise.errors.run_guarded`, which the scripts under ``benchmarks/`` share).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from headwise.errors import OneLineParser, run_guarded


def build_parser() -> argparse.ArgumentParser:
    import headwise.commands as commands

    from headwise import __version__

    parser = OneLineParser(prog="headwise", description="Study how a transformer's attention heads are allocated.")
    parser.add_argument("--version", action="version", version=f"headwise {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=OneLineParser)
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"headwise.commands.{info.name}")
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.configure(p)
        p.set_defaults(_run=module.run, _parser=p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``headwise`` console script."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # named by the command's own parser, whose --help lists what it takes
        args._parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return run_guarded(lambda: args._run(args), "headwise")


if __name__ == "__main__":
    sys.exit(main())
