"""The two kinds of failure the command line distinguishes, and the one way every command (the
``headwise`` CLI and the scripts under ``benchmarks/``) reports them."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import signal
import sys
import threading
from typing import Any, Callable, Iterator


class HeadwiseError(Exception):
    """Bad input from the user: the CLI prints the message on one line and exits with status 2."""


class RunFailure(Exception):
    """A failure while running (diverged loss, crashed worker): the CLI exits with status 1."""


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line and exit 2, like every other bad input."""

    def error(self, message: str) -> None:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def format_help(self) -> str:
        """The help; an ``epilog`` may be a function returning the text, called only here, for
        what is costly to list (the bench sections load torch)."""
        if callable(self.epilog):
            self.epilog = self.epilog()
        return super().format_help()


def run_guarded(body: Callable[[], int | None], prog: str) -> int:
    """Run a command's ``body`` and return its exit status: bad input (:class:`HeadwiseError`) is one
    line on stderr and 2, a :class:`RunFailure` 1, an interrupt 130, a closed pipe 141."""
    try:
        return int(body() or 0)
    except HeadwiseError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except RunFailure as exc:
        print(f"{prog}: failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`headwise study --list | head`): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def guarded(prog: str) -> Callable[[Callable[..., int | None]], Callable[..., int]]:
    """Decorate a script's ``main`` so that it reports failures as :func:`run_guarded` does."""

    def wrap(main: Callable[..., int | None]) -> Callable[..., int]:
        @functools.wraps(main)
        def guarded_main(*args, **kwargs) -> int:
            return run_guarded(lambda: main(*args, **kwargs), prog)

        return guarded_main

    return wrap


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`KeyboardInterrupt` in the main thread, as Ctrl-C
    does, so a command that supervises runs stops them and exits (130) on either; off the main
    thread, where Python cannot set a handler, it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
