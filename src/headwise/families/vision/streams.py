"""The image formats stored image by image (Hugging Face parquet, ImageNet-style class folders,
hub data sets), listed first and decoded after.

Each opener lists a resolved source into an :class:`ImageStream`: both splits as a
:class:`StreamSplit` (a count and the rows ``(image, label, where)``, nothing decoded), the class
names, the format and a label. :func:`decode_split` decodes a split chunk by chunk, in order,
optionally on a process pool: the image cache is built from it without ever holding a whole split
in memory (ImageNet at 224 px is ~193 GB of uint8). Source resolution, format detection and the
formats decoded whole (IDX, CIFAR) are in :mod:`headwise.families.vision.formats`, whose
``open_stream`` picks the opener here.
"""

from __future__ import annotations

import io
import json
import re
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from headwise.data.sources import first_line, hidden, hub_call, hub_offline, hub_reachable, read_parquet
from headwise.errors import HeadwiseError

DECODE_CHUNK = 128  # images per chunk of decode_split (a unit of work for one process)
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"})
_SPLIT_FILE = re.compile(r"^(train|test|validation|valid|val)(?=[-_.])", re.IGNORECASE)
_GRAY_MODES = frozenset({"1", "L", "LA", "I", "I;16", "F"})
_LOCAL_KINDS = "an IDX folder, a CIFAR pickle folder, a Hugging Face parquet folder or train/ and val/ class folders"


@dataclass(frozen=True)
class StreamSplit:
    """One split still to decode: ``count`` rows ``(image, label, where)`` from ``rows()``, in
    order; ``image`` is raw bytes, a ``{"bytes", "path"}`` struct or a file path, ``where`` names
    the row in messages and ``what`` the split."""

    count: int
    what: str
    rows: Callable[[], Iterator[tuple[Any, Any, str]]]


@dataclass(frozen=True)
class ImageStream:
    """A data set of the formats stored image by image, listed but not decoded: both splits, the
    class names (None: told by the labels once decoded), the format and a short label."""

    train: StreamSplit
    test: StreamSplit
    class_names: tuple[str, ...] | None
    format: str
    label: str

    def classes(self, train_labels: np.ndarray, test_labels: np.ndarray) -> tuple[str, ...]:
        """The class names: as listed, else ``"0"`` up to the largest label of either split."""
        if self.class_names is not None:
            return self.class_names
        top = max(train_labels.max(initial=0), test_labels.max(initial=0))
        return tuple(str(i) for i in range(int(top) + 1))

    def description(self, shape: tuple[int, ...]) -> str:
        """As :attr:`ImageData.description`, once the image shape ``(H, W, C)`` is known."""
        h, w, c = shape
        return f"{self.label} ({self.format}, {self.train.count:,} + {self.test.count:,} images {h}x{w}x{c})"


# --- listing (parquet, class folders, hub) -------------------------------------------------


def _split_of(stem: str) -> str | None:
    m = _SPLIT_FILE.match(stem)
    return None if m is None else {"valid": "validation", "val": "validation"}.get(m[1].lower(), m[1].lower())


def _parquet_stream(name: str) -> ImageStream:
    import pyarrow.parquet as pq

    root = Path(name)
    shards: dict[str, list[Path]] = {}
    for p in sorted(p for p in root.rglob("*.parquet") if not hidden(p, root)):
        if (split := _split_of(p.name)) is not None:
            shards.setdefault(split, []).append(p)
    parents = sorted({str(p.parent) for files in shards.values() for p in files})
    if len(parents) > 1:
        raise HeadwiseError(
            f"{root} holds parquet splits in several folders ({', '.join(parents[:3])}): point the source at one"
        )
    test_split = "test" if "test" in shards else "validation"
    if "train" not in shards or test_split not in shards:
        found = ", ".join(sorted(shards)) or "none"
        raise HeadwiseError(
            f"parquet folder {root} needs train-*.parquet and test-*.parquet (or validation-*) files; found {found}"
        )
    schema = read_parquet(shards["train"][0], pq.read_schema)
    image_col, label_col = _columns(schema.names, str(shards["train"][0]))
    classes = _parquet_class_names(schema, label_col)

    def rows(files: list[Path]) -> Iterator[tuple[Any, Any, str]]:
        for f in files:
            try:
                i = 0  # the row within the file, across its batches
                for batch in pq.ParquetFile(f).iter_batches(columns=[image_col, label_col], batch_size=1024):
                    for img, label in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist()):
                        yield img, label, f"{f.name} row {i}"
                        i += 1
            except HeadwiseError:
                raise
            except Exception as exc:
                raise HeadwiseError(
                    f"{f} is not a readable parquet file with columns {image_col}, {label_col}: {first_line(exc)}"
                ) from None

    def count(files: list[Path]) -> int:  # every shard is opened (its footer read) before decoding starts
        return sum(read_parquet(f, pq.ParquetFile).metadata.num_rows for f in files)

    return ImageStream(
        train=StreamSplit(count(shards["train"]), f"{root} train", lambda: rows(shards["train"])),
        test=StreamSplit(count(shards[test_split]), f"{root} {test_split}", lambda: rows(shards[test_split])),
        class_names=classes,
        format="parquet",
        label=root.name,
    )


