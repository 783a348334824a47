"""Image caches: a data set decoded once into uint8 files, memory-mapped by every later run.

A cache is a folder ``<cache_dir>/images-<source>-<key>/`` holding

- ``train-images.u8``, ``test-images.u8``: the images, uint8 ``[N, H, W, C]`` row-major, no header
- ``train-labels.i64``, ``test-labels.i64``: the labels, little-endian int64 ``[N]``
- ``meta.json``: the request (the source's files with sizes and times, the format and image size),
  shapes, class names, per-channel mean and std of the training images, counts, every file's
  size and sha256, and the sha256 of the rest of ``meta.json`` itself

``key`` hashes the request, so a changed source file or another ``image_size`` is a new folder
beside the old one. A cache is built and refused as every cache is
(:mod:`headwise.data.cache_files`), its files hashed again from disk (once) before it is renamed
into place. Opening is cheap, as every run start opens the cache: it checks the format version,
the metadata's own digest (an edit), the request, every file's size (truncated or replaced) and
the labels' sha256 and class ids (small, and a changed label would train silently), without
reading the images; ``verify`` (``headwise data verify``) also compares the images' sha256 (a byte
changed in place, which the sizes cannot see).

Class folders, parquet files and hub data sets stream: their images are decoded chunk by chunk
on a process pool (:func:`headwise.families.vision.streams.decode_split`, in file order) and written
straight into the files of the temporary folder, hashed and counted (the statistics) on the way,
so no more than a few chunks per worker are ever in memory. IDX and CIFAR, small by nature, are
decoded whole first.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from headwise.data.cache_files import (
    META, META_DIGEST, CacheFolder, CacheInvalid, HashedFile, Invalid, build_in_temporary, cache_root, check_file,
    meta_field, request_key, slug,
)
from headwise.data.cache_files import Status as _Status
from headwise.data.cache_files import write_array as _write
from headwise.families.vision.formats import (
    STREAM_FORMATS, ImageData, check_labels, check_same_shape, open_stream, read_images, resolve_source,
    source_identity,
)
from headwise.families.vision.streams import ImageStream, decode_split
from headwise.errors import HeadwiseError, RunFailure

SPLITS = ("train", "test")
_LABEL_DTYPE = np.dtype("<i8")
CHUNK_SIZE = 128  # images per unit of work when streaming (224 px RGB: ~19 MB)
WORKERS: int | None = None  # decoding processes when streaming; None: the usable CPUs, at most MAX_WORKERS
MAX_WORKERS = 16


@dataclass
class ImageCache(CacheFolder):
    """An opened, checked image cache."""

    KIND = "images"
    WHAT = "image cache"
    BUILT_FROM = "source files, format or image_size"
    REBUILD = "`headwise data prepare --config RUN.toml --rebuild`, or rebuild=True"
    DIGEST = True

    description = meta_field(str, "description", "A few words on what the cache holds.")
    class_names = meta_field(tuple, "class_names", "Class names, indexed by label.")

    def _split(self, split: str) -> dict[str, Any]:
        if split not in SPLITS:
            raise HeadwiseError(f"image caches hold the splits {', '.join(SPLITS)}, not {split!r}")
        return self.meta["splits"][split]

    def images(self, split: str) -> np.ndarray:
        """The images of ``split`` ("train" or "test"): a read-only uint8 memory map ``[N, H, W, C]``,
        opened once (every batch reads it)."""
        return self._opened(("images", split), lambda info: np.memmap(
            self.path / info["images"]["file"], dtype=np.uint8, mode="r", shape=(int(info["count"]), *self.meta["shape"])))

    def labels(self, split: str) -> np.ndarray:
        """The labels of ``split``: int64 ``[N]``, read once (ImageNet's 1.28M labels took 1.7 ms a
        batch when read for each) and read-only."""
        def read(info: dict[str, Any]) -> np.ndarray:
            labels = np.fromfile(self.path / info["labels"]["file"], dtype=_LABEL_DTYPE).astype(np.int64)
            labels.setflags(write=False)
            return labels

        return self._opened(("labels", split), read)

    def __getstate__(self) -> dict[str, Any]:
        # a pickled cache (sent to another process) opens its files again there: no array copies
        return {k: v for k, v in self.__dict__.items() if k != "_arrays"}

    def _opened(self, key: tuple[str, str], open_: Any) -> np.ndarray:
        """What ``open_`` makes of ``key``'s split, made on the first call only."""
        opened = self.__dict__.setdefault("_arrays", {})
        if key not in opened:
            opened[key] = open_(self._split(key[1]))
        return opened[key]

    def num_examples(self, split: str) -> int:
        """Images in ``split``."""
        return int(self._split(split)["count"])

    @property
    def num_classes(self) -> int:
        """Number of classes (the classifier's width)."""
        return len(self.meta["class_names"])

    @property
    def image_size(self) -> int:
        """Height = width of every image, in pixels."""
        return int(self.meta["shape"][0])

    @property
    def channels(self) -> int:
        """1 (grayscale) or 3 (RGB)."""
        return int(self.meta["shape"][2])

    @property
    def mean(self) -> tuple[float, ...]:
        """Per-channel mean of the training images in [0, 1] units."""
        return tuple(float(x) for x in self.meta["mean"])

    @property
    def std(self) -> tuple[float, ...]:
        """Per-channel standard deviation (population) of the training images in [0, 1] units, the
        scale images are normalised by: 1 for a channel of one value throughout (std 0, as
        ``meta.json`` records it), which would otherwise be divided by zero (scikit-learn's
        ``StandardScaler`` does the same)."""
        return tuple(float(x) or 1.0 for x in self.meta["std"])

    def spec_fields(self) -> dict[str, Any]:
        """The model fields the data dictates: the image's side, channels and classes."""
        return {"image_size": self.image_size, "channels": self.channels, "num_classes": self.num_classes}

    def summary(self) -> dict[str, Any]:
        """What ``headwise data info`` and ``list`` show of the cache."""
        return {
            "cache": str(self.path),
            "data": self.description,
            "classes": self.num_classes,
            "image_size": self.image_size,
            "channels": self.channels,
            "train_images": self.num_examples("train"),
            "test_images": self.num_examples("test"),
        }

    def headline(self) -> str:
        """The cache in one line (``headwise data list``)."""
        return f"{self.num_examples('train'):,} train images, {self.num_classes} classes"

    @classmethod
    def checked(cls, path: Path, meta: dict[str, Any], verify: bool, invalid: Invalid) -> "ImageCache":
        """The cache once its shape, statistics, file sizes, labels' sha256 and class ids pass the
        checks; ``verify`` hashes the images too, as does an open of a cache that records no digest
        (built by an earlier headwise)."""
        verify = verify or meta.get(META_DIGEST) is None
        h, w, c = (int(d) for d in meta["shape"])
        if h != w or h < 1 or c not in (1, 3) or len(meta["mean"]) != c or len(meta["std"]) != c:
            raise invalid(f"{META} records shape {meta['shape']} with {len(meta['mean'])} means (damaged)")
        if not all(np.isfinite(float(x)) for x in (*meta["mean"], *meta["std"])):
            raise invalid(f"{META} records mean {meta['mean']} and std {meta['std']} (damaged)")
        for split in SPLITS:
            info = meta["splits"][split]
            n = int(info["count"])
            if n < 1:
                raise invalid(f"{META} records no {split} images (damaged)")
            check_file(path, info["images"], n * h * w * c, verify, invalid)
            # the labels are small (0.5 MB for 60k) and a changed label trains silently: hash them always
            check_file(path, info["labels"], n * _LABEL_DTYPE.itemsize, True, invalid)
        cache = cls(path=path, meta=meta)
        for split in SPLITS:  # labels are small: a label past the classes is caught here, not in training
            labels = cache.labels(split)
            if labels.min() < 0 or labels.max() >= cache.num_classes:
                raise invalid(f"{split} labels reach {int(labels.max())} with {cache.num_classes} classes (damaged)")
        return cache


