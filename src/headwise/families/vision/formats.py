"""Image classification data from the formats it ships in, decoded into uint8 arrays.

- ``idx``: MNIST / Fashion-MNIST, four IDX files (gzipped or not) in one folder
- ``cifar``: torchvision's ``cifar-10-batches-py`` or ``cifar-100-python`` pickles (the folder or its parent)
- ``parquet``: the Hugging Face layout (``plain_text/train-00000-of-00001.parquet``, ...), an image
  column of PNG/JPEG bytes and a label column, class names from the files' ClassLabel metadata
- ``folder``: ImageNet-style ``train/<class>/*.png`` and ``val/<class>/`` (or ``test/``)
- ``hub``: a dataset on the Hugging Face hub (network needed)

This module resolves a source and tells its format, reads the formats decoded whole (IDX, CIFAR)
and holds :func:`read_images`: every reader returns the same :class:`ImageData`, uint8
``[N, H, W, C]`` images and int64 labels for a train and a test split. Bad input fails with one
:class:`HeadwiseError` line naming the file.

The formats stored image by image (parquet, class folders, hub) are listed and decoded in
:mod:`headwise.families.vision.streams`; :func:`open_stream` opens them as an ``ImageStream``.
"""

from __future__ import annotations

import gzip
import pickle
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from headwise.families.vision.streams import (
    _LOCAL_KINDS, ImageStream, StreamSplit, _fit, _folder_stream, _hub_stream, _parquet_stream, _shape,
    class_id, decode_split,
)
from headwise.data.cache_files import listing_identity
from headwise.data.sources import (
    HUB_NAME, data_root, find_local, first_line, hidden, hub_offline, hub_reachable, visible_files,
)
from headwise.errors import HeadwiseError

FORMATS = ("idx", "cifar", "parquet", "folder", "hub")
STREAM_FORMATS = frozenset({"parquet", "folder", "hub"})  # decoded image by image: see open_stream
FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)
IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
CIFAR10_FILES = {"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",), "meta": "batches.meta"}
CIFAR100_FILES = {"train": ("train",), "test": ("test",), "meta": "meta"}


@dataclass(frozen=True)
class ImageSplit:
    """One split: uint8 images ``[N, H, W, C]`` (C = 1 or 3) and int64 labels ``[N]``."""

    images: np.ndarray
    labels: np.ndarray


@dataclass(frozen=True)
class ImageData:
    """A decoded data set: both splits, the class names, the format read and a short description."""

    train: ImageSplit
    test: ImageSplit
    class_names: tuple[str, ...]
    format: str
    description: str


#: standard image sets by their local folder name -> the hub dataset read when no local copy is found
HUB_COPIES = {"fashion-mnist": "zalando-datasets/fashion_mnist"}


def resolve_source(source: str | Path, format: str = "auto") -> tuple[str, str]:
    """``(resolved path or hub name, format)``: an existing path as given, else a name under
    ``HEADWISE_DATA``, else a hub name ``owner/name`` (or the hub copy of a name in
    :data:`HUB_COPIES`: the vision presets' ``fashion-mnist`` with network and no local files);
    ``format`` "auto" is :func:`detect_format`."""
    if format != "auto" and format not in FORMATS:
        raise HeadwiseError(f"unknown image format {format!r}: use auto or one of {', '.join(FORMATS)}")
    local = find_local(str(source))
    if format == "hub" or (local is None and HUB_NAME.fullmatch(str(source))):
        return str(source), "hub"
    if local is None and str(source) in HUB_COPIES:
        hub = HUB_COPIES[str(source)]
        if hub_offline() or not hub_reachable():
            raise HeadwiseError(
                f"image source {str(source)!r} is not here and the Hugging Face hub cannot be reached to read {hub}: "
                f"set HEADWISE_DATA to a folder holding {source}/ (the original release's four IDX files), "
                "or run with network access"
            )
        return hub, "hub"
    if local is None:
        where = f" or under HEADWISE_DATA={data_root()}" if data_root() else " (HEADWISE_DATA is not set)"
        raise HeadwiseError(
            f"image source {str(source)!r} not found as a path{where}; give {_LOCAL_KINDS}, or a hub name like uoft-cs/cifar10"
        )
    return str(local), (detect_format(local) if format == "auto" else format)


