"""The ``headwise`` command. Subcommands live in :mod:`headwise.commands`, one module each.

Each command module defines ``NAME``, ``HELP``, ``configure(parser)`` and ``run(args) -> int``.
Bad input (:class:`HeadwiseError`) prints one line and exits 2; a runtime failure exits 1.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys

from headwise.errors import HeadwiseError, RunFailure


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like every other bad input
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    import headwise.commands as commands

    from headwise import __version__

    parser = _Parser(prog="headwise", description="Study how a transformer's attention heads are allocated.")
    parser.add_argument("--version", action="version", version=f"headwise {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"headwise.commands.{info.name}")
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.configure(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``headwise`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except HeadwiseError as exc:
        print(f"headwise: error: {exc}", file=sys.stderr)
        return 2
    except RunFailure as exc:
        print(f"headwise: failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("headwise: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`headwise study --list | head`): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