def image_request(source: str | Path, format: str = "auto", image_size: int | None = None) -> dict[str, Any]:
    """The request that keys a cache: the source's identity (see ``source_identity``) and ``image_size``."""
    identity = source_identity(source, format)
    return {"kind": ImageCache.KIND, "format": ImageCache.FORMAT, "source": identity, "image_size": image_size}


def cache_name(request: dict[str, Any]) -> str:
    """The folder name of a request's cache: readable prefix plus the request's key."""
    source = request["source"]
    base = source["name"].replace("/", "--") if source["format"] == "hub" else Path(source["path"]).name
    if request["image_size"] is not None:
        base += f"-{request['image_size']}px"
    return f"images-{slug(base)}-{request_key(request)}"


def prepare_images(
    source: str | Path,
    format: str = "auto",
    image_size: int | None = None,
    cache_dir: str | Path | None = None,
    rebuild: bool = False,
    progress: bool = False,
) -> ImageCache:
    """Decode ``source`` into a cache, or reuse the cache of the same request.

    ``source`` is a path, a name under ``HEADWISE_DATA`` (``fashion-mnist``) or a hub name
    (``uoft-cs/cifar10``); ``cache_dir`` defaults to ``default_cache_dir()``. A valid cache is
    reused unless ``rebuild``; an unusable one is refused with its reason unless ``rebuild``.
    Class folders, parquet and hub data stream into the cache (``CHUNK_SIZE`` images at a time on
    up to ``WORKERS`` processes; ``progress`` counts the images decoded); IDX and CIFAR are
    decoded whole first.
    """
    name, format = resolve_source(source, format)
    request = image_request(name, format, image_size)
    final = cache_root(cache_dir) / cache_name(request)
    if (cache := ImageCache.existing(final, request, rebuild)) is not None:
        return cache
    started = time.perf_counter()
    with _Status(progress, f"decoding {name} ({format})") as status:
        if format in STREAM_FORMATS:
            stream = open_stream(name, format)  # lists (checks) the files, or loads the hub data set
            return _install(final, request, rebuild,
                            lambda tmp: _build_stream(stream, request, tmp, image_size, status, started))
        data = read_images(name, format, image_size)
    _check_square(data.description, data.train.images.shape[1:])
    return _install(final, request, rebuild, lambda tmp: _build(data, request, tmp, time.perf_counter() - started))


