"""Helpers shared by several test modules: one-line error checks and the tiny bench sections."""

import pytest
import torch

from headwise.errors import HeadwiseError


def one_line_error(fn, *args, match=None, **kwargs):
    """Run ``fn``, expecting a HeadwiseError with a one-line message; return the message."""
    with pytest.raises(HeadwiseError, match=match) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert message and "\n" not in message, message
    return message


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Run a module's tests on one torch thread (import it into the module to apply it there).

    Tiny models gain nothing from a second thread, and on a loaded machine every parallel region
    of a tiny op waits for a descheduled worker (milliseconds each): run on one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def run_sections(cfg, sections):
    """``headwise bench`` run on ``cfg`` for ``sections``, with its log lines under ``"log"``."""
    from headwise.bench import suite

    lines = []
    result = suite.run_bench(cfg, set(sections), log=lines.append)
    result["log"] = lines
    return result
