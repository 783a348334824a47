"""Image data: every on-disk format decoded to exact pixels, the uint8 cache (reuse, damage,
rebuild, statistics), seeded augmentation, and one-line errors for each kind of bad input."""

import gzip
import io
import json
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from headwise.families.vision.augment import normalize, random_crop_flip
from headwise.families.vision import cache as image_cache
from headwise.families.vision.cache import ImageCache, channel_stats, prepare_images
from headwise.families.vision.formats import (
    FASHION_MNIST_CLASSES,
    detect_format,
    read_idx,
    read_images,
    resolve_source,
    source_identity,
)
from headwise.families.vision import formats
from headwise.data.cache_files import CacheInvalid
from helpers import one_line_error

RNG = np.random.default_rng(0)
REPO = Path(__file__).resolve().parents[1]


# --- fixtures -------------------------------------------------------------------------------


def idx_bytes(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 8, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_idx_folder(folder: Path, gz: bool, n_train=12, n_test=5, size=(6, 5), classes=10):
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {
        "train-images-idx3-ubyte": RNG.integers(0, 256, (n_train, *size), dtype=np.uint8),
        "train-labels-idx1-ubyte": np.arange(n_train, dtype=np.uint8) % classes,
        "t10k-images-idx3-ubyte": RNG.integers(0, 256, (n_test, *size), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": np.arange(n_test, dtype=np.uint8) % classes,
    }
    for name, array in arrays.items():
        data = idx_bytes(array)
        # gzip by content only: the .gz name is what MNIST uses, but detection is by magic bytes
        (folder / (name + ".gz" if gz else name)).write_bytes(gzip.compress(data) if gz else data)
    return arrays


def write_cifar10(root: Path, n=4, label_names=("airplane", "automobile", "bird"), labels=None):
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    batches = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = RNG.integers(0, 256, (n, 3072), dtype=np.uint8)
        lab = list(labels) if labels is not None else [int(x) for x in RNG.integers(0, len(label_names), n)]
        # The real batches are Python 2 pickles whose keys load as bytes.
        obj = {b"batch_label": name.encode(), b"labels": lab, b"data": data, b"filenames": [b"x.png"] * n}
        (folder / name).write_bytes(pickle.dumps(obj, protocol=2))
        batches[name] = (data, lab)
    meta = {b"num_cases_per_batch": n, b"label_names": [s.encode() for s in label_names], b"num_vis": 3072}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    return folder, batches


def png(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def random_rgb(n, h=5, w=5):
    return [RNG.integers(0, 256, (h, w, 3), dtype=np.uint8) for _ in range(n)]


def write_parquet_datasets(folder: Path, train, test, names, test_split="test"):
    from datasets import ClassLabel, Dataset, Features
    from datasets import Image as HFImage

    folder.mkdir(parents=True)
    features = Features({"img": HFImage(), "label": ClassLabel(names=list(names))})
    for split, (images, labels) in (("train", train), (test_split, test)):
        ds = Dataset.from_dict({"img": [Image.fromarray(a) for a in images], "label": labels}, features=features)
        ds.to_parquet(str(folder / f"{split}-00000-of-00001.parquet"))


def write_parquet_plain(folder: Path, train, test, column="image"):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    for split, (images, labels) in (("train", train), ("test", test)):
        structs = [{"bytes": png(a), "path": None} for a in images]
        pq.write_table(pa.table({column: structs, "label": labels}), folder / f"{split}-00000-of-00001.parquet")


def write_folder(root: Path, spec: dict[str, dict[str, list[np.ndarray]]]):
    for split, classes in spec.items():
        for cls, images in classes.items():
            (root / split / cls).mkdir(parents=True, exist_ok=True)
            for i, a in enumerate(images):
                Image.fromarray(a).save(root / split / cls / f"{i:03d}.png")


# --- formats --------------------------------------------------------------------------------


@pytest.mark.parametrize("gz", [False, True])
def test_idx_round_trip(tmp_path, gz):
    arrays = write_idx_folder(tmp_path / "mnist", gz)
    assert detect_format(tmp_path / "mnist") == "idx"
    data = read_images(tmp_path / "mnist")
    assert data.format == "idx" and data.train.images.shape == (12, 6, 5, 1) and data.train.images.dtype == np.uint8
    np.testing.assert_array_equal(data.train.images[..., 0], arrays["train-images-idx3-ubyte"])
    np.testing.assert_array_equal(data.test.images[..., 0], arrays["t10k-images-idx3-ubyte"])
    np.testing.assert_array_equal(data.train.labels, np.arange(12) % 10)
    assert data.train.labels.dtype == np.int64 and data.class_names == tuple(str(i) for i in range(10))
    # a gzipped file under a plain name is still read (magic bytes decide)
    raw = tmp_path / "renamed"
    raw.write_bytes(gzip.compress(idx_bytes(arrays["t10k-labels-idx1-ubyte"])))
    np.testing.assert_array_equal(read_idx(raw), arrays["t10k-labels-idx1-ubyte"])


def test_idx_fashion_names_and_resize(tmp_path):
    arrays = write_idx_folder(tmp_path / "my-fashion-set", gz=True, size=(4, 4))
    data = read_images(tmp_path / "my-fashion-set", image_size=8)
    assert data.class_names == FASHION_MNIST_CLASSES
    assert data.train.images.shape == (12, 8, 8, 1)
    expected = np.asarray(Image.fromarray(arrays["train-images-idx3-ubyte"][3]).resize((8, 8), Image.BILINEAR))
    np.testing.assert_array_equal(data.train.images[3, ..., 0], expected)


def test_cifar_pixels_and_names(tmp_path):
    folder, batches = write_cifar10(tmp_path)
    for source in (tmp_path, folder):  # the folder itself or its parent
        assert detect_format(source) == "cifar"
        data = read_images(source)
        assert data.class_names == ("airplane", "automobile", "bird")
        assert data.train.images.shape == (20, 32, 32, 3) and data.test.images.shape == (4, 32, 32, 3)
    raw, labels = batches["data_batch_2"]
    # image 1 of batch 2 is train image 5; pixel (row 7, col 19), channel c is at c*1024 + 7*32 + 19
    for c in range(3):
        assert data.train.images[5, 7, 19, c] == raw[1, c * 1024 + 7 * 32 + 19]
    assert data.train.labels[4:8].tolist() == labels
    np.testing.assert_array_equal(data.test.labels, batches["test_batch"][1])


def test_cifar100(tmp_path):
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    train, test = RNG.integers(0, 256, (3, 3072), dtype=np.uint8), RNG.integers(0, 256, (2, 3072), dtype=np.uint8)
    for name, data, fine in (("train", train, [0, 1, 2]), ("test", test, [2, 0])):
        obj = {"data": data, "fine_labels": fine, "coarse_labels": [0] * len(fine)}
        (folder / name).write_bytes(pickle.dumps(obj, protocol=2))
    (folder / "meta").write_bytes(pickle.dumps({"fine_label_names": ["apple", "bee", "cat"]}, protocol=2))
    data = read_images(tmp_path)
    assert data.class_names == ("apple", "bee", "cat") and data.test.labels.tolist() == [2, 0]
    assert data.test.images[1, 31, 0, 2] == test[1, 2048 + 31 * 32]


def test_parquet_from_datasets(tmp_path):
    train, test = random_rgb(6), random_rgb(3)
    folder = tmp_path / "cifar-like" / "plain_text"
    write_parquet_datasets(folder, (train, [0, 1, 2, 0, 1, 2]), (test, [2, 1, 0]), ["cat", "dog", "eel"])
    assert detect_format(tmp_path / "cifar-like") == "parquet"
    data = read_images(tmp_path / "cifar-like")
    assert data.class_names == ("cat", "dog", "eel") and data.format == "parquet"
    np.testing.assert_array_equal(data.train.images, np.stack(train))
    np.testing.assert_array_equal(data.test.images, np.stack(test))
    assert data.test.labels.tolist() == [2, 1, 0]


def test_parquet_plain_pyarrow_validation_split_and_grayscale(tmp_path):
    gray = [RNG.integers(0, 256, (4, 4), dtype=np.uint8) for _ in range(5)]
    write_parquet_plain(tmp_path / "p", (gray[:3], [0, 3, 1]), (gray[3:], [1, 2]))
    (tmp_path / "p" / "test-00000-of-00001.parquet").rename(tmp_path / "p" / "validation-00000-of-00001.parquet")
    data = read_images(tmp_path / "p", format="parquet")
    assert data.class_names == ("0", "1", "2", "3")  # no ClassLabel metadata: from the labels
    assert data.train.images.shape == (3, 4, 4, 1)
    np.testing.assert_array_equal(data.train.images[..., 0], np.stack(gray[:3]))
    np.testing.assert_array_equal(data.test.images[..., 0], np.stack(gray[3:]))


def test_folder_of_pngs_and_resize(tmp_path):
    cats, dogs, val = random_rgb(2, 6, 6), random_rgb(3, 6, 6), random_rgb(2, 6, 6)
    write_folder(tmp_path / "imnet", {"train": {"dog": dogs, "cat": cats}, "val": {"cat": val[:1], "dog": val[1:]}})
    assert detect_format(tmp_path / "imnet") == "folder"
    data = read_images(tmp_path / "imnet")
    assert data.class_names == ("cat", "dog") and data.train.labels.tolist() == [0, 0, 1, 1, 1]
    np.testing.assert_array_equal(data.train.images, np.stack(cats + dogs))
    np.testing.assert_array_equal(data.test.images, np.stack(val))
    # a wide image: shorter side to 4, then the centre 4x4
    write_folder(tmp_path / "wide", {"train": {"a": random_rgb(1, 6, 12)}, "test": {"a": random_rgb(1, 6, 12)}})
    resized = read_images(tmp_path / "wide", image_size=4)
    img = Image.open(tmp_path / "wide" / "train" / "a" / "000.png").resize((8, 4), Image.BILINEAR).crop((2, 0, 6, 4))
    np.testing.assert_array_equal(resized.train.images[0], np.asarray(img))


def test_source_identity_and_hub_offline(tmp_path, monkeypatch):
    write_idx_folder(tmp_path / "mnist", gz=False)
    ident = source_identity(tmp_path / "mnist", "auto")
    assert ident["format"] == "idx" and ident["count"] == 4 and all(len(f) == 3 for f in ident["files"])
    monkeypatch.setenv("HEADWISE_DATA", str(tmp_path))
    assert read_images("mnist").train.images.shape == (12, 6, 5, 1)  # a name under HEADWISE_DATA
    assert source_identity("someone/cifar", "auto") == {"format": "hub", "name": "someone/cifar"}
    one_line_error(read_images, "someone/cifar", match="cannot reach the Hugging Face hub.*local folder")


# --- bad input ------------------------------------------------------------------------------


def test_bad_idx_files(tmp_path):
    write_idx_folder(tmp_path / "m", gz=False)
    images = tmp_path / "m" / "train-images-idx3-ubyte"
    good = images.read_bytes()
    images.write_bytes(good[:-7])
    match = r"train-images-idx3-ubyte is truncated.*360 data bytes, it holds 353"
    one_line_error(read_images, tmp_path / "m", match=match)
    images.write_bytes(b"\x01\x02" + good[2:])
    one_line_error(read_idx, images, match="bad magic")
    images.write_bytes(good[:2] + b"\x0d" + good[3:])
    one_line_error(read_idx, images, match="dtype 0x0d")
    images.write_bytes(good[:3] + b"\x09" + good[4:])
    one_line_error(read_idx, images, match="bad header")
    images.write_bytes(gzip.compress(good)[:-20])
    one_line_error(read_idx, images, match="not a readable gzip")
    images.write_bytes(good)
    (tmp_path / "m" / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(np.zeros(4, np.uint8)))
    one_line_error(read_images, tmp_path / "m", match="5 images but t10k-labels-idx1-ubyte 4 labels")
    (tmp_path / "m" / "t10k-labels-idx1-ubyte").unlink()
    one_line_error(read_images, tmp_path / "m", format="idx", match="lacks t10k-labels-idx1-ubyte")
    # Fashion-MNIST has 10 names: a label 10 is out of range
    arrays = write_idx_folder(tmp_path / "fashion", gz=False, classes=11)
    assert arrays["train-labels-idx1-ubyte"].max() == 10
    one_line_error(read_images, tmp_path / "fashion", match="label 10 is outside the 10 classes")


def test_train_and_test_of_different_sizes(tmp_path):
    write_idx_folder(tmp_path / "m", gz=False, size=(6, 6))
    (tmp_path / "m" / "t10k-images-idx3-ubyte").write_bytes(idx_bytes(np.zeros((5, 7, 7), np.uint8)))
    one_line_error(read_images, tmp_path / "m", match="test images are 7x7x1 but train images 6x6x1.*image_size")
    assert read_images(tmp_path / "m", image_size=6).test.images.shape == (5, 6, 6, 1)


def test_bad_cifar_label_and_pickle(tmp_path):
    write_cifar10(tmp_path / "a", label_names=("x", "y"), labels=[0, 1, 2, 1])
    one_line_error(read_images, tmp_path / "a", match="label 2 is outside the 2 classes")
    folder, _ = write_cifar10(tmp_path / "b")
    (folder / "test_batch").write_bytes(pickle.dumps({"data": os.getcwd}, protocol=2))
    one_line_error(read_images, tmp_path / "b", match="test_batch is not a readable batch pickle")
    (folder / "data_batch_3").unlink()
    one_line_error(read_images, tmp_path / "b", match="lacks data_batch_3")


def test_bad_parquet(tmp_path):
    train = random_rgb(3)
    write_parquet_datasets(tmp_path / "p", (train, [0, 1, 1]), (random_rgb(1), [1]), ["a", "b"])
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "p" / "train-00000-of-00001.parquet")
    labels = table.column("label").to_pylist()
    labels[2] = 2  # two ClassLabel names
    table = table.set_column(1, "label", [labels]).replace_schema_metadata(table.schema.metadata)
    pq.write_table(table, tmp_path / "p" / "train-00000-of-00001.parquet")
    one_line_error(read_images, tmp_path / "p", match="label 2 is outside the 2 classes")
    images = [{"bytes": png(train[0]), "path": None}, {"bytes": b"not an image", "path": None}]
    write_parquet_plain(tmp_path / "q", ([train[0], train[1]], [0, 1]), ([train[2]], [0]))
    import pyarrow as pa

    pq.write_table(pa.table({"image": images, "label": [0, 1]}), tmp_path / "q" / "train-00000-of-00001.parquet")
    one_line_error(read_images, tmp_path / "q", match="train-00000-of-00001.parquet row 1: the image cannot be decoded")
    (tmp_path / "q" / "test-00000-of-00001.parquet").unlink()
    one_line_error(read_images, tmp_path / "q", match="needs train-.*test-.*found train")


def test_bad_folders(tmp_path):
    mixed = random_rgb(1, 5, 5) + random_rgb(1, 6, 5)
    write_folder(tmp_path / "mixed", {"train": {"a": mixed}, "val": {"a": random_rgb(1)}})
    one_line_error(read_images, tmp_path / "mixed", match=r"001.png is 6x5x3 but .*000.png is 5x5x3: .*image_size")
    assert read_images(tmp_path / "mixed", image_size=4).train.images.shape == (2, 4, 4, 3)
    gray = RNG.integers(0, 256, (5, 5), dtype=np.uint8)
    write_folder(tmp_path / "chan", {"train": {"a": random_rgb(1, 5, 5) + [gray]}, "val": {"a": random_rgb(1)}})
    one_line_error(read_images, tmp_path / "chan", match="001.png is L but .*000.png is RGB: .*mixed channels")
    write_folder(tmp_path / "empty", {"train": {"a": random_rgb(1)}, "val": {"a": random_rgb(1)}})
    (tmp_path / "empty" / "train" / "b").mkdir()
    one_line_error(read_images, tmp_path / "empty", match=r"class folder .*train/b holds no images")
    write_folder(tmp_path / "extra", {"train": {"a": random_rgb(1)}, "val": {"z": random_rgb(1)}})
    one_line_error(read_images, tmp_path / "extra", match="val/z is not among the training classes")
    write_folder(tmp_path / "broken", {"train": {"a": random_rgb(1)}, "val": {"a": random_rgb(1)}})
    (tmp_path / "broken" / "val" / "a" / "001.png").write_bytes(b"\x89PNG broken")
    one_line_error(read_images, tmp_path / "broken", match="val/a/001.png: the image cannot be decoded")
    write_folder(tmp_path / "notest", {"train": {"a": random_rgb(1)}})
    one_line_error(read_images, tmp_path / "notest", format="folder", match="needs train/<class>/ and val/<class>/")
    (tmp_path / "nothing").mkdir()
    one_line_error(read_images, tmp_path / "nothing", match="cannot tell the image format")
    one_line_error(read_images, tmp_path / "missing", match="not found as a path")
    one_line_error(read_images, tmp_path / "nothing", format="png", match="unknown image format")


# --- the cache ------------------------------------------------------------------------------


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


@pytest.mark.parametrize("damage", ["flip", "truncate", "meta"])
def test_damaged_cache_refused_then_rebuilt(cifar_cache, damage):
    folder, root = cifar_cache
    cache = prepare_images(folder, cache_dir=root)
    target = cache.path / "train-images.u8"
    data = bytearray(target.read_bytes())
    if damage == "flip":
        data[1234] ^= 0xFF
        target.write_bytes(bytes(data))
        match = "does not match its recorded sha256"
    elif damage == "truncate":
        target.write_bytes(bytes(data[:-10]))
        match = "has 92,150 bytes, expected 92,160"
    else:
        (cache.path / "meta.json").write_text("{broken")
        match = "not valid JSON"
    message = one_line_error(prepare_images, folder, cache_dir=root, match=match)
    assert "rebuild" in message
    with pytest.raises(CacheInvalid):
        ImageCache.open(cache.path)
    fixed = prepare_images(folder, cache_dir=root, rebuild=True)
    np.testing.assert_array_equal(fixed.images("train"), read_images(folder).train.images)
    ImageCache.open(fixed.path, verify=True)


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
    """Every file of a cache, meta.json without the build's time and date."""
    files = {p.name: p.read_bytes() for p in cache.path.iterdir()}
    meta = json.loads(files.pop("meta.json"))
    del meta["seconds"], meta["created"]
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


def test_channel_stats_match_numpy():
    images = RNG.integers(0, 256, (50, 7, 7, 3), dtype=np.uint8)
    mean, std = channel_stats(images)
    np.testing.assert_allclose(mean, (images / 255).mean(axis=(0, 1, 2)), rtol=1e-12)
    np.testing.assert_allclose(std, (images / 255).std(axis=(0, 1, 2)), rtol=1e-12)


# --- augmentation ---------------------------------------------------------------------------


def test_augment_identity_and_determinism():
    images = torch.randint(0, 256, (32, 3, 8, 8), dtype=torch.uint8)
    assert random_crop_flip(images, torch.Generator().manual_seed(0)) is images
    a = random_crop_flip(images, torch.Generator().manual_seed(1), padding=2, flip=True)
    b = random_crop_flip(images, torch.Generator().manual_seed(1), padding=2, flip=True)
    c = random_crop_flip(images, torch.Generator().manual_seed(2), padding=2, flip=True)
    assert a.dtype == torch.uint8 and a.shape == images.shape
    assert torch.equal(a, b) and not torch.equal(a, c)
    floats = random_crop_flip(images.float(), torch.Generator().manual_seed(1), padding=2, flip=True)
    assert torch.equal(floats, a.float())


def test_augment_crop_windows_by_hand():
    image = torch.arange(16, dtype=torch.uint8).view(1, 1, 4, 4)
    padded = np.pad(np.arange(16).reshape(4, 4), 1)
    windows = {(dy, dx): padded[dy:dy + 4, dx:dx + 4] for dy in range(3) for dx in range(3)}
    # two windows written out by hand: offset (0, 0) and offset (2, 1)
    assert windows[(0, 0)].tolist() == [[0, 0, 0, 0], [0, 0, 1, 2], [0, 4, 5, 6], [0, 8, 9, 10]]
    assert windows[(2, 1)].tolist() == [[4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15], [0, 0, 0, 0]]
    batch = image.expand(400, 1, 4, 4)
    out = random_crop_flip(batch, torch.Generator().manual_seed(0), padding=1)[:, 0].numpy()
    seen = set()
    for crop in out:
        match = [k for k, w in windows.items() if np.array_equal(crop, w)]
        assert len(match) == 1
        seen.add(match[0])
    assert seen == set(windows)  # every offset occurs: independent per image


def test_augment_flip():
    images = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).view(2, 3, 4, 5).repeat(100, 1, 1, 1)
    out = random_crop_flip(images, torch.Generator().manual_seed(3), flip=True)
    flipped = [torch.equal(o, i.flip(-1)) for o, i in zip(out, images)]
    kept = [torch.equal(o, i) for o, i in zip(out, images)]
    assert all(f != k for f, k in zip(flipped, kept))  # each image either mirrored or untouched
    assert 60 < sum(flipped) < 140


def test_normalize():
    images = torch.tensor([[[[0, 255]], [[51, 102]]]], dtype=torch.uint8)  # [1, 2, 1, 2]
    out = normalize(images, mean=(0.5, 0.2), std=(0.5, 0.1))
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor([[[[-1.0, 1.0]], [[0.0, 2.0]]]]))


