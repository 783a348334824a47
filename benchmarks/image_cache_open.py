"""How long opening an image cache takes (what every run start does) against hashing all of it
(``headwise data verify``), at a size you choose.

    python3 benchmarks/image_cache_open.py [--gb 3] [--dir /tmp] [--repeats 5] [--keep] [--out result.json]

It writes ``--gb`` GB of random 256 x 256 grayscale images as an IDX folder (MNIST's layout;
written block by block, so the source never sits in memory), builds its image cache with
``prepare_images`` (the real build: decoded, written, hashed once from disk before it is
installed; IDX is decoded whole, so the build holds the images in memory once), then times the
cheap open (``ImageCache.open``: the metadata's digest, every file's size, the labels' sha256
and class ids; the best of ``--repeats``) and the full verification
(``ImageCache.open(verify=True)``: every file's sha256, once). Everything lives in a temporary folder under ``--dir``, removed at the end unless
``--keep``. Check the free space first (``df -h /tmp``): the source and the cache take about
twice ``--gb``.

The files were just written, so the verification reads them from the page cache when they fit
in memory: its time is then sha256's speed on this machine, a lower bound for a cache that has to
come from disk.
"""

from __future__ import annotations

import json
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from headwise.errors import OneLineParser, guarded
from headwise.families.vision.cache import ImageCache, prepare_images

SIDE = 256  # pixels: one image is 64 KiB
BLOCK_IMAGES = 256  # images generated and written at a time (16 MiB)


def write_idx(path: Path, count: int, side: int, rng: np.random.Generator, labels: bool = False) -> None:
    """An uncompressed IDX file of ``count`` random uint8 images ``side`` x ``side`` (or, with
    ``labels``, ``count`` labels 0..9), written a block at a time."""
    dims = (count,) if labels else (count, side, side)
    with open(path, "wb") as f:
        f.write(bytes([0, 0, 8, len(dims)]) + struct.pack(f">{len(dims)}I", *dims))
        for start in range(0, count, BLOCK_IMAGES):
            n = min(BLOCK_IMAGES, count - start)
            block = rng.integers(0, 10 if labels else 256, (n,) if labels else (n, side, side), dtype=np.uint8)
            f.write(block.tobytes())


@guarded("image_cache_open")
def main(argv: list[str] | None = None) -> int:
    """Time the open and the verification, print them (and write them to ``--out``)."""
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=3.0, help="size of the training images (GB, 1e9 bytes; default 3)")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the temporary folder goes (default /tmp)")
    parser.add_argument("--repeats", type=int, default=5, help="cheap opens timed (the best is kept)")
    parser.add_argument("--keep", action="store_true", help="keep the source and the cache")
    parser.add_argument("--out", help="also write the result as JSON here")
    args = parser.parse_args(argv)
    if args.gb <= 0 or args.repeats < 1:
        parser.error("--gb must be positive and --repeats at least 1")
    if not Path(args.dir).is_dir():
        parser.error(f"--dir {args.dir} is not a folder")
    work = Path(tempfile.mkdtemp(dir=args.dir, prefix="headwise-image-cache-open-"))
    try:
        rng = np.random.default_rng(0)
        train = max(1, round(args.gb * 1e9 / SIDE**2))
        test = max(1, train // 100)
        source = work / "random-images"
        source.mkdir()
        write_idx(source / "train-images-idx3-ubyte", train, SIDE, rng)
        write_idx(source / "train-labels-idx1-ubyte", train, SIDE, rng, labels=True)
        write_idx(source / "t10k-images-idx3-ubyte", test, SIDE, rng)
        write_idx(source / "t10k-labels-idx1-ubyte", test, SIDE, rng, labels=True)
        started = time.perf_counter()
        cache = prepare_images(source, cache_dir=work / "cache")
        build = time.perf_counter() - started
        size = sum(f.stat().st_size for f in cache.path.iterdir())
        opens = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            ImageCache.open(cache.path)
            opens.append(time.perf_counter() - started)
        started = time.perf_counter()
        ImageCache.open(cache.path, verify=True)
        verify = time.perf_counter() - started
        result = {
            "cache_bytes": size, "train_images": train, "test_images": test, "image": f"{SIDE}x{SIDE}x1",
            "build_s": round(build, 3), "open_s": round(min(opens), 6), "open_all_s": [round(t, 6) for t in opens],
            "verify_s": round(verify, 3),
            "verify_gb_per_s": round(size / verify / 1e9, 3), "speedup": round(verify / min(opens), 1),
        }
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"cache of {size / 1e9:.2f} GB ({train:,} + {test:,} images {SIDE}x{SIDE}): built in {build:.1f} s; "
          f"open {min(opens) * 1e3:.2f} ms (best of {args.repeats}); full verify {verify:.2f} s "
          f"({size / verify / 1e9:.2f} GB/s), {verify / min(opens):,.0f}x the open"
          + (f"; kept in {work}" if args.keep else ""))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
