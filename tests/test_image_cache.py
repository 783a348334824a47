"""The image cache: build, reopen and statistics; the cheap check on open against the full hashes
of ``headwise data verify``; damage refused in one line; streamed builds."""

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from headwise.families.vision import cache as image_cache
from headwise.families.vision.augment import normalize
from headwise.families.vision.formats import read_images
from headwise.families.vision.cache import ImageCache, channel_stats, prepare_images
from headwise.data.cache_files import CacheInvalid
from helpers import one_line_error
from test_image_data import (
    RNG,
    random_rgb,
    write_cifar10,
    write_folder,
    write_parquet_datasets,
    write_parquet_plain,
)


@pytest.fixture
def cifar_cache(tmp_path):
    folder, _ = write_cifar10(tmp_path / "data", n=6)
    return folder, tmp_path / "cache"


def test_cache_build_reopen_stats(cifar_cache):
    folder, root = cifar_cache
    cache = prepare_images(folder, cache_dir=root)
    data = read_images(folder)
    assert cache.path.parent == root and cache.path.name.startswith("images-cifar-10-batches-py-")
    assert isinstance(cache.images("train"), np.memmap) and not cache.images("train").flags.writeable
    np.testing.assert_array_equal(cache.images("train"), data.train.images)
    np.testing.assert_array_equal(cache.images("test"), data.test.images)
    np.testing.assert_array_equal(cache.labels("train"), data.train.labels)
    assert cache.labels("test").dtype == np.int64 and cache.num_examples("train") == 30
    assert (cache.num_classes, cache.image_size, cache.channels) == (3, 32, 3)
    assert cache.class_names == ("airplane", "automobile", "bird")
    x = data.train.images.astype(np.float64) / 255
    np.testing.assert_allclose(cache.mean, x.mean(axis=(0, 1, 2)), rtol=1e-12)
    np.testing.assert_allclose(cache.std, x.std(axis=(0, 1, 2)), rtol=1e-12)
    mtime = (cache.path / "meta.json").stat().st_mtime_ns
    again = prepare_images(folder, cache_dir=root)  # reused, not rebuilt
    assert again.path == cache.path and (again.path / "meta.json").stat().st_mtime_ns == mtime
    assert not [p for p in root.iterdir() if p.name.startswith(".")]
    resized = prepare_images(folder, cache_dir=root, image_size=16)  # another request, another folder
    assert resized.path != cache.path and resized.image_size == 16
    one_line_error(cache.images, "valid", match="not 'valid'")


def _edit_meta(path: Path, edit) -> None:
    meta = json.loads((path / "meta.json").read_text())
    edit(meta)
    (path / "meta.json").write_text(json.dumps(meta, indent=2))


def _flip_byte(file: Path, at: int, bits: int = 0xFF) -> None:
    """Flip ``bits`` of the byte at ``at`` in place (the size unchanged)."""
    data = bytearray(file.read_bytes())
    data[at] ^= bits
    file.write_bytes(bytes(data))


def _next_class(file: Path, classes: int) -> None:
    """Change the first label in place to the next class: the same size, still a class id, so
    only the file's sha256 can tell (a run would silently learn from a wrong label)."""
    labels = np.fromfile(file, dtype="<i8")
    labels[0] = (labels[0] + 1) % classes
    labels.tofile(file)