def detect_format(source: str | Path) -> str:
    """The format of a local folder from the files it holds (a missing path shaped ``owner/name``
    is ``hub``); HeadwiseError when it cannot be told."""
    path = Path(source)
    if not path.exists():
        if HUB_NAME.fullmatch(str(source)):
            return "hub"
        raise HeadwiseError(f"image source {str(source)!r} does not exist: give {_LOCAL_KINDS}")
    if not path.is_dir():
        raise HeadwiseError(f"image source {path} is a file: give the folder holding the data ({_LOCAL_KINDS})")
    names = {p.name for p in path.iterdir()}
    if any(n.removesuffix(".gz") in IDX_FILES["train"] for n in names):
        return "idx"
    if _cifar_dir(path, must=False) is not None:
        return "cifar"
    if any(not hidden(p, path) for p in path.rglob("*.parquet")):
        return "parquet"
    if (path / "train").is_dir():
        return "folder"
    raise HeadwiseError(
        f"cannot tell the image format of {path}: it holds none of {_LOCAL_KINDS}; set format to one of {', '.join(FORMATS)}"
    )


def read_images(source: str | Path, format: str = "auto", image_size: int | None = None) -> ImageData:
    """Decode both splits of ``source`` (see :func:`resolve_source`). ``image_size`` None keeps the
    native size (all images must share it); else the shorter side is resized to it (bilinear)
    and the centre cropped to a square."""
    if image_size is not None and (not isinstance(image_size, int) or image_size < 1):
        raise HeadwiseError(f"image_size must be a positive whole number of pixels or None, not {image_size!r}")
    name, format = resolve_source(source, format)
    if format in STREAM_FORMATS:
        stream = open_stream(name, format)
        train, test = _gather(stream.train, image_size), _gather(stream.test, image_size)
        classes, label = stream.classes(train.labels, test.labels), stream.label
    else:
        readers = {"idx": _read_idx_folder, "cifar": _read_cifar}
        train, test, classes, label = readers[format](name, image_size)
        for split, what in ((train, "train"), (test, "test")):  # before any statistic divides by the count
            if len(split.labels) == 0:
                raise HeadwiseError(f"{name}: the {what} split holds no images; check the source")
    check_labels(label, classes, train.labels, test.labels)
    n, h, w, c = train.images.shape
    check_same_shape(label, train.images.shape[1:], test.images.shape[1:])
    desc = f"{label} ({format}, {n:,} + {len(test.labels):,} images {h}x{w}x{c})"
    return ImageData(train=train, test=test, class_names=tuple(classes), format=format, description=desc)


def check_labels(label: str, classes: tuple[str, ...], train: np.ndarray, test: np.ndarray) -> None:
    """HeadwiseError naming the first split with a label outside ``classes``."""
    for labels, what in ((train, "train"), (test, "test")):
        if len(labels) and (labels.min() < 0 or labels.max() >= len(classes)):
            bad = int(labels.max() if labels.max() >= len(classes) else labels.min())
            raise HeadwiseError(
                f"{label}: {what} label {bad} is outside the {len(classes)} classes (0..{len(classes) - 1})"
            )


def check_same_shape(label: str, train: tuple[int, ...], test: tuple[int, ...]) -> None:
    """HeadwiseError when the test images' ``(H, W, C)`` differs from the training images'."""
    if tuple(test) != tuple(train):
        h, w, c = train
        raise HeadwiseError(
            f"{label}: test images are {_shape(tuple(test))} but train images {h}x{w}x{c}; "
            "set image_size to resize them all"
        )


def open_stream(source: str | Path, format: str = "auto") -> ImageStream:
    """List (not decode) a source of the formats stored image by image (``STREAM_FORMATS``):
    its files or rows, counts and class names; a hub dataset is loaded (downloaded) here."""
    name, format = resolve_source(source, format)
    openers = {"parquet": _parquet_stream, "folder": _folder_stream, "hub": _hub_stream}
    if format not in openers:
        raise HeadwiseError(f"{name} is {format} data, decoded whole: read it with read_images")
    return openers[format](name)


def source_identity(source: str | Path, format: str = "auto") -> dict[str, Any]:
    """What identifies a source for cache keys: its resolved path and format and each input file
    with size and mtime (a digest of them past 64 files); a hub dataset by its name."""
    name, format = resolve_source(source, format)
    if format == "hub":
        return {"format": "hub", "name": name}
    return listing_identity(format, Path(name), visible_files(Path(name)))


