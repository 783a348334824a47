"""TinyStories samples that ship inside the package, so a clone with no data beside it and no
network runs the text quickstarts and the tests.

The samples are gzipped package data (``headwise/data/bundled/``, with their licence,
CDLA-Sharing-1.0, in ``LICENSE-TinyStories.txt``). Readers take plain files, so a sample is
unpacked once into the cache folder (``$HEADWISE_CACHE/.samples``: hidden, so ``headwise data
list`` does not take it for a cache) and checked against its SHA-256; a source named like a sample that is found nowhere else resolves to that file.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
from importlib.resources import files
from pathlib import Path

from headwise.data.cache_files import default_cache_dir
from headwise.errors import RunFailure

#: sample name -> (size in bytes, SHA-256) unpacked
SAMPLES = {
    "tinystories-train-sample.txt": (2_097_152, "5352b299dcb1a32898b2d779b145b5a05f3e1265953fd21c264c9f9f9c9ae33d"),
    "tinystories-valid-sample.txt": (794_375, "5fc1fb0113df62b567fb271806cd645ce8d75f59c58ca0b764c03d3b6ff34ca6"),
    "tinystories-tiny-fixture.txt": (3_794, "defaedb58bf28079f3e29c6142cb7f3568d331a577e0911c5d7925c465c50c43"),
}
LICENSE = "LICENSE-TinyStories.txt"


def samples_folder() -> Path:
    """Where the samples are unpacked: ``.samples`` in the cache folder (:func:`default_cache_dir`)."""
    return default_cache_dir() / ".samples"


def sample_path(name: str) -> Path | None:
    """The unpacked sample called ``name`` (unpacking it if needed), or None if no sample has that name."""
    if name not in SAMPLES:
        return None
    size, digest = SAMPLES[name]
    path = samples_folder() / name
    if path.is_file() and path.stat().st_size == size:
        return path  # hashed when it was written; the token cache keys on its size and mtime
    data = gzip.decompress(files("headwise.data").joinpath("bundled", f"{name}.gz").read_bytes())
    if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
        raise RunFailure(f"the bundled sample {name} is damaged (SHA-256 mismatch): reinstall headwise")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # written beside its place and moved in: a reader never sees half a file
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=path.parent)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        raise RunFailure(f"cannot unpack the bundled sample {name} into {path.parent}: {exc.strerror}; "
                         "set HEADWISE_CACHE to a writable folder") from None
    return path


def unpacked_samples() -> Path:
    """The folder holding every sample, unpacked: a stand-in for ``HEADWISE_DATA``'s TinyStories files."""
    for name in SAMPLES:
        sample_path(name)
    return samples_folder()