DAMAGE = {
    # what is done to a built cache -> the words of the refusal when it is next opened (cheaply)
    "truncate": (lambda p: p.joinpath("train-images.u8").write_bytes(p.joinpath("train-images.u8").read_bytes()[:-10]),
                 "train-images.u8 has 92,150 bytes, expected 92,160 (truncated)"),
    "grown": (lambda p: p.joinpath("test-images.u8").write_bytes(p.joinpath("test-images.u8").read_bytes() + b"x"),
              "test-images.u8 has 18,433 bytes, expected 18,432 (grown or replaced)"),
    "replaced": (lambda p: p.joinpath("train-labels.i64").write_bytes(np.zeros(29, "<i8").tobytes()),
                 "train-labels.i64 has 232 bytes, expected 240"),
    "missing": (lambda p: p.joinpath("test-labels.i64").unlink(), "test-labels.i64 is missing"),
    "label-changed": (lambda p: _next_class(p / "train-labels.i64", 3),
                      "train-labels.i64 does not match its recorded sha256 (corrupted)"),
    "not-json": (lambda p: p.joinpath("meta.json").write_text("{broken"), "not valid JSON"),
    "std-edited": (lambda p: _edit_meta(p, lambda m: m.__setitem__("std", [0.5, 0.5, 0.5])),
                   "meta.json does not match its recorded digest (edited or damaged)"),
    "count-edited": (lambda p: _edit_meta(p, lambda m: m["splits"]["test"].__setitem__("count", 5)),
                     "does not match its recorded digest"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_cache_refused_on_open_then_rebuilt(cifar_cache, damage):
    """Damage the sizes, the metadata or the labels' sha256 can show is refused by the cheap open
    (no image hashed), in one line naming the file and how to rebuild."""
    folder, root = cifar_cache
    cache = prepare_images(folder, cache_dir=root)
    do, match = DAMAGE[damage]
    do(cache.path)
    message = one_line_error(prepare_images, folder, cache_dir=root, match=re.escape(match))
    assert "--rebuild" in message and str(cache.path) in message
    with pytest.raises(CacheInvalid):
        ImageCache.open(cache.path)
    fixed = prepare_images(folder, cache_dir=root, rebuild=True)
    np.testing.assert_array_equal(fixed.images("train"), read_images(folder).train.images)
    ImageCache.open(fixed.path, verify=True)


def test_open_hashes_the_labels_only_and_verify_hashes_every_file(cifar_cache, monkeypatch):
    """The documented trade-off: a byte of an image changed in place (same size) passes the cheap
    open, which hashes only the (small) labels files, and is caught by ``verify`` (``headwise data
    verify``), which hashes all four data files."""
    import headwise.data.cache_files as cache_files

    folder, root = cifar_cache
    cache = prepare_images(folder, cache_dir=root)
    _flip_byte(cache.path / "train-images.u8", 1234)
    hashed = []
    real = cache_files.sha256_file
    monkeypatch.setattr(cache_files, "sha256_file", lambda path: hashed.append(path.name) or real(path))
    reused = prepare_images(folder, cache_dir=root)  # a run start: not caught, no image read
    assert sorted(hashed) == ["test-labels.i64", "train-labels.i64"] and reused.path == cache.path
    one_line_error(ImageCache.open, cache.path, verify=True,
                   match="train-images.u8 does not match its recorded sha256 \\(corrupted\\)")
    hashed.clear()
    # a build hashes its files once, from disk, then opens what was installed (the labels again)
    prepare_images(folder, cache_dir=root, rebuild=True)
    assert sorted(hashed) == sorted(["train-images.u8", "test-images.u8", *["train-labels.i64", "test-labels.i64"] * 2])
    hashed.clear()
    ImageCache.open(cache.path, verify=True)
    assert len(hashed) == 4


def test_meta_digest_is_the_sha256_of_the_rest_as_canonical_json(cifar_cache):
    folder, root = cifar_cache
    cache = prepare_images(folder, cache_dir=root)
    meta = json.loads((cache.path / "meta.json").read_text())
    recorded = meta.pop("meta_sha256")
    expected = hashlib.sha256(json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert recorded == expected
    # a layout change alone (indentation, key order) is no edit
    (cache.path / "meta.json").write_text(json.dumps({**meta, "meta_sha256": recorded}, sort_keys=True))
    ImageCache.open(cache.path)


def test_a_cache_without_a_digest_is_hashed_on_every_open(cifar_cache):
    """A cache from before digests were recorded has only its sha256s to vouch for it: opening it
    hashes every file, as every open did then."""
    folder, root = cifar_cache
    cache = prepare_images(folder, cache_dir=root)
    _edit_meta(cache.path, lambda m: m.pop("meta_sha256"))
    ImageCache.open(cache.path)
    with open(cache.path / "test-images.u8", "r+b") as f:
        f.write(b"\xff\x00\xff")
    one_line_error(ImageCache.open, cache.path, match="test-images.u8 does not match its recorded sha256")


def test_a_build_that_does_not_read_back_is_never_installed(cifar_cache, monkeypatch):
    import headwise.data.cache_files as cache_files
    from headwise.errors import RunFailure

    folder, root = cifar_cache
    monkeypatch.setattr(cache_files, "sha256_file", lambda path: "0" * 64)
    with pytest.raises(RunFailure, match="does not read back as written; check the disk"):
        prepare_images(folder, cache_dir=root)
    assert not root.exists()  # the cache folder made for it went too


def test_a_constant_channel_is_normalised_by_one(tmp_path):
    """A channel of one value in every training image has std 0 (recorded as such); images are
    normalised by 1 there, so they stay finite, and by the std elsewhere."""
    images = random_rgb(4, 4, 4)
    for a in images:
        a[..., 2] = 9
    write_folder(tmp_path / "blue", {"train": {"a": images[:2], "b": images[2:]}, "val": {"a": random_rgb(1, 4, 4)}})
    cache = prepare_images(tmp_path / "blue", cache_dir=tmp_path / "c")
    meta = json.loads((cache.path / "meta.json").read_text())
    x = np.stack(images).astype(np.float64) / 255
    np.testing.assert_allclose(meta["std"], x.std(axis=(0, 1, 2)), atol=1e-12)
    assert meta["std"][2] == 0 and cache.std[2] == 1.0 and cache.std[:2] == tuple(meta["std"][:2])
    pixels = torch.from_numpy(np.array(cache.images("train"))).permute(0, 3, 1, 2)
    out = normalize(pixels, cache.mean, cache.std)
    assert torch.isfinite(out).all()
    np.testing.assert_allclose(out[:, 2].numpy(), 9 / 255 - meta["mean"][2], atol=1e-6)


def test_cache_refuses_other_request_and_non_square(tmp_path):
    folder, _ = write_cifar10(tmp_path / "data")
    cache = prepare_images(folder, cache_dir=tmp_path / "c")
    one_line_error(ImageCache.open, cache.path, request={"other": 1}, match="different request")
    write_folder(tmp_path / "wide", {"train": {"a": random_rgb(2, 4, 6)}, "val": {"a": random_rgb(1, 4, 6)}})
    one_line_error(prepare_images, tmp_path / "wide", cache_dir=tmp_path / "c", match="4x6.*square.*image_size")
    assert [p.name for p in (tmp_path / "c").iterdir()] == [cache.path.name]  # the failure left nothing
    meta = json.loads((cache.path / "meta.json").read_text())
    assert meta["splits"]["train"]["class_counts"] == np.bincount(cache.labels("train"), minlength=3).tolist()


# --- streamed builds (class folders, parquet, hub) ---------------------------------------------


def cache_files(cache: ImageCache) -> dict[str, bytes]:
    """Every file of a cache, meta.json without the build's time and date (nor its digest, which covers them)."""
    files = {p.name: p.read_bytes() for p in cache.path.iterdir()}
    meta = json.loads(files.pop("meta.json"))
    del meta["seconds"], meta["created"], meta["meta_sha256"]
    files["meta.json"] = json.dumps(meta, sort_keys=True).encode()
    return files


def write_streamed_folder(root: Path, sizes=((6, 6),)):
    """A class folder of 3 + 7 + 4 training and 5 val images (more than a few tiny chunks), sizes cycling."""
    images = iter([RNG.integers(0, 256, (*sizes[i % len(sizes)], 3), dtype=np.uint8) for i in range(19)])
    spec = {"train": {"ant": [next(images) for _ in range(3)], "bee": [next(images) for _ in range(7)],
                      "cow": [next(images) for _ in range(4)]},
            "val": {"ant": [next(images) for _ in range(2)], "cow": [next(images) for _ in range(3)]}}
    write_folder(root, spec)


@pytest.fixture
def streamed(monkeypatch):
    """Tiny chunks, and a prepare_images that never decodes a folder whole."""
    monkeypatch.setattr(image_cache, "CHUNK_SIZE", 3)

    def whole(*args, **kwargs):
        raise AssertionError("prepare_images decoded the data whole instead of streaming it")

    monkeypatch.setattr(image_cache, "read_images", whole)
    return monkeypatch


@pytest.mark.parametrize("image_size", [None, 4])
def test_streamed_folder_cache_matches_in_memory_and_is_the_same_on_any_workers(tmp_path, streamed, image_size):
    sizes = ((6, 6),) if image_size is None else ((6, 6), (5, 9), (8, 7))  # resized: any sizes
    write_streamed_folder(tmp_path / "imnet", sizes)
    data = read_images(tmp_path / "imnet", image_size=image_size)
    builds = []
    for workers in (1, 2):
        streamed.setattr(image_cache, "WORKERS", workers)
        cache = prepare_images(tmp_path / "imnet", image_size=image_size, cache_dir=tmp_path / f"cache-{workers}")
        np.testing.assert_array_equal(cache.images("train"), data.train.images)
        np.testing.assert_array_equal(cache.images("test"), data.test.images)
        np.testing.assert_array_equal(cache.labels("train"), data.train.labels)
        np.testing.assert_array_equal(cache.labels("test"), data.test.labels)
        assert cache.labels("train").tolist() == [0] * 3 + [1] * 7 + [2] * 4
        mean, std = channel_stats(data.train.images)
        assert list(cache.mean) == mean and list(cache.std) == std  # exactly: the same histograms
        assert cache.class_names == data.class_names == ("ant", "bee", "cow")
        assert cache.description == data.description and cache.meta["source_format"] == "folder"
        assert cache.meta["splits"]["test"]["class_counts"] == [2, 0, 3]
        assert not [p for p in cache.path.parent.iterdir() if p.name.startswith(".")]
        builds.append(cache_files(cache))
    assert builds[0] == builds[1]  # byte for byte, however many processes decoded
    # the files hold what an in-memory build writes
    streamed.setattr(image_cache, "read_images", read_images)
    streamed.setattr(image_cache, "STREAM_FORMATS", frozenset())
    whole = prepare_images(tmp_path / "imnet", image_size=image_size, cache_dir=tmp_path / "whole")
    assert cache_files(whole) == builds[0]


@pytest.mark.parametrize("workers", [1, 2])
def test_streamed_mid_build_failure_leaves_nothing(tmp_path, streamed, workers):
    streamed.setattr(image_cache, "WORKERS", workers)
    good = random_rgb(9)
    write_folder(tmp_path / "sizes", {"train": {"a": good[:4], "b": good[4:] + random_rgb(1, 6, 5)},
                                      "val": {"a": random_rgb(2)}})
    root = tmp_path / "cache"
    match = r"train/b/005.png is 6x5x3 but .*train/a/000.png is 5x5x3: images of mixed sizes; .*image_size"
    one_line_error(prepare_images, tmp_path / "sizes", cache_dir=root, match=match)
    assert not root.exists()  # made for the build, removed with it
    root.mkdir()
    (root / "keep").write_text("x")
    write_folder(tmp_path / "chan", {"train": {"a": good + [np.zeros((5, 5), np.uint8)]}, "val": {"a": random_rgb(1)}})
    one_line_error(prepare_images, tmp_path / "chan", cache_dir=root, match="009.png is L but .*000.png is RGB")
    write_folder(tmp_path / "broken", {"train": {"a": good}, "val": {"a": random_rgb(8)}})
    (tmp_path / "broken" / "val" / "a" / "006.png").write_bytes(b"\x89PNG broken")
    one_line_error(prepare_images, tmp_path / "broken", cache_dir=root, match="val/a/006.png: the image cannot be")
    write_folder(tmp_path / "test-size", {"train": {"a": good}, "val": {"a": random_rgb(2, 4, 4)}})
    one_line_error(prepare_images, tmp_path / "test-size", cache_dir=root,
                   match="test-size: test images are 4x4x3 but train images 5x5x3; set image_size")
    write_folder(tmp_path / "wide", {"train": {"a": random_rgb(5, 4, 6)}, "val": {"a": random_rgb(1, 4, 6)}})
    one_line_error(prepare_images, tmp_path / "wide", cache_dir=root,
                   match=r"wide \(folder, 5 \+ 1 images 4x6x3\): images are 4x6, .*square.*image_size")
    assert [p.name for p in root.iterdir()] == ["keep"]  # no cache, no temporary folder
    # the first bad image in file order is the one named, whatever the chunks and processes
    write_folder(tmp_path / "two", {"train": {"a": good[:5] + random_rgb(1, 6, 6) + random_rgb(1, 7, 7)},
                                    "val": {"a": random_rgb(1)}})
    one_line_error(prepare_images, tmp_path / "two", cache_dir=root, match="005.png is 6x6x3 but")


def test_streamed_parquet_and_label_check(tmp_path, streamed):
    train, test = random_rgb(8), random_rgb(4)
    write_parquet_datasets(tmp_path / "p", (train, [0, 1, 2, 0, 1, 2, 0, 1]), (test, [2, 1, 0, 0]), ["x", "y", "z"])
    streamed.setattr(image_cache, "WORKERS", 2)
    cache = prepare_images(tmp_path / "p", cache_dir=tmp_path / "c")
    np.testing.assert_array_equal(cache.images("train"), np.stack(train))
    np.testing.assert_array_equal(cache.images("test"), np.stack(test))
    assert cache.labels("test").tolist() == [2, 1, 0, 0] and cache.class_names == ("x", "y", "z")
    assert list(cache.mean) == channel_stats(np.stack(train))[0]
    gray = [RNG.integers(0, 256, (4, 4), dtype=np.uint8) for _ in range(7)]
    write_parquet_plain(tmp_path / "q", (gray[:5], [0, 3, 1, 1, 0]), (gray[5:], [1, 2]))
    cache = prepare_images(tmp_path / "q", cache_dir=tmp_path / "c")  # no ClassLabel names: from the labels
    assert cache.class_names == ("0", "1", "2", "3") and cache.channels == 1
    np.testing.assert_array_equal(cache.images("train")[..., 0], np.stack(gray[:5]))
    write_parquet_datasets(tmp_path / "r", (train, [0, 1, 1, 0, 1, 0, 1, 0]), (test, [0, 1, 1, 0]), ["a", "b"])
    import pyarrow.parquet as pq

    file = tmp_path / "r" / "test-00000-of-00001.parquet"
    table = pq.read_table(file)  # a label past the two ClassLabel names, found after decoding
    table = table.set_column(1, "label", [[0, 1, 2, 0]]).replace_schema_metadata(table.schema.metadata)
    pq.write_table(table, file)
    one_line_error(prepare_images, tmp_path / "r", cache_dir=tmp_path / "c", match="test label 2 is outside the 2")
    assert not [p for p in (tmp_path / "c").iterdir() if p.name.startswith(".")]


def test_streamed_build_reports_progress(tmp_path, streamed):
    seen = []

    class Status(image_cache._Status):
        def __init__(self, enabled, text):
            super().__init__(False, text)  # no terminal here: record instead of drawing

        def update(self, progress):
            seen.append(progress)

    streamed.setattr(image_cache, "_Status", Status)
    write_streamed_folder(tmp_path / "imnet")
    prepare_images(tmp_path / "imnet", cache_dir=tmp_path / "c", progress=True)
    assert seen[0] == "3 of 19 images" and seen[-1] == "19 of 19 images"
    assert len(seen) == 5 + 2  # chunks of 3: 14 train images in 5, 5 val in 2
