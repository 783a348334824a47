"""A sweep of bad inputs on the image surfaces: ``headwise train`` on an image config and
``headwise data prepare | info | verify``, as a new user would drive them.

Each case checks what every sweep checks (:mod:`bad_input_harness`): the exit status (2 for bad
input, 1 for a damaged cache found by ``data verify``), one line on stderr naming what is wrong,
no traceback, nothing on disk changed or lost, and for bad input no new file (no cache folder,
no run folder). The sources are written once into a module-scoped folder (``world``), one per
kind of damage: degenerate data (an empty split, flat images, 0x0 images), labels that parse as
numbers but are no class ids (``nan``, ``inf``, ``1.5``, negative, out of range) in each format
with labels, containers whose parts have the wrong type, unreadable shards, and damaged caches.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bad_input_harness import Case, c, run_case, snapshot
from headwise.cli import main
from test_image_data import idx_bytes, png, random_rgb, write_cifar10, write_folder, write_idx_folder

# A ViT small enough to train a step in a moment; the task's source is set per case.
IMAGE_RUN = ('[model]\npreset = "vit-tiny-28"\nd_model = 16\nn_layers = 1\nheads = [2]\n'
             '[task]\nkind = "images"\nsource = "{source}"\n{extra}'
             '[train]\nsteps = 1\nmicro_batch = 4\n[eval]\nevery = 0\n')


def write_config(root: Path, name: str, source: str, extra: str = "") -> None:
    (root / f"{name}.toml").write_text(IMAGE_RUN.format(source=source, extra=extra))


def patch_pickle(path: Path, **changes) -> None:
    """Set keys of a CIFAR pickle (bytes keys, as the release's) and write it back at protocol 2."""
    obj = pickle.loads(path.read_bytes(), encoding="bytes")
    obj.update({k.encode(): v for k, v in changes.items()})
    path.write_bytes(pickle.dumps(obj, protocol=2))


def cifar(root: Path, name: str, n: int = 4, **batch1) -> Path:
    """A two-class CIFAR-10 folder under ``root/name``; ``batch1`` replaces keys of data_batch_1."""
    folder, _ = write_cifar10(root / name, n=n, label_names=("x", "y"), labels=[0, 1, 1, 0][:n])
    if batch1:
        patch_pickle(folder / "data_batch_1", **batch1)
    return folder


def parquet(root: Path, name: str, train_labels=(0, 1, 1, 0), image=None) -> Path:
    """A parquet folder of four 8x8 PNGs per split (image column ``image``, label column ``label``)."""
    folder = root / name
    folder.mkdir()
    images = image if image is not None else [{"bytes": png(a), "path": None} for a in random_rgb(4, 8, 8)]
    pq.write_table(pa.table({"image": images, "label": list(train_labels)}), folder / "train-00000-of-00001.parquet")
    tests = [{"bytes": png(a), "path": None} for a in random_rgb(4, 8, 8)]
    pq.write_table(pa.table({"image": tests, "label": [0, 1, 1, 0]}), folder / "test-00000-of-00001.parquet")
    return folder


def write_sources(root: Path) -> None:
    """One source (and one config naming it) per case that trains on it."""
    from headwise.families.vision.cache import prepare_images

    # degenerate data
    write_idx_folder(root / "idx-no-train", gz=False, n_train=0, n_test=4, size=(8, 8), classes=4)
    write_idx_folder(root / "idx-no-test", gz=False, n_train=8, n_test=0, size=(8, 8), classes=4)
    write_idx_folder(root / "idx-0px", gz=False, n_train=8, n_test=4, size=(0, 0), classes=4)
    write_idx_folder(root / "idx-flat", gz=False, n_train=8, n_test=4, size=(8, 8), classes=4)
    for name, n in (("train-images-idx3-ubyte", 8), ("t10k-images-idx3-ubyte", 4)):
        (root / "idx-flat" / name).write_bytes(idx_bytes(np.full((n, 8, 8), 7, np.uint8)))
    flat = [np.zeros((6, 6, 3), np.uint8)] * 2
    write_folder(root / "folder-flat", {"train": {"a": flat, "b": flat}, "val": {"a": random_rgb(1, 6, 6)}})
    cifar(root, "cifar-empty", n=0)
    # labels that parse as numbers but are no class ids, per format
    cifar(root, "cifar-frac", labels=[0, 1.5, 1, 0])
    cifar(root, "cifar-nan", labels=[0, float("nan"), 1, 0])
    cifar(root, "cifar-inf", labels=[0, 1, float("inf"), 0])
    cifar(root, "cifar-negative", labels=[0, -1, 1, 0])
    cifar(root, "cifar-array-frac", labels=np.array([0.0, 1.0, 0.5, 1.0]))
    folder = root / "cifar100-range" / "cifar-100-python"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    for split in ("train", "test"):
        batch = {b"data": rng.integers(0, 256, (4, 3072), dtype=np.uint8), b"fine_labels": [0, 1, 2, 0]}
        (folder / split).write_bytes(pickle.dumps(batch, protocol=2))
    (folder / "meta").write_bytes(pickle.dumps({b"fine_label_names": [b"a", b"b"]}, protocol=2))
    parquet(root, "pq-frac", train_labels=[0, 1.5, 1, 0])
    parquet(root, "pq-inf", train_labels=[0.0, 1.0, float("inf"), 0.0])
    parquet(root, "pq-nan", train_labels=[0.0, float("nan"), 1.0, 0.0])
    parquet(root, "pq-negative", train_labels=[0, 1, -3, 0])
    parquet(root, "pq-names", train_labels=["cat", "dog", "cat", "dog"])
    write_idx_folder(root / "idx-float-labels", gz=False, n_train=4, n_test=4, size=(8, 8), classes=2)
    float_labels = b"\0\0\x0d\x01" + (4).to_bytes(4, "big") + np.array([0, 1.5, 1, 0], ">f4").tobytes()
    (root / "idx-float-labels" / "train-labels-idx1-ubyte").write_bytes(float_labels)
    write_idx_folder(root / "fashion-range", gz=False, n_train=4, n_test=4, size=(8, 8), classes=4)
    (root / "fashion-range" / "train-labels-idx1-ubyte").write_bytes(idx_bytes(np.array([0, 11, 2, 3])))
    # containers whose parts have the wrong type or shape
    cifar(root, "cifar-labels-int", labels=3)
    cifar(root, "cifar-labels-str", labels="0110")
    cifar(root, "cifar-labels-2d", labels=[[0], [1], [1], [0]])
    cifar(root, "cifar-data-list", data=np.zeros((4, 3072), np.uint8).tolist())
    cifar(root, "cifar-data-shape", data=np.zeros((4, 1024), np.uint8))
    cifar(root, "cifar-names-int")
    patch_pickle(root / "cifar-names-int" / "cifar-10-batches-py" / "batches.meta", label_names=5)
    cifar(root, "cifar-names-empty")
    patch_pickle(root / "cifar-names-empty" / "cifar-10-batches-py" / "batches.meta", label_names=[])
    batch = cifar(root, "cifar-cut") / "test_batch"
    batch.write_bytes(batch.read_bytes()[:200])
    (cifar(root, "cifar-zero-bytes") / "data_batch_3").write_bytes(b"")
    (parquet(root, "pq-test-text") / "test-00000-of-00001.parquet").write_text("label,image\n0,x\n")
    (parquet(root, "pq-test-empty") / "test-00000-of-00001.parquet").write_bytes(b"")
    (parquet(root, "pq-second-shard") / "train-00001-of-00002.parquet").write_text("not parquet")
    parquet(root, "pq-label-list", train_labels=[[0], [1], [1], [0]])
    parquet(root, "pq-image-int", image=[1, 2, 3, 4])
    for name in [p.name for p in root.iterdir() if p.is_dir()]:
        write_config(root, name, name)
    # a good source and its cache, and caches damaged in each way (each in its own cache folder)
    write_idx_folder(root / "imgs", gz=False, n_train=8, n_test=4, size=(8, 8), classes=4)
    write_config(root, "imgs", "imgs")
    prepare_images(root / "imgs", cache_dir=root / "cache")
    for name, damage in (("cut", _cut), ("edited", _edit_std), ("flipped", _flip), ("label", _flip_label)):
        shutil.copytree(root / "imgs", root / f"imgs-{name}")
        built = prepare_images(root / f"imgs-{name}", cache_dir=root / f"cache-{name}")
        damage(built.path)
        write_config(root, f"imgs-{name}", f"imgs-{name}", extra=f'cache_dir = "cache-{name}"\n')
    write_config(root, "holdout", "imgs", extra="holdout = 8\n")


def _cut(path: Path) -> None:
    images = path / "train-images.u8"
    images.write_bytes(images.read_bytes()[:-64])


def _edit_std(path: Path) -> None:
    meta = json.loads((path / "meta.json").read_text())
    meta["std"] = [0.0]  # a run would divide by it
    (path / "meta.json").write_text(json.dumps(meta, indent=2))


def _flip(path: Path) -> None:
    with open(path / "test-images.u8", "r+b") as f:
        f.seek(17)
        byte = f.read(1)
        f.seek(17)
        f.write(bytes([byte[0] ^ 0xFF]))


def _flip_label(path: Path) -> None:
    """Change the first training label in place to the next of the 4 classes: the same size and
    still a class id, so only the labels' sha256 can tell (a run would learn from a wrong label)."""
    labels = np.fromfile(path / "train-labels.i64", dtype="<i8")
    labels[0] = (labels[0] + 1) % 4
    labels.tofile(path / "train-labels.i64")


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bad-image-inputs")
    (root / "empty").mkdir()
    (root / "notes.txt").write_text("not a cache\n")
    write_sources(root)
    return root


def train(source: str, *, says: tuple[str, ...] | str = (), code: int = 2, id: str | None = None) -> Case:
    """``headwise train <source>.toml --out new-run`` (the config naming that source)."""
    return c(id or f"train-{source}", "train", f"{source}.toml", "--out", "new-run", code=code, says=says)


CASES = [
    # degenerate data: no run folder and no cache may be left, and no NaN statistic cached
    train("idx-no-train", says=("idx-no-train", "train split holds no images")),
    train("idx-no-test", says=("idx-no-test", "test split holds no images")),
    train("cifar-empty", says="train split holds no images"),
    train("idx-0px", says=("train-images-idx3-ubyte", "0x0")),
    train("idx-flat", says=("same flat value", "7 in every pixel", "check the source")),
    c("prepare-folder-flat", "data", "prepare", "--config", "folder-flat.toml", says=("folder-flat", "flat value")),
    # labels that parse as numbers but are no class ids
    train("cifar-frac", says=("data_batch_1", "labels[1]", "1.5", "not a class id")),
    train("cifar-nan", says=("data_batch_1", "nan", "not a class id")),
    train("cifar-inf", says=("data_batch_1", "inf", "not a class id")),
    train("cifar-negative", says=("train label -1", "outside the 2 classes")),
    train("cifar-array-frac", says=("labels[2]", "0.5", "not a class id")),
    train("cifar100-range", says=("train label 2", "outside the 2 classes")),
    train("pq-frac", says=("train-00000-of-00001.parquet row 1", "1.5", "not a class id")),
    train("pq-inf", says=("row 2", "inf", "not a class id")),
    train("pq-nan", says=("row 1", "nan", "not a class id")),
    train("pq-negative", says=("train label -3", "outside")),
    train("pq-names", says=("row 0", "'cat'", "not a class id")),
    train("idx-float-labels", says=("train-labels-idx1-ubyte", "dtype 0x0d", "uint8")),
    train("fashion-range", says=("label 11", "outside the 10 classes")),
    # containers whose parts have the wrong type or shape; unreadable and empty files
    train("cifar-labels-int", says=("data_batch_1", "labels as int 3", "list of class ids")),
    train("cifar-labels-str", says=("labels as str '0110'", "list of class ids")),
    train("cifar-labels-2d", says=("labels[0]", "[0]", "not a class id")),
    train("cifar-data-list", says=("data_batch_1", "data as list", "uint8 array [N, 3072]")),
    train("cifar-data-shape", says=("data as uint8 array (4, 1024)", "[N, 3072]")),
    train("cifar-names-int", says=("batches.meta", "label_names as int 5", "list of class names")),
    train("cifar-names-empty", says=("batches.meta", "label_names as list of 0", "list of class names")),
    train("cifar-cut", says=("test_batch", "not a readable batch pickle")),
    train("cifar-zero-bytes", says=("data_batch_3", "not a readable batch pickle")),
    train("pq-test-text", says=("test-00000-of-00001.parquet", "not a readable parquet file")),
    train("pq-test-empty", says=("test-00000-of-00001.parquet", "not a readable parquet file")),
    train("pq-second-shard", says=("train-00001-of-00002.parquet", "not a readable parquet file")),
    train("pq-label-list", says=("row 0", "[0]", "not a class id")),
    train("pq-image-int", says=("row 0", "cannot be decoded")),
    train("empty", says=("cannot tell the image format", "empty")),
    train("holdout", says=("task.holdout = 8", "hold out fewer")),
    # damaged caches: refused at a run start in one line naming the file and the fix
    train("imgs-cut", says=("train-images.u8", "truncated", "--rebuild")),
    train("imgs-edited", says=("meta.json", "digest", "--rebuild")),
    # a label flipped in place (same size, still a class id): the labels are hashed on every open
    train("imgs-label", says=("train-labels.i64", "does not match its recorded sha256", "--rebuild")),
    c("prepare-flipped-label", "data", "prepare", "--config", "imgs-label.toml",
      says=("train-labels.i64", "corrupted", "--rebuild", "delete the folder")),
    # data prepare / info with options that do not apply to an image config
    c("prepare-image-config-tokenizer", "data", "prepare", "--config", "imgs.toml", "--tokenizer", "bpe:300",
      says=("images", "--tokenizer", "text")),
    c("prepare-image-config-source", "data", "prepare", "x.txt", "--config", "imgs.toml", says=("SOURCE", "[task]")),
    c("info-image-config-validation", "data", "info", "--config", "imgs.toml", "--validation", "fraction:0.1",
      says="--validation"),
    c("prepare-image-config-cache-dir-file", "data", "prepare", "--config", "imgs.toml", "--cache-dir", "notes.txt",
      says=("notes.txt", "is a file")),
    # data verify: bad arguments (exit 2), then damage found (exit 1)
    c("verify-missing", "data", "verify", "nowhere", says=("nowhere", "does not exist", "headwise data list")),
    c("verify-a-file", "data", "verify", "notes.txt", says=("notes.txt", "is a file")),
    c("verify-not-a-cache", "data", "verify", "imgs", says=("imgs", "not a cache folder", "meta.json")),
    c("verify-the-cache-root", "data", "verify", "cache", says=("folder of caches", "--cache-dir cache")),
    c("verify-both", "data", "verify", "imgs", "--cache-dir", "cache", says=("--cache-dir", "not both")),
    c("verify-no-caches", "data", "verify", "--cache-dir", "empty", says=("empty", "no caches to verify")),
    c("verify-cache-dir-missing", "data", "verify", "--cache-dir", "nowhere", says=("nowhere", "does not exist")),
    c("verify-cache-dir-file", "data", "verify", "--cache-dir", "notes.txt", says=("notes.txt", "is a file")),
    c("verify-truncated", "data", "verify", "--cache-dir", "cache-cut", code=1, says=("train-images.u8", "--rebuild")),
    c("verify-edited-meta", "data", "verify", "--cache-dir", "cache-edited", code=1, says=("digest", "--rebuild")),
    c("verify-flipped-byte", "data", "verify", "--cache-dir", "cache-flipped", code=1,
      says=("test-images.u8", "does not match its recorded sha256", "--rebuild")),
]


@pytest.mark.parametrize("case", [pytest.param(k, id=k.id) for k in CASES])
def test_bad_image_input(case: Case, world: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("HEADWISE_CACHE", str(world / "cache"))
    monkeypatch.delenv("HEADWISE_DATA", raising=False)
    run_case(case, world, monkeypatch, capsys, leftovers=("new-run",))


def test_case_ids_are_distinct() -> None:
    ids = [k.id for k in CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 25


def test_a_byte_flipped_in_place_passes_a_run_start(world: Path, monkeypatch, capsys) -> None:
    """The documented trade-off, from the command line: the flipped cache ``verify-flipped-byte``
    refuses still trains (its sizes, metadata and labels are intact; only the images' sha256 could
    tell), and the files are left as they were."""
    monkeypatch.chdir(world)
    before = snapshot(world / "cache-flipped")
    try:
        assert main(["train", "imgs-flipped.toml", "--out", "new-run"]) == 0
    finally:
        shutil.rmtree(world / "new-run", ignore_errors=True)
    assert snapshot(world / "cache-flipped") == before
    capsys.readouterr()
