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