def _gather(split: StreamSplit, image_size: int | None) -> ImageSplit:
    """A whole split decoded into memory (small data; the cache streams instead)."""
    images: np.ndarray | None = None
    labels = np.empty(split.count, dtype=np.int64)
    at = 0
    for chunk, chunk_labels, _ in decode_split(split, image_size):
        if images is None:
            images = np.empty((split.count, *chunk.shape[1:]), dtype=np.uint8)
        images[at:at + len(chunk)] = chunk
        labels[at:at + len(chunk)] = chunk_labels
        at += len(chunk)
    assert images is not None  # decode_split raises on an empty split
    return ImageSplit(images, labels)


def _resize_array(images: np.ndarray, image_size: int | None) -> np.ndarray:
    """:func:`_fit` over an already decoded ``[N, H, W, C]`` array (IDX, CIFAR)."""
    from PIL import Image

    if image_size is None or images.shape[1:3] == (image_size, image_size):
        return np.ascontiguousarray(images)
    gray = images.shape[3] == 1
    out = np.empty((len(images), image_size, image_size, images.shape[3]), dtype=np.uint8)
    for i, a in enumerate(images):
        img = Image.fromarray(a[..., 0] if gray else a, mode="L" if gray else "RGB")
        r = np.asarray(_fit(img, image_size))
        out[i] = r[..., None] if gray else r
    return out


# --- IDX ------------------------------------------------------------------------------------


