"""The TinyStories samples that ship with headwise: found when nothing else has the name,
overridden by a path or HEADWISE_DATA, unpacked byte for byte, licensed, and named as the
source's origin in ``headwise data list``."""

from __future__ import annotations

import hashlib
import os
from importlib.resources import files
from pathlib import Path

import pytest

from headwise.cli import main
from headwise.data.bundled import LICENSE, SAMPLES, sample_path, samples_folder
from headwise.data.sources import open_source

SHARED = os.environ.get("HEADWISE_DATA")


@pytest.fixture
def bare(monkeypatch, tmp_path):
    """No HEADWISE_DATA, a fresh cache folder, and a working folder without data."""
    monkeypatch.delenv("HEADWISE_DATA", raising=False)
    monkeypatch.setenv("HEADWISE_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("name", SAMPLES)
def test_a_sample_name_resolves_to_the_unpacked_sample(bare, name):
    source = open_source(name)
    path = Path(source.name)
    assert path == samples_folder() / name and path.parent == bare / "cache" / ".samples"
    size, digest = SAMPLES[name]
    data = path.read_bytes()
    assert len(data) == size and hashlib.sha256(data).hexdigest() == digest
    assert source.found == "bundled sample" and "from bundled sample" in source.label()
    if SHARED and (Path(SHARED) / name).is_file():  # the shared copy it was made from
        assert data == (Path(SHARED) / name).read_bytes()


def test_a_path_or_headwise_data_overrides_the_sample(bare, monkeypatch):
    own = bare / "mine"
    own.mkdir()
    (own / "tinystories-train-sample.txt").write_text("One story.\n<|endoftext|>\nAnother story.\n")
    monkeypatch.setenv("HEADWISE_DATA", str(own))
    source = open_source("tinystories-train-sample.txt")
    assert source.name == str(own / "tinystories-train-sample.txt") and source.found == "HEADWISE_DATA"
    assert list(source.documents()) == ["One story.", "Another story."]
    # a path as given comes first of all
    local = bare / "tinystories-train-sample.txt"
    local.write_text("Local.\n<|endoftext|>\n")
    assert open_source(str(local)).found == "path" and list(open_source(str(local)).documents()) == ["Local."]
    assert not samples_folder().exists()  # nothing was unpacked


def test_a_truncated_unpacked_sample_is_unpacked_again(bare):
    name = "tinystories-tiny-fixture.txt"
    path = sample_path(name)
    path.write_bytes(path.read_bytes()[:100])
    again = sample_path(name)
    assert again == path and hashlib.sha256(path.read_bytes()).hexdigest() == SAMPLES[name][1]
    assert sample_path("other.txt") is None


def test_the_samples_ship_small_and_with_their_licence():
    folder = files("headwise.data").joinpath("bundled")
    sizes = {name: len(folder.joinpath(f"{name}.gz").read_bytes()) for name in SAMPLES}
    assert sum(sizes.values()) < 1_000_000, sizes
    licence = folder.joinpath(LICENSE).read_text(encoding="utf-8")
    assert "Community Data License Agreement – Sharing – Version 1.0" in licence
    assert "Eldan" in licence and "roneneldan/TinyStories" in licence


def test_data_list_names_where_each_source_came_from(bare, capsys):
    assert main(["data", "prepare", "tinystories-tiny-fixture.txt", "--tokenizer", "bpe:300",
                 "--validation", "fraction:0.4", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1, out  # the unpacked samples' folder is not listed as a cache
    assert "tinystories-tiny-fixture.txt (stories, from bundled sample)" in out[0]
