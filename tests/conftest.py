"""Shared test fixtures: offline environment and the TinyStories samples."""

import os
from pathlib import Path

import pytest

from headwise.data.bundled import unpacked_samples

# Nothing may reach the network during tests.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Under pytest-xdist (pyproject.toml) the workers share the cores: each worker, and each process its
# tests start, runs torch on its share (one thread on CI's two cores). More threads than cores leave
# every parallel region of a tiny op waiting for a descheduled thread, and a test that compares its
# numbers with a child process's needs both on one thread count. Set before torch is imported.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // WORKERS)))

REPO = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    """The TinyStories samples: $HEADWISE_DATA when it holds them, else the samples that ship with
    headwise (unpacked into the cache folder), so a clone with nothing beside it runs every test."""
    env = os.environ.get("HEADWISE_DATA")
    if env and (Path(env) / "tinystories-train-sample.txt").is_file():
        return Path(env)
    return unpacked_samples()


@pytest.fixture
def shared_data() -> Path:
    return shared_data_dir()
