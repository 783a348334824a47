"""LRA data: every task read from small files in its real layout to exact token ids and labels,
the sequence cache (reuse, verification, damage, rebuild) and one-line refusals of bad input."""

import json
import pickle
import struct

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from headwise.families.lra import listops as lo
from headwise.data.cache_files import CacheInvalid
from headwise.families.lra.pixels import grayscale, tf_grayscale
from headwise.families.lra.readers import load_lra
from headwise.families.lra.table import TASKS
from headwise.families.lra.cache import SequenceCache, prepare_sequences, sequence_request
from helpers import one_line_error

RNG = np.random.default_rng(0)


def byte_ids(text, limit=None):
    data = text.encode("utf-8")[:limit]
    return [b + 1 for b in data]


# --- fixtures in each task's layout --------------------------------------------------------------


LISTOPS_ROWS = {
    "train": [("[MAX 2 9 ]", 9), ("[SM 5 9 [MIN 3 4 ] ]", 7), ("[MED 3 8 0 9 ]", 5)],
    "val": [("[MIN 1 2 ]", 1)],
    "test": [("[SM 9 9 ]", 8), ("6", 6)],
}


def write_listops(folder, rows=LISTOPS_ROWS):
    folder.mkdir(parents=True, exist_ok=True)
    for split, samples in rows.items():
        lo.write_tsv(folder / f"basic_{split}.tsv", [(e.split(), label) for e, label in samples])
    return folder


IMDB = {
    "train": [("Great film!", 1), ("Awful.", 0), ("Très bien", 1), ("meh " * 10, 0), ("ok", 1)],
    "test": [("Bad", 0), ("Good", 1)],
    "unsupervised": [("no label", -1)],
}


def write_imdb_parquet(root, data=IMDB):
    folder = root / "plain_text"
    folder.mkdir(parents=True)
    for split, rows in data.items():
        table = pa.table({"text": [t for t, _ in rows], "label": pa.array([lab for _, lab in rows], pa.int64())})
        pq.write_table(table, folder / f"{split}-00000-of-00001.parquet")
    return root


AAN = {
    "train": [(1, "a", "b", "first abstract", "second one"), (0, "c", "d", "x", "yz"), (1, "e", "f", "é", "q")],
    "eval": [(0, "g", "h", "left", "right")],
    "test": [(1, "i", "j", "up", "down"), (0, "k", "l", "in", "out")],
}