def _columns(names: Iterable[str], where: str) -> tuple[str, str]:
    names = list(names)
    image = next((c for c in ("img", "image") if c in names), None)
    label = next((c for c in ("label", "fine_label", "labels") if c in names), None)
    if image is None or label is None:
        raise HeadwiseError(
            f"{where} needs an image column (img or image) and a label column (label or fine_label); "
            f"it has {', '.join(names)}"
        )
    return image, label


def _parquet_class_names(schema: Any, label_col: str) -> tuple[str, ...] | None:
    """ClassLabel names from the ``huggingface`` schema metadata ``datasets`` writes, if any."""
    raw = (schema.metadata or {}).get(b"huggingface")
    try:
        names = json.loads(raw)["info"]["features"][label_col]["names"]
        return tuple(str(n) for n in names)
    except (TypeError, KeyError, ValueError):
        return None


def _folder_stream(name: str) -> ImageStream:
    root = Path(name)
    train_dir = root / "train"
    test_dir = next((root / s for s in ("val", "test", "validation") if (root / s).is_dir()), None)
    if not train_dir.is_dir() or test_dir is None:
        raise HeadwiseError(
            f"class-folder source {root} needs train/<class>/ and val/<class>/ (or test/<class>/) folders"
        )
    classes = tuple(sorted(p.name for p in train_dir.iterdir() if p.is_dir() and not p.name.startswith(".")))
    if not classes:
        raise HeadwiseError(f"{train_dir} holds no class folders")
    index = {c: i for i, c in enumerate(classes)}
    splits = []
    for folder in (train_dir, test_dir):  # listed (and checked) before any image is decoded
        files: list[tuple[str, int]] = []  # strings: an ImageNet listing is 1.28M of them
        for cls in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
            if cls.name not in index:
                raise HeadwiseError(
                    f"class folder {cls} is not among the training classes ({train_dir}): every class needs training images"
                )
            found = sorted(
                p for p in cls.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith(".")
            )
            if not found:
                raise HeadwiseError(f"class folder {cls} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
            files += [(str(p), index[cls.name]) for p in found]
        if not files:
            raise HeadwiseError(f"{folder} holds no class folders")
        splits.append(StreamSplit(len(files), str(folder), lambda files=files: ((p, label, p) for p, label in files)))
    return ImageStream(train=splits[0], test=splits[1], class_names=classes, format="folder", label=root.name)


def _hub_stream(name: str) -> ImageStream:
    import datasets

    # A local folder in the hub's layout needs no network; a hub name fails at once offline
    # instead of after datasets' half-minute of retries.
    if not Path(name).exists() and (hub_offline() or not hub_reachable()):
        raise HeadwiseError(
            f"cannot reach the Hugging Face hub to load {name!r} (offline?); give a local folder instead "
            f"({_LOCAL_KINDS}), as a path or a name under HEADWISE_DATA"
        )
    dd = hub_call(name, datasets.load_dataset)
    test_split = "test" if "test" in dd else "validation"
    if "train" not in dd or test_split not in dd:
        raise HeadwiseError(f"dataset {name!r} needs train and test (or validation) splits; it has {', '.join(dd)}")
    image_col, label_col = _columns(dd["train"].column_names, f"dataset {name!r}")
    feature = dd["train"].features[label_col]
    classes = tuple(feature.names) if hasattr(feature, "names") else None
    splits = []
    for split in ("train", test_split):
        # Undecoded, the image column is the same {"bytes", "path"} struct as in parquet files.
        ds = dd[split].cast_column(image_col, datasets.Image(decode=False))
        rows = lambda ds=ds, split=split: (  # noqa: E731
            (r[image_col], r[label_col], f"{name} {split} row {i}") for i, r in enumerate(ds)
        )
        splits.append(StreamSplit(len(ds), f"dataset {name!r} {split}", rows))
    return ImageStream(train=splits[0], test=splits[1], class_names=classes, format="hub", label=name)


# --- decoding ------------------------------------------------------------------------------


def decode_split(
    split: StreamSplit,
    image_size: int | None,
    chunk_size: int = DECODE_CHUNK,
    executor: Any = None,
    ahead: int = 1,
    stats: bool = False,
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
    """Decode ``split`` chunk by chunk, in order: ``(images uint8 [k, H, W, C], labels int64 [k],
    per-channel histograms int64 [C, 256] or None)``; image ``i`` of the split is always row ``i``.

    The split's first image fixes the channels (and, without ``image_size``, the size) of all;
    ``image_size`` resizes the shorter side (bilinear) and crops the centre square. The first
    chunk is decoded here; the others on ``executor`` (a ``concurrent.futures`` executor, up to
    ``ahead`` chunks in flight) when given. Errors are raised in row order, as a serial decode
    would: the first bad row's, and a failure to read rows only after the rows before it.
    """
    n, rows = split.count, iter(split.rows())
    taken, deferred = 0, None

    def take() -> list[tuple[Any, Any, str]]:
        nonlocal taken, deferred
        chunk: list[tuple[Any, Any, str]] = []
        if deferred is None:
            try:
                while len(chunk) < chunk_size:
                    row = next(rows, None)
                    if row is None:
                        break
                    if taken >= n:
                        raise HeadwiseError(
                            f"{row[2]}: more images than the {n:,} counted (the files changed while being read)"
                        )
                    chunk.append(row)
                    taken += 1
            except HeadwiseError as exc:  # raised once the rows before it are decoded
                deferred = exc
        return chunk

    first = take()
    if first:
        images, labels, hist, mode, where = _decode_chunk(first, None, None, "", image_size, stats)
        yield images, labels, hist
        shape, pending = images.shape[1:], deque()
        while True:
            while len(pending) < max(1, ahead) and (chunk := take()):
                args = (chunk, mode, shape, where, image_size, stats)
                pending.append(executor.submit(_decode_chunk, *args) if executor is not None else args)
            if not pending:
                break
            done = pending.popleft()
            images, labels, hist, _, _ = _decode_chunk(*done) if isinstance(done, tuple) else done.result()
            yield images, labels, hist
    if deferred is not None:
        raise deferred
    if taken != n or taken == 0:
        what = split.what
        raise HeadwiseError(f"{what}: expected {n:,} images, read {taken:,}" if n else f"{what} holds no images")


def _decode_chunk(
    rows: list[tuple[Any, Any, str]],
    mode: str | None,
    shape: tuple[int, ...] | None,
    first: str,
    image_size: int | None,
    stats: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, str, str]:
    """Decode consecutive rows of a split (in a worker process, or here): the images, labels and
    (``stats``) histograms, with the channel ``mode`` and ``first`` row, which ``mode`` None (the
    split's first chunk) takes from its first row."""
    from PIL import Image

    images: np.ndarray | None = None
    labels = np.empty(len(rows), dtype=np.int64)
    for i, (value, label, where) in enumerate(rows):
        if isinstance(value, dict):
            data, path = value.get("bytes"), value.get("path")
            value = data if data is not None else path
        if value is None:
            raise HeadwiseError(f"{where}: the image is missing (neither bytes nor a path)")
        try:
            img = Image.open(io.BytesIO(value) if isinstance(value, (bytes, bytearray)) else value)
            img.load()
        except Exception as exc:  # Pillow raises UnidentifiedImageError, OSError, SyntaxError, ...
            raise HeadwiseError(f"{where}: the image cannot be decoded ({first_line(exc)})") from None
        own = "L" if img.mode in _GRAY_MODES else "RGB"
        if mode is None:
            mode, first = own, where
        elif own != mode and image_size is None:
            raise HeadwiseError(
                f"{where} is {own} but {first} is {mode}: images of mixed channels; "
                "set image_size to convert and resize them all"
            )
        array = np.asarray(_fit(img.convert(mode), image_size))
        array = array[..., None] if array.ndim == 2 else array
        if shape is None:
            shape = array.shape
        elif array.shape != shape:
            raise HeadwiseError(
                f"{where} is {_shape(array.shape)} but {first} is {_shape(shape)}: images of mixed sizes; "
                "set image_size to resize them"
            )
        if images is None:
            images = np.empty((len(rows), *shape), dtype=np.uint8)
        images[i] = array
        labels[i] = class_id(label, where)
    assert images is not None and mode is not None  # rows is never empty
    hist = None
    if stats:  # per chunk, in the worker: summed, they are exactly the histograms of the split
        hist = np.stack([np.bincount(images[..., c].ravel(), minlength=256) for c in range(images.shape[-1])])
        hist = hist.astype(np.int64)
    return images, labels, hist, mode, first


def class_id(value: Any, where: str) -> int:
    """A label as a class id: a whole number, given as an integer (or bool), a float holding one
    (``3.0``) or its digits (``"3"``); anything else (``1.5``, ``nan``, ``inf``, ``"cat"``, None, a
    list) is a HeadwiseError naming ``where``. Whether it is one of the classes is checked after."""
    number = None
    whole_float = isinstance(value, (float, np.floating)) and np.isfinite(value) and float(value).is_integer()
    if whole_float or isinstance(value, (int, np.integer, np.bool_)):
        number = int(value)
    elif isinstance(value, (str, bytes)):
        try:
            number = int(value)
        except ValueError:
            pass
    if number is None or not -(2**63) <= number < 2**63:  # int64, as labels are stored
        shown = value.item() if isinstance(value, np.generic) else value
        raise HeadwiseError(f"{where}: label {shown!r} is not a class id (a whole number)")
    return number


def _shape(shape: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in shape)


def _fit(img: Any, image_size: int | None) -> Any:
    """Resize the shorter side to ``image_size`` (bilinear) and crop the centre square."""
    from PIL import Image

    if image_size is None or img.size == (image_size, image_size):
        return img
    w, h = img.size
    scale = image_size / min(w, h)
    nw, nh = max(image_size, round(w * scale)), max(image_size, round(h * scale))
    img = img.resize((nw, nh), Image.BILINEAR)
    left, top = (nw - image_size) // 2, (nh - image_size) // 2
    return img.crop((left, top, left + image_size, top + image_size))
