"""Shared test fixtures: offline environment and the shared TinyStories samples."""

import os
from pathlib import Path

import pytest

# Nothing may reach the network during tests.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path | None:
    """The shared TinyStories samples: $HEADWISE_DATA, else ../shared/data beside the repo."""
    env = os.environ.get("HEADWISE_DATA")
    path = Path(env) if env else REPO.parent / "shared" / "data"
    return path if (path / "tinystories-train-sample.txt").is_file() else None


@pytest.fixture
def shared_data() -> Path:
    path = shared_data_dir()
    if path is None:
        pytest.skip("shared TinyStories samples not found: set HEADWISE_DATA to the folder holding them")
    return path
