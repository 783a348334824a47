"""What the task families share of data: batches, sources and hub access, cache files, shuffling.

- :mod:`~headwise.data.batch`: ``Batch`` and ``BatchStream``, what every task gives the trainer;
- :mod:`~headwise.data.sources`: local files and folders, hub datasets, ``$HEADWISE_DATA``;
- :mod:`~headwise.data.bundled`: the TinyStories samples shipped in the package (``bundled/``);
- :mod:`~headwise.data.cache_files`: a verified cache folder's metadata, manifest and atomic install;
- :mod:`~headwise.data.shuffled`: per-epoch shuffled batches of stored examples.

Text (tokenizers, token caches, packing) is :mod:`headwise.text`; each family's own readers and
caches live in its folder (:mod:`headwise.families`).
"""

from headwise.data.batch import Batch, BatchStream
from headwise.data.sources import Source, open_source

__all__ = ["Batch", "BatchStream", "Source", "open_source"]
