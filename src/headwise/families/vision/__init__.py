"""Image classification with ViTs: images decoded once into a verified uint8 cache, class logits out.

- :mod:`~headwise.families.vision.task`: ``[task] kind = "images"`` and its augmentation tables
  (registers the family), no torch; :mod:`~headwise.families.vision.image_task`: ``ImageTask``;
- :mod:`~headwise.families.vision.formats`: IDX and CIFAR pickles, and which reader a source needs;
- :mod:`~headwise.families.vision.streams`: HF parquet, class folders and hub datasets, decoded in chunks;
- :mod:`~headwise.families.vision.cache`: the verified uint8 image cache;
- :mod:`~headwise.families.vision.augment`: seeded crop and flip;
- :mod:`~headwise.families.vision.randaugment`: timm's RandAugment on kornia's operations;
- :mod:`~headwise.families.vision.mixing`: mixup, CutMix and label smoothing (soft targets);
- :mod:`~headwise.families.vision.presets`: the ViT model presets;
- :mod:`~headwise.families.vision.report`: the ``vision`` report layout;
- :mod:`~headwise.families.vision.bench`: the ``vision`` section of ``headwise bench``;
- ``vit.toml``: the built-in study.
"""

from headwise.families.vision import task as task  # registers the family