def image_cache_path(
    source: str | Path, format: str = "auto", image_size: int | None = None, cache_dir: str | Path | None = None,
) -> Path:
    """The folder :func:`prepare_images` keeps the cache of this request in (whether built or not)."""
    name, format = resolve_source(source, format)
    return cache_root(cache_dir) / cache_name(image_request(name, format, image_size))


def _install(final: Path, request: dict[str, Any], rebuild: bool, fill: Callable[[Path], None]) -> ImageCache:
    """Build the cache with ``fill`` and open it. The files are hashed from disk, once, before the
    build is installed: later opens check the images' sizes only, so a file that does not read back
    as written must never be installed. On any failure (a bad image found mid-build) the cache root
    goes too, if made for it."""

    def build(tmp: Path) -> None:
        fill(tmp)
        try:
            ImageCache.open(tmp, request, verify=True)
        except CacheInvalid as exc:
            raise RunFailure(f"{exc}: the cache just written does not read back as written; check the disk") from None

    build_in_temporary(final, build, rebuild, remove_new_root=True)
    return ImageCache.open(final, request)


def _check_square(description: str, shape: tuple[int, ...]) -> None:
    """Refuse images that are not square: image caches hold square images."""
    if shape[0] != shape[1]:
        raise HeadwiseError(f"{description}: images are {shape[0]}x{shape[1]}, and image caches hold square images; "
                            "set image_size to resize and crop them")


def channel_stats(images: np.ndarray) -> tuple[list[float], list[float]]:
    """Per-channel mean and population std of uint8 ``[N, H, W, C]`` images in [0, 1] units,
    from exact per-channel histograms (float64, no rounding drift over millions of pixels)."""
    hists = np.zeros((images.shape[-1], 256), dtype=np.int64)
    for c in range(images.shape[-1]):
        for start in range(0, len(images), 8192):  # chunks keep the copy of a strided channel small
            hists[c] += np.bincount(images[start:start + 8192, ..., c].ravel(), minlength=256)
    return histogram_stats(hists)


def histogram_stats(hists: np.ndarray) -> tuple[list[float], list[float]]:
    """:func:`channel_stats` from per-channel histograms int64 ``[C, 256]`` of pixel values (which
    add up exactly, chunk by chunk)."""
    values = np.arange(256, dtype=np.float64) / 255.0
    means, stds = [], []
    for hist in hists:
        total = hist.sum()
        mean = float((hist * values).sum() / total)
        means.append(mean)
        stds.append(float(np.sqrt((hist * (values - mean) ** 2).sum() / total)))
    return means, stds