def read_idx(path: str | Path) -> np.ndarray:
    """One IDX file of uint8 (gzipped or not, told by its magic bytes): its array, checked
    against its header (magic, dtype, dimensions and payload length)."""
    path = Path(path)
    try:
        data = path.read_bytes()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
    except FileNotFoundError:
        raise HeadwiseError(f"IDX file {path} does not exist") from None
    except (OSError, EOFError, zlib.error) as exc:  # a cut or damaged .gz
        raise HeadwiseError(
            f"IDX file {path} is not a readable gzip file ({first_line(exc)}): download it again"
        ) from None
    if len(data) < 4 or data[:2] != b"\0\0":
        raise HeadwiseError(f"{path} is not an IDX file (bad magic {data[:4].hex() or 'empty'}, expected 0000 08 0N)")
    if data[2] != 0x08:
        raise HeadwiseError(f"IDX file {path} holds dtype 0x{data[2]:02x}; headwise reads uint8 (0x08) only")
    ndim = data[3]
    if not 1 <= ndim <= 4 or len(data) < 4 + 4 * ndim:
        raise HeadwiseError(f"IDX file {path} has a bad header ({ndim} dimensions in {len(data)} bytes)")
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    expected = int(np.prod(dims, dtype=np.int64))
    actual = len(data) - 4 - 4 * ndim
    if actual != expected:
        what = "truncated" if actual < expected else "has trailing bytes"
        raise HeadwiseError(
            f"IDX file {path} is {what}: its header {dims} needs {expected:,} data bytes, it holds {actual:,}"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def _idx_file(folder: Path, name: str) -> Path:
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    raise HeadwiseError(f"IDX folder {folder} lacks {name} (or {name}.gz): it needs the four MNIST-style files")


def _read_idx_folder(name: str, image_size: int | None):
    folder = Path(name)
    splits = []
    for split, (images_name, labels_name) in IDX_FILES.items():
        images_path, labels_path = _idx_file(folder, images_name), _idx_file(folder, labels_name)
        images, labels = read_idx(images_path), read_idx(labels_path)
        if images.ndim != 3:
            raise HeadwiseError(f"IDX file {images_path} has {images.ndim} dimensions, images need 3 (N, H, W)")
        if 0 in images.shape[1:]:
            raise HeadwiseError(f"IDX file {images_path} holds images of {_shape(images.shape[1:])} pixels (empty)")
        if labels.ndim != 1:
            raise HeadwiseError(f"IDX file {labels_path} has {labels.ndim} dimensions, labels need 1")
        if len(images) != len(labels):
            raise HeadwiseError(
                f"{images_path.name} holds {len(images):,} images but {labels_path.name} {len(labels):,} labels"
            )
        splits.append(ImageSplit(_resize_array(images[..., None], image_size), labels.astype(np.int64)))
    if "fashion" in folder.name.lower():
        classes = FASHION_MNIST_CLASSES
    else:  # plain MNIST: digits, as many as the labels reach
        classes = tuple(str(i) for i in range(int(max(s.labels.max(initial=0) for s in splits)) + 1))
    return splits[0], splits[1], classes, folder.name


# --- CIFAR pickles --------------------------------------------------------------------------


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles plain data and numpy arrays only: a CIFAR batch needs nothing else, and a
    pickle naming any other callable could run code."""

    _ALLOWED = {
        # bytes(): how Python 3 writes empty bytes at protocol 2 (Python 2 wrote "_codecs.encode")
        ("_codecs", "encode"), ("__builtin__", "bytes"), ("builtins", "bytes"),
        ("numpy", "ndarray"), ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"it refers to {module}.{name}, which a CIFAR batch never holds")
        return super().find_class(module, name)


def _load_pickle(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise HeadwiseError(f"CIFAR folder {path.parent} lacks {path.name}")
    try:
        with open(path, "rb") as f:
            obj = _ArrayUnpickler(f, encoding="latin1").load()
    except Exception as exc:  # pickle raises many types for damaged input
        raise HeadwiseError(f"CIFAR file {path} is not a readable batch pickle: {first_line(exc)}") from None
    if not isinstance(obj, dict):
        raise HeadwiseError(f"CIFAR file {path} holds a {type(obj).__name__}, not a dict")
    # Python 2 pickles come back with str or bytes keys depending on how they were written.
    return {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in obj.items()}


def _cifar_dir(path: Path, must: bool = True) -> tuple[Path, dict] | None:
    for folder in (path, path / "cifar-10-batches-py", path / "cifar-100-python"):
        if (folder / "batches.meta").is_file() or (folder / "data_batch_1").is_file():
            return folder, CIFAR10_FILES
        if (folder / "meta").is_file() and (folder / "train").is_file():
            return folder, CIFAR100_FILES
    if must:
        raise HeadwiseError(
            f"{path} is not a CIFAR folder: expected cifar-10-batches-py (data_batch_1..5, test_batch, "
            "batches.meta) or cifar-100-python (train, test, meta), or their parent"
        )
    return None


def _read_cifar(name: str, image_size: int | None):
    folder, files = _cifar_dir(Path(name))  # type: ignore[misc]
    fine = files is CIFAR100_FILES
    meta = _load_pickle(folder / files["meta"])
    names_key = "fine_label_names" if fine else "label_names"
    if names_key not in meta:
        raise HeadwiseError(f"CIFAR file {folder / files['meta']} has no {names_key!r}")
    if not isinstance(meta[names_key], (list, tuple)) or not meta[names_key]:
        raise HeadwiseError(f"CIFAR file {folder / files['meta']} holds {names_key} as {_brief(meta[names_key])}: "
                            "expected a list of class names")
    classes = tuple(n.decode("latin1") if isinstance(n, bytes) else str(n) for n in meta[names_key])
    splits = []
    for split in ("train", "test"):
        images, labels = [], []
        for file in files[split]:
            batch = _load_pickle(folder / file)
            key = "fine_labels" if fine else "labels"
            if "data" not in batch or key not in batch:
                raise HeadwiseError(f"CIFAR file {folder / file} lacks 'data' or {key!r}")
            ids = _cifar_labels(batch[key], f"CIFAR file {folder / file}", key)
            data = batch["data"]
            if (not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072
                    or len(data) != len(ids)):
                raise HeadwiseError(
                    f"CIFAR file {folder / file} holds data as {_brief(data)} for {len(ids)} labels; "
                    "expected a uint8 array [N, 3072]"
                )
            # Each row is 1024 red, 1024 green, 1024 blue values, each a 32x32 row-major plane.
            images.append(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
            labels.append(ids)
        splits.append(ImageSplit(_resize_array(np.concatenate(images), image_size), np.concatenate(labels)))
    return splits[0], splits[1], classes, folder.name


def _cifar_labels(values: Any, where: str, key: str) -> np.ndarray:
    """A batch's labels (a list, or a 1-D array, of class ids) as int64."""
    if isinstance(values, np.ndarray) and values.ndim == 1 and values.dtype.kind in "iub":
        return values.astype(np.int64)
    if not isinstance(values, (list, tuple, np.ndarray)) or (isinstance(values, np.ndarray) and values.ndim != 1):
        raise HeadwiseError(f"{where} holds {key} as {_brief(values)}: expected a list of class ids")
    return np.array([class_id(v, f"{where} {key}[{i}]") for i, v in enumerate(values)], dtype=np.int64)


def _brief(value: Any) -> str:
    """A value's type and shape (or its first characters), for a message."""
    if isinstance(value, np.ndarray):
        return f"{value.dtype} array {value.shape}"
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__} of {len(value)}" + (f" {type(value[0]).__name__}" if value else "")
    return f"{type(value).__name__} {repr(value)[:40]}"
