"""Cache folder names and keys stay what they were: a changed key renames, so rebuilds, every
user's cache. The names below were computed by headwise before the token, sequence and image
caches shared :class:`headwise.data.cache_files.CacheFolder`; the local listing that keys
sequence and image sources is checked against a hand-written one."""

import hashlib
import json
import os

import pytest

from headwise.data.cache_files import request_key
from headwise.data.sources import Source
from headwise.families.lra import cache as sequence_cache
from headwise.families.vision import cache as image_cache
from headwise.families.vision.formats import source_identity as image_source_identity
from headwise.text import token_cache
from headwise.text.data_plan import DataPlan, Holdout


@pytest.fixture(autouse=True)
def nothing_local(tmp_path, monkeypatch):
    """No source name below may be found as a local path."""
    monkeypatch.delenv("HEADWISE_DATA", raising=False)
    monkeypatch.chdir(tmp_path)


def test_request_key_is_the_canonical_json_hash():
    request = {"b": [1, "x"], "a": None}
    canonical = '{"a":null,"b":[1,"x"],"format":1}'
    assert request_key(request) == hashlib.sha256(canonical.encode()).hexdigest()[:16] == "4c4309b2803e11a3"


def _plan(**changes) -> DataPlan:
    hub = Source(kind="hub", name="roneneldan/TinyStories", field="text", split="train")
    fields = dict(train=hub, valid=None, holdout=Holdout(0.05), subset=None, subset_order="first", seed=0, tokenizer="gpt-neo")
    return DataPlan(**{**fields, **changes})


def test_token_cache_names():
    assert token_cache.cache_name(_plan()) == "roneneldan--TinyStories-gpt-neo-0845e82c04fd6c00"
    random = _plan(subset=1000, subset_order="random", seed=3, tokenizer="bpe:4096")
    assert token_cache.cache_name(random) == "roneneldan--TinyStories-bpe4096-0e8a7b0a2b343f1f"
    saved = {**random.request(), "tokenizer_sha256": "ab" * 32}
    assert token_cache.cache_name(random, saved) == "roneneldan--TinyStories-bpe4096-4a6973b4a32c6d37"
    local = Source(kind="stories", name="/data/tiny stories.txt")
    valid = Source(kind="stories", name="/data/valid.txt")
    assert token_cache.cache_name(_plan(train=local, valid=valid, holdout=None)) == "tiny-stories-gpt-neo-e43631c612ab232d"


def test_sequence_cache_names():
    short = sequence_cache.sequence_request("listops", "generate", listops={"variant": "short"})
    assert sequence_cache.cache_name(short) == "lra-listops-generate-20-100-25748773115aa7e4"
    imdb = sequence_cache.sequence_request("text", max_length=1000, splits="lra", seed=2)
    assert sequence_cache.cache_name(imdb) == "lra-text-stanfordnlp--imdb-198d2da81c78f4d5"


def test_image_cache_names():
    cifar = image_cache.image_request("uoft-cs/cifar10", "hub", 32)
    assert image_cache.cache_name(cifar) == "images-uoft-cs--cifar10-32px-2f69aa0bb8b70cea"
    local = {"kind": "images", "format": 1, "image_size": None,
             "source": {"format": "idx", "path": "/data/fashion-mnist", "count": 1,
                        "files": [["train-images-idx3-ubyte", 10, 5]]}}
    assert image_cache.cache_name(local) == "images-fashion-mnist-f6483ca3fcdbfc49"


def _touch(path, data: bytes, mtime_ns: int):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.utime(path, ns=(mtime_ns, mtime_ns))


def test_a_local_source_is_keyed_by_its_visible_files(tmp_path):
    root = (tmp_path / "src").resolve()  # as sources are found: resolved
    _touch(root / "b.bin", b"12345", 7_000)
    _touch(root / "a" / "x.bin", b"1", 9_000)
    _touch(root / ".hidden" / "y.bin", b"22", 1)  # hidden: not part of the source
    _touch(root / ".z", b"333", 1)
    rows = [["a/x.bin", 1, 9_000], ["b.bin", 5, 7_000]]
    assert image_source_identity(root, "folder") == {"format": "folder", "path": str(root), "count": 2, "files": rows}
    assert sequence_cache.source_identity("text", str(root)) == {
        "format": "local", "path": str(root), "count": 2, "files": rows}
    # one file: itself, by name
    assert sequence_cache.source_identity("text", str(root / "b.bin"))["files"] == [["b.bin", 5, 7_000]]


def test_a_large_local_source_is_keyed_by_a_digest_of_its_listing(tmp_path):
    root = (tmp_path / "big").resolve()
    for i in range(65):
        _touch(root / f"{i:02d}.bin", b"x" * i, 1_000 + i)
    rows = [[f"{i:02d}.bin", i, 1_000 + i] for i in range(65)]
    assert sequence_cache.source_identity("text", str(root)) == {
        "format": "local", "path": str(root), "count": 65,
        "files_sha256": hashlib.sha256(json.dumps(rows).encode()).hexdigest()}