def _build(data: ImageData, request: dict[str, Any], tmp: Path, seconds: float) -> None:
    mean, std = channel_stats(data.train.images)
    images = {split: _write(tmp / f"{split}-images.u8", getattr(data, split).images) for split in SPLITS}
    labels = {split: getattr(data, split).labels for split in SPLITS}
    _write_rest(tmp, request, {"description": data.description, "source_format": data.format,
                               "shape": list(data.train.images.shape[1:]), "class_names": list(data.class_names),
                               "mean": mean, "std": std}, images, labels, seconds)


def _write_rest(
    tmp: Path, request: dict[str, Any], fields: dict[str, Any], images: dict[str, Any], labels: dict[str, np.ndarray],
    seconds: float,
) -> None:
    """Write the labels and ``meta.json`` of a build whose image files (their ``images`` records)
    are written; ``fields`` are the metadata before the splits. Flat training images are refused."""
    _check_not_flat(fields["description"], fields["mean"], fields["std"])
    splits = {
        split: {
            "count": len(labels[split]),
            "images": images[split],
            "labels": _write(tmp / f"{split}-labels.i64", labels[split].astype(_LABEL_DTYPE)),
            "class_counts": np.bincount(labels[split], minlength=len(fields["class_names"])).tolist(),
        }
        for split in SPLITS
    }
    ImageCache.write_meta(tmp, request, {**fields, "splits": splits}, seconds)


def _check_not_flat(description: str, mean: list[float], std: list[float]) -> None:
    """Refuse training images that are all one value in every channel: there is nothing to learn
    from them, and a model trained on them would only learn the class frequencies."""
    if not any(std):
        values = ", ".join(str(round(m * 255)) for m in mean)
        raise HeadwiseError(
            f"{description}: every training image is the same flat value ({values} in every pixel), "
            "so there is nothing to learn from: check the source"
        )


def _workers() -> int:
    if WORKERS is not None:
        return max(1, int(WORKERS))
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count() or 1
    return max(1, min(usable, MAX_WORKERS))


def _pool(workers: int) -> ProcessPoolExecutor:
    # fork on Linux: workers start at once, without importing headwise (and torch) again; they
    # only decode with Pillow and numpy
    context = multiprocessing.get_context("fork") if sys.platform == "linux" else None
    return ProcessPoolExecutor(max_workers=workers, mp_context=context)


def _build_stream(
    stream: ImageStream, request: dict[str, Any], tmp: Path, image_size: int | None, status: "_Status", started: float,
) -> None:
    total = stream.train.count + stream.test.count
    workers = _workers()
    pool = _pool(workers) if workers > 1 and total > CHUNK_SIZE else None
    shape: tuple[int, ...] | None = None
    hists: np.ndarray | None = None
    labels: dict[str, np.ndarray] = {}
    images: dict[str, dict[str, Any]] = {}
    done = 0
    try:
        for split, part in (("train", stream.train), ("test", stream.test)):
            labels[split] = np.empty(part.count, dtype=np.int64)
            at = 0
            with HashedFile(tmp / f"{split}-images.u8") as f:
                chunks = decode_split(part, image_size, CHUNK_SIZE, pool, ahead=2 * workers, stats=split == "train")
                for chunk, chunk_labels, hist in chunks:
                    if at == 0:  # the split's first image fixed the shape: check it before going on
                        if shape is None:
                            shape = chunk.shape[1:]
                            _check_square(stream.description(shape), shape)
                        else:
                            check_same_shape(stream.label, shape, chunk.shape[1:])
                    f.write(memoryview(np.ascontiguousarray(chunk)).cast("B"))
                    labels[split][at:at + len(chunk)] = chunk_labels
                    at += len(chunk)
                    if hist is not None:
                        hists = hist if hists is None else hists + hist
                    done += len(chunk)
                    status.update(f"{done:,} of {total:,} images")
                images[split] = f.finish()
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    assert shape is not None and hists is not None  # decode_split raises on an empty split
    classes = stream.classes(labels["train"], labels["test"])
    check_labels(stream.label, classes, labels["train"], labels["test"])
    mean, std = histogram_stats(hists)
    _write_rest(tmp, request, {"description": stream.description(shape), "source_format": stream.format,
                               "shape": list(shape), "class_names": list(classes), "mean": mean, "std": std},
                images, labels, time.perf_counter() - started)

