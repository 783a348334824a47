"""The CPU memory allocator setting that training and benchmark processes run with."""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

_allocator_tuned = False


def allocator_tuned() -> bool:
    """Whether :func:`tune_cpu_allocator` has been applied in this process."""
    return _allocator_tuned


def tune_cpu_allocator() -> bool:
    """Keep freed memory in glibc's heap instead of returning it to the kernel.

    A training step of a large-vocabulary model allocates and frees ~0.5 GB tensors (logits and
    their gradient); by default glibc serves each from a fresh ``mmap`` and unmaps it on free, so
    every step page-faults all of it in again (measured here: ~4x the minor faults and ~20% of
    the step in the kernel). ``mallopt`` turns that off for this process (which then keeps its
    peak memory until it exits: the trainer and the benchmark call it, for their own process).
    Returns whether it applied (glibc only).
    """
    global _allocator_tuned
    if platform.system() != "Linux":
        return False
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        m_trim_threshold, m_mmap_max = -1, -4
        ok = libc.mallopt(m_mmap_max, 0) == 1
        ok = libc.mallopt(m_trim_threshold, 2**31 - 1) == 1 and ok
    except (OSError, AttributeError):
        return False
    _allocator_tuned = _allocator_tuned or ok
    return ok