def write_aan(folder, data=AAN, float_labels=True):
    folder.mkdir(parents=True, exist_ok=True)
    for split, rows in data.items():
        lines = [f"{float(lab) if float_labels else lab}\t{a}\t{b}\t{t1}\t{t2}" for lab, a, b, t1, t2 in rows]
        (folder / f"new_aan_pairs.{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def write_cifar10(root, n=6):
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    batches = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = RNG.integers(0, 256, (n, 3072), dtype=np.uint8)
        labels = [int(x) for x in RNG.integers(0, 10, n)]
        obj = {b"batch_label": name.encode(), b"labels": labels, b"data": data}
        (folder / name).write_bytes(pickle.dumps(obj, protocol=2))
        batches[name] = (data, labels)
    names = [f"c{i}".encode() for i in range(10)]
    (folder / "batches.meta").write_bytes(pickle.dumps({b"label_names": names}, protocol=2))
    return folder, batches


def write_pathfinder(root, per_file=(4, 6), size=32):
    """pathfinder32/curv_baseline/{imgs/<k>/sample_<i>.png, metadata/<k>.npy (text)}."""
    folder = root / "pathfinder32" / "curv_baseline"
    rows = []
    for k, count in enumerate(per_file):
        (folder / "imgs" / str(k)).mkdir(parents=True)
        lines = []
        for i in range(count):
            pixels = RNG.integers(0, 256, (size, size), dtype=np.uint8)
            Image.fromarray(pixels, mode="L").save(folder / "imgs" / str(k) / f"sample_{i}.png")
            label = int(RNG.integers(0, 2))
            lines.append(f"imgs/{k} sample_{i}.png 0 {label} 1 2 3")
            rows.append((pixels, label))
        (folder / "metadata").mkdir(exist_ok=True)
        (folder / "metadata" / f"{k}.npy").write_text("\n".join(lines) + "\n")
    return root / "pathfinder32", rows


def write_fashion(folder, n_train=20, n_test=4):
    folder.mkdir(parents=True)
    arrays = {
        "train-images-idx3-ubyte": RNG.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": (np.arange(n_train) % 10).astype(np.uint8),
        "t10k-images-idx3-ubyte": RNG.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": (np.arange(n_test) % 10).astype(np.uint8),
    }
    for name, a in arrays.items():
        (folder / name).write_bytes(bytes([0, 0, 8, a.ndim]) + struct.pack(f">{a.ndim}I", *a.shape) + a.tobytes())
    return arrays


# --- ListOps -------------------------------------------------------------------------------------


def test_listops_files_to_exact_ids(tmp_path):
    folder = write_listops(tmp_path / "lra_release" / "listops-1000")
    train = load_lra("listops", tmp_path / "lra_release").splits["train"]  # the parent of listops-1000 works
    assert len(train) == 3
    assert train.sequence(0).tolist() == [12, 3, 10, 15]  # [MAX 2 9 ]
    assert train.sequence(2).tolist() == [13, 4, 9, 1, 10, 15]
    assert train.labels.tolist() == [9, 7, 5]
    test = load_lra("listops", folder).splits["test"]
    assert test.sequence(1).tolist() == [7] and test.labels.tolist() == [8, 6]


def test_listops_generated_cache(tmp_path):
    cfg = {"variant": "short", "n_train": 200, "n_val": 30, "n_test": 30, "seed": 7}
    cache = prepare_sequences("listops", listops=cfg, cache_dir=tmp_path)
    assert (cache.vocab_size, cache.num_classes, cache.max_length, cache.pairs) == (16, 10, 100, False)
    assert cache.dtype == np.uint8
    assert [cache.num_examples(s) for s in ("train", "val", "test")] == [200, 30, 30]
    splits = lo.generate_splits(cfg)
    for i in (0, 17, 199):
        tokens, label = splits.train[i]
        assert cache.sequence("train", i).tolist() == lo.to_ids(tokens).tolist()
        assert cache.labels("train")[i] == label
    assert cache.lengths("test").tolist() == [len(t) for t, _ in splits.test]
    assert "generated" in cache.description and "seed 7" in cache.description
    again = prepare_sequences("listops", listops=cfg, cache_dir=tmp_path)
    assert again.path == cache.path
    other = prepare_sequences("listops", listops={**cfg, "seed": 8}, cache_dir=tmp_path)
    assert other.path != cache.path


# --- the cache: verification, damage, rebuild -----------------------------------------------------


def test_cache_damage_refused_then_rebuilt(tmp_path):
    cfg = {"variant": "short", "n_train": 50, "n_val": 5, "n_test": 5}
    cache = prepare_sequences("listops", listops=cfg, cache_dir=tmp_path)
    tokens = cache.path / "train-tokens.u8"
    data = bytearray(tokens.read_bytes())
    data[3] ^= 1
    tokens.write_bytes(bytes(data))
    message = one_line_error(prepare_sequences, "listops", listops=cfg, cache_dir=tmp_path, match="sha256")
    assert "rebuild" in message
    SequenceCache.open(cache.path, verify=False)  # sizes still match: only hashing finds it
    fixed = prepare_sequences("listops", listops=cfg, cache_dir=tmp_path, rebuild=True)
    assert fixed.path == cache.path
    (cache.path / "val-offsets.i64").write_bytes(b"\0" * 8)
    with pytest.raises(CacheInvalid, match="truncated"):
        SequenceCache.open(cache.path)
    (cache.path / "meta.json").unlink()
    with pytest.raises(CacheInvalid, match="missing"):
        SequenceCache.open(cache.path)
    prepare_sequences("listops", listops=cfg, cache_dir=tmp_path, rebuild=True)
    assert not list(tmp_path.glob(".*.tmp"))


def test_cache_checks_offsets_and_labels(tmp_path):
    cache = prepare_sequences("listops", listops={"variant": "short", "n_train": 20, "n_val": 3, "n_test": 3},
                              cache_dir=tmp_path)
    meta = json.loads((cache.path / "meta.json").read_text())
    labels = cache.path / "test-labels.i64"
    labels.write_bytes(np.array([1, 2, 11], dtype="<i8").tobytes())
    meta["splits"]["test"]["labels"]["sha256"] = __import__("hashlib").sha256(labels.read_bytes()).hexdigest()
    (cache.path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(CacheInvalid, match="labels reach 11"):
        SequenceCache.open(cache.path)


# --- Text ----------------------------------------------------------------------------------------


def test_imdb_parquet_bytes_truncated_and_val_carved(tmp_path):
    root = write_imdb_parquet(tmp_path / "imdb")
    data = load_lra("text", root, max_length=8, val_fraction=0.4, seed=3)
    train, val, test = (data.splits[s] for s in ("train", "val", "test"))
    assert (len(train), len(val), len(test)) == (3, 2, 2)
    assert data.vocab_size == 257 and data.num_classes == 2
    assert "carved" in data.description
    # every original training review is in train or val, exactly once, cut to 8 bytes
    got = sorted((tuple(s.sequence(i).tolist()), int(s.labels[i])) for s in (train, val) for i in range(len(s)))
    want = sorted((tuple(byte_ids(t, 8)), lab) for t, lab in IMDB["train"])
    assert got == want
    assert test.sequence(0).tolist() == byte_ids("Bad") and test.labels.tolist() == [0, 1]
    assert byte_ids("Très bien", 8) == [ord("T") + 1, ord("r") + 1, 0xC3 + 1, 0xA8 + 1, ord("s") + 1, 33, 99, 106]
    same = load_lra("text", root, max_length=8, val_fraction=0.4, seed=3)
    assert np.array_equal(same.splits["val"].tokens, val.tokens)


def test_imdb_jsonl_and_cache(tmp_path):
    folder = tmp_path / "imdb-jsonl"
    folder.mkdir()
    for split in ("train", "test"):
        with open(folder / f"{split}.jsonl", "w") as f:
            for text, label in IMDB[split]:
                f.write(json.dumps({"text": text, "label": label}) + "\n")
    cache = prepare_sequences("text", folder, max_length=4000, cache_dir=tmp_path / "cache")
    assert cache.dtype == np.uint16 and cache.max_length == 4000
    assert cache.num_examples("train") + cache.num_examples("val") == 5
    assert cache.sequence("test", 1).tolist() == byte_ids("Good")


def test_imdb_bad_labels_and_layout(tmp_path):
    bad = {"train": [("fine", 1), ("odd", 2)], "test": [("x", 0)]}
    message = one_line_error(load_lra, "text", write_imdb_parquet(tmp_path / "bad", bad), match="label 2")
    assert "2 classes" in message
    (tmp_path / "onlytrain" / "plain_text").mkdir(parents=True)
    pq.write_table(pa.table({"text": ["a"], "label": [0]}), tmp_path / "onlytrain" / "plain_text" / "train-0.parquet")
    one_line_error(load_lra, "text", tmp_path / "onlytrain", match="test-")
    one_line_error(load_lra, "text", tmp_path / "nowhere", match="not found")


def test_hub_offline_is_one_line(monkeypatch):
    import headwise.data.sources as sources

    monkeypatch.setattr(sources, "hub_offline", lambda: True)
    one_line_error(load_lra, "text", "stanfordnlp/imdb", match="cannot reach")


# --- Retrieval -----------------------------------------------------------------------------------


def test_aan_pairs(tmp_path):
    folder = write_aan(tmp_path / "lra_release" / "tsv_data")
    data = load_lra("retrieval", tmp_path / "lra_release", max_length=6)
    assert data.pairs and data.vocab_size == 257
    train = data.splits["train"]
    assert train.pair(0)[0].tolist() == byte_ids("first abstract", 6)
    assert train.pair(0)[1].tolist() == byte_ids("second one", 6)
    assert train.pair(2)[0].tolist() == byte_ids("é")
    assert train.labels.tolist() == [1, 0, 1]
    assert data.splits["val"].pair(0)[1].tolist() == byte_ids("right")
    cache = prepare_sequences("retrieval", folder, max_length=6, cache_dir=tmp_path / "cache")
    assert cache.pairs and cache.num_examples("test") == 2
    a, b = cache.pair("test", 1)
    assert a.tolist() == byte_ids("in") and b.tolist() == byte_ids("out")
    assert cache.lengths("train", second=True).tolist() == [6, 2, 1]
    # integer labels and a header line read the same
    other = write_aan(tmp_path / "ints", float_labels=False)
    header = other / "new_aan_pairs.test.tsv"
    header.write_text("label\tid1\tid2\ttext1\ttext2\n" + header.read_text())
    assert load_lra("retrieval", other).splits["test"].labels.tolist() == [1, 0]


def test_aan_bad_input(tmp_path):
    folder = write_aan(tmp_path / "aan")
    (folder / "new_aan_pairs.eval.tsv").unlink()
    one_line_error(load_lra, "retrieval", folder, match="new_aan_pairs.eval.tsv")
    folder = write_aan(tmp_path / "aan2")
    (folder / "new_aan_pairs.test.tsv").write_text("1.0\ta\tb\tonly three fields\n")
    one_line_error(load_lra, "retrieval", folder, match="line 1: 4 tab-separated fields")
    (folder / "new_aan_pairs.test.tsv").write_text("1.0\ta\tb\tx\ty\n2.0\ta\tb\tx\ty\n")
    one_line_error(load_lra, "retrieval", folder, match="line 2: label 2.0 is outside")


# --- Images --------------------------------------------------------------------------------------


def test_grayscale_is_pillows_L():
    rgb = RNG.integers(0, 256, (3, 17, 9, 3), dtype=np.uint8)
    rgb[0, 0, :3] = [[255, 255, 255], [0, 0, 0], [1, 2, 3]]
    expected = np.stack([np.asarray(Image.fromarray(a, "RGB").convert("L")) for a in rgb])
    assert np.array_equal(grayscale(rgb), expected)


def test_cifar_gray_pixels(tmp_path):
    _, batches = write_cifar10(tmp_path / "cifar")
    data = load_lra("image", tmp_path / "cifar", val_fraction=0.2)
    assert data.max_length == 1024 and data.vocab_size == 257 and data.num_classes == 10
    test = data.splits["test"]
    raw, labels = batches["test_batch"]
    rgb = raw.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    for i in range(len(labels)):
        gray = np.asarray(Image.fromarray(rgb[i], "RGB").convert("L")).astype(np.int64)
        assert test.sequence(i).tolist() == (gray.ravel() + 1).tolist()
    assert test.labels.tolist() == labels
    assert len(data.splits["train"]) + len(data.splits["val"]) == 30 and len(data.splits["val"]) == 6
    one_line_error(load_lra, "image", tmp_path / "cifar", max_length=1000, match="over max_length")


def test_tf_grayscale_hand_values():
    # tf.image.rgb_to_grayscale (LRA's CIFAR-10 pipeline): trunc(255.5 * (0.2989 R + 0.587 G + 0.114 B) / 255)
    # in float32; Pillow's L rounds (19595 R + 38470 G + 7471 B) / 2^16 instead
    cases = {  # rgb: (tf, Pillow)
        (0, 0, 0): (0, 0),
        (255, 255, 255): (255, 255),  # 0.9999 * 255.5 = 255.47
        (255, 0, 0): (76, 76),        # 76.37; Pillow 76.75 -> 76 (its shift floors after adding 0.5)
        (0, 255, 0): (149, 150),      # 149.98; Pillow 150.19
        (0, 0, 255): (29, 29),        # 29.13
        (1, 2, 3): (1, 2),            # 1.8186; Pillow 2.31
        (100, 150, 200): (141, 141),  # 141.02
    }
    rgb = np.array(list(cases), dtype=np.uint8).reshape(1, len(cases), 1, 3)
    assert tf_grayscale(rgb).ravel().tolist() == [tf for tf, _ in cases.values()]
    assert grayscale(rgb, "tf").ravel().tolist() == [tf for tf, _ in cases.values()]
    assert grayscale(rgb).ravel().tolist() == [pil for _, pil in cases.values()]
    # away from integer boundaries it is the exact rational value, floored
    pixels = RNG.integers(0, 256, (4000, 3)).astype(np.int64)
    num = (pixels * [2989, 5870, 1140]).sum(1) * 2555
    exact, rest = num // (10_000 * 10 * 255), num % (10_000 * 10 * 255) / (10_000 * 10 * 255)
    clear = (rest > 1e-4) & (rest < 1 - 1e-4)
    assert clear.mean() > 0.99
    assert np.array_equal(tf_grayscale(pixels.astype(np.uint8)[None, :, None])[0, :, 0][clear], exact[clear])


def test_lra_splits_of_text_validate_on_test(tmp_path):
    # lra_benchmarks/text_classification/input_pipeline.py: IMDb's test split is also its validation split
    root = write_imdb_parquet(tmp_path / "imdb")
    data = load_lra("text", root, max_length=8, splits="lra")
    train, val, test = (data.splits[s] for s in ("train", "val", "test"))
    assert [train.sequence(i).tolist() for i in range(len(train))] == [byte_ids(t, 8) for t, _ in IMDB["train"]]
    assert np.array_equal(val.tokens, test.tokens) and val.labels.tolist() == test.labels.tolist() == [0, 1]
    assert "val is the test split" in data.description


def test_lra_splits_of_images_cut_the_last_tenth_of_training_and_gray_as_tf(tmp_path):
    # lra_benchmarks/image/input_pipeline.py: train[:90%] / train[90%:] / test, tf.image.rgb_to_grayscale
    _, batches = write_cifar10(tmp_path / "cifar", n=6)
    data = load_lra("image", tmp_path / "cifar", splits="lra", grayscale="tf")
    raw = np.concatenate([batches[f"data_batch_{i}"][0] for i in range(1, 6)])
    labels = [lab for i in range(1, 6) for lab in batches[f"data_batch_{i}"][1]]
    rgb = raw.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    gray = tf_grayscale(rgb).reshape(30, -1).astype(np.int64) + 1
    train, val = data.splits["train"], data.splits["val"]
    assert (len(train), len(val)) == (27, 3)  # round(0.9 x 30)
    assert [train.sequence(i).tolist() for i in range(27)] == gray[:27].tolist()
    assert [val.sequence(i).tolist() for i in range(3)] == gray[27:].tolist()
    assert train.labels.tolist() + val.labels.tolist() == labels
    assert "LRA's train[90%:]" in data.description and "TF grayscale" in data.description
    # the tf weights differ from Pillow's somewhere in 6,144 random pixels
    pillow = load_lra("image", tmp_path / "cifar", splits="lra")
    assert not np.array_equal(pillow.splits["test"].tokens, data.splits["test"].tokens)
    # Fashion-MNIST (one channel) the same way, as LRA's MNIST pipeline
    write_fashion(tmp_path / "fashion", n_train=20)
    fashion = load_lra("fashion-mnist", tmp_path / "fashion", splits="lra", grayscale="tf")
    assert (len(fashion.splits["train"]), len(fashion.splits["val"])) == (18, 2)
    assert fashion.splits["val"].labels.tolist() == [8, 9]


def test_split_options_key_the_cache_only_when_asked(tmp_path):
    # the defaults leave a request (and so every existing cache's name) as it was
    plain = sequence_request("text", str(tmp_path))
    assert "splits" not in plain and "grayscale" not in plain
    lra = sequence_request("image", str(tmp_path), splits="lra", grayscale="tf")
    assert (lra["splits"], lra["grayscale"]) == ("lra", "tf")
    root = write_imdb_parquet(tmp_path / "imdb")
    carved = prepare_sequences("text", root, max_length=8, cache_dir=tmp_path / "c")
    theirs = prepare_sequences("text", root, max_length=8, cache_dir=tmp_path / "c", splits="lra")
    assert carved.path != theirs.path and theirs.num_examples("val") == 2 and theirs.num_examples("train") == 5
    one_line_error(load_lra, "text", root, splits="tfds", match="splits must be one of carved, lra")
    one_line_error(load_lra, "image", root, grayscale="luma", match="grayscale must be one of pillow, tf")
    write_fashion(tmp_path / "tiny", n_train=2)
    one_line_error(load_lra, "fashion-mnist", tmp_path / "tiny", splits="lra", match="too few for LRA's 90% / 10%")


def test_pathfinder_lra_layout(tmp_path):
    folder, rows = write_pathfinder(tmp_path, per_file=(4, 6))
    data = load_lra("pathfinder", folder)
    assert [len(data.splits[s]) for s in ("train", "val", "test")] == [8, 1, 1]
    everything = [data.splits[s].sequence(i).tolist() for s in ("train", "val", "test") for i in range(len(data.splits[s]))]
    assert everything == [(p.ravel().astype(int) + 1).tolist() for p, _ in rows]
    labels = np.concatenate([data.splits[s].labels for s in ("train", "val", "test")])
    assert labels.tolist() == [lab for _, lab in rows]
    assert data.max_length == 1024
    # a real .npy of the same rows reads the same
    meta = folder / "curv_baseline" / "metadata" / "1.npy"
    lines = meta.read_text().splitlines()
    meta.unlink()
    np.save(meta, np.array(lines))
    assert np.array_equal(load_lra("pathfinder", folder / "curv_baseline").splits["train"].tokens,
                          data.splits["train"].tokens)
    (folder / "curv_baseline" / "imgs" / "0" / "sample_2.png").unlink()
    one_line_error(load_lra, "pathfinder", folder, match="sample_2.png.*does not exist")


def test_pathfinder_skips_an_empty_image_of_the_release_with_a_count(tmp_path):
    # the real release has a 0-byte curv_baseline/imgs/0/sample_172.png; here 1 of 150 images
    folder, rows = write_pathfinder(tmp_path, per_file=(75, 75))
    (folder / "curv_baseline" / "imgs" / "0" / "sample_3.png").write_bytes(b"")
    said: list[str] = []
    data = load_lra("pathfinder", folder, status=said.append)
    kept = [r for i, r in enumerate(rows) if i != 3]
    assert sum(len(data.splits[s]) for s in ("train", "val", "test")) == 149
    labels = np.concatenate([data.splits[s].labels for s in ("train", "val", "test")])
    assert labels.tolist() == [lab for _, lab in kept]
    assert "1 empty or unreadable images skipped" in data.description
    warnings = [line for line in said if line.startswith("warning:")]
    assert len(warnings) == 1 and "imgs/0/sample_3.png" in warnings[0]
    # more than 1% bad: refused in one line
    for i in range(4, 6):
        (folder / "curv_baseline" / "imgs" / "0" / f"sample_{i}.png").write_bytes(b"not a png")
    one_line_error(load_lra, "pathfinder", folder, match="3 of 150 listed images are empty or unreadable")


def test_fashion_mnist_stand_in(tmp_path, monkeypatch):
    arrays = write_fashion(tmp_path / "fashion-mnist")
    monkeypatch.setenv("HEADWISE_DATA", str(tmp_path))
    cache = prepare_sequences("fashion-mnist", cache_dir=tmp_path / "cache", val_fraction=0.25)
    assert cache.max_length == 784 and cache.num_examples("val") == 5 and cache.num_examples("train") == 15
    assert cache.sequence("test", 2).tolist() == (arrays["t10k-images-idx3-ubyte"][2].ravel().astype(int) + 1).tolist()
    assert cache.labels("test").tolist() == [0, 1, 2, 3]
    assert "carved" in cache.description


# --- bad input -----------------------------------------------------------------------------------


def test_bad_input_one_line(tmp_path):
    assert "fashion-mnist" in TASKS
    one_line_error(load_lra, "music", match="unknown LRA task")
    one_line_error(load_lra, "listops", tmp_path / "missing", match="not found")
    folder = write_listops(tmp_path / "lo")
    (folder / "basic_val.tsv").unlink()
    one_line_error(load_lra, "listops", folder, match="lacks basic_val.tsv")
    folder = write_listops(tmp_path / "empty", {**LISTOPS_ROWS, "val": []})
    one_line_error(load_lra, "listops", folder, match="val split is empty")
    folder = write_listops(tmp_path / "long")
    one_line_error(load_lra, "listops", folder, max_length=5, match="over max_length 5")
    bad = write_listops(tmp_path / "bad")
    (bad / "basic_test.tsv").write_text("Source\tTarget\n( ( [MAX 2 ) 9 )\t9\n")
    one_line_error(prepare_sequences, "listops", bad, cache_dir=tmp_path / "c", match="line 2: malformed")
    one_line_error(prepare_sequences, "text", tmp_path, listops={"n_train": 3}, match="listops config")
    one_line_error(load_lra, "text", tmp_path, max_length=0, match="max_length")