# --- the real Fashion-MNIST -----------------------------------------------------------------


def fashion_mnist_dir() -> Path | None:
    env = os.environ.get("HEADWISE_DATA")
    root = Path(env) if env else REPO.parent / "shared" / "data"
    return root if (root / "fashion-mnist" / "train-images-idx3-ubyte.gz").is_file() else None


@pytest.mark.skipif(
    fashion_mnist_dir() is None,
    reason="needs the real Fashion-MNIST (60,000 images, not shipped with headwise): set HEADWISE_DATA to a folder "
           "holding fashion-mnist/",
)
def test_real_fashion_mnist(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADWISE_DATA", str(fashion_mnist_dir()))
    cache = prepare_images("fashion-mnist", cache_dir=tmp_path)
    assert cache.num_examples("train") == 60000 and cache.num_examples("test") == 10000
    assert cache.images("train").shape == (60000, 28, 28, 1) and cache.images("test").shape == (10000, 28, 28, 1)
    assert cache.class_names == FASHION_MNIST_CLASSES
    assert np.bincount(cache.labels("train")).tolist() == [6000] * 10
    assert np.bincount(cache.labels("test")).tolist() == [1000] * 10
    assert abs(cache.mean[0] - 0.2860) < 1e-3 and abs(cache.std[0] - 0.3530) < 1e-3


def test_hub_reader_on_a_local_folder(tmp_path, monkeypatch):
    """The hub path (datasets.load_dataset) on a folder in the hub's layout: no network needed."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    train, test = random_rgb(4), random_rgb(2)
    write_parquet_datasets(tmp_path / "hub" / "data", (train, [1, 0, 1, 0]), (test, [0, 1]), ["no", "yes"])
    data = read_images(tmp_path / "hub", format="hub")
    assert data.format == "hub" and data.class_names == ("no", "yes")
    np.testing.assert_array_equal(data.train.images, np.stack(train))
    assert data.test.labels.tolist() == [0, 1]
    cache = prepare_images(tmp_path / "hub", format="hub", cache_dir=tmp_path / "c")  # streamed
    np.testing.assert_array_equal(cache.images("train"), data.train.images)
    assert cache.class_names == ("no", "yes") and cache.labels("train").tolist() == [1, 0, 1, 0]


def test_fashion_mnist_comes_from_the_hub_when_no_local_copy_is_found(tmp_path, monkeypatch):
    monkeypatch.delenv("HEADWISE_DATA", raising=False)
    monkeypatch.chdir(tmp_path)
    # offline (the tests run with HF_HUB_OFFLINE=1): one line naming both ways to get it
    message = one_line_error(resolve_source, "fashion-mnist", match="cannot be reached")
    assert "HEADWISE_DATA" in message and "network" in message and "zalando-datasets/fashion_mnist" in message
    # with network, the hub's copy; a local folder of that name still comes first
    monkeypatch.setattr(formats, "hub_offline", lambda: False)
    monkeypatch.setattr(formats, "hub_reachable", lambda: True)
    assert resolve_source("fashion-mnist") == ("zalando-datasets/fashion_mnist", "hub")
    write_idx_folder(tmp_path / "fashion-mnist", gz=True)
    assert resolve_source("fashion-mnist") == (str(tmp_path / "fashion-mnist"), "idx")

