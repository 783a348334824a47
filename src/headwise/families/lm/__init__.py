"""Language modelling: TinyStories (or any text) tokenized into a verified token cache, packed
into blocks, next-token cross-entropy.

- :mod:`~headwise.families.lm.task`: ``LMTask`` and ``[task] kind = "lm"`` (registers the family);
- :mod:`~headwise.families.lm.data_plan`: what a data request resolves to (sources, hold-out);
- :mod:`~headwise.families.lm.tokenizer`: GPT-Neo's BPE and trained byte-level BPE;
- :mod:`~headwise.families.lm.token_cache`: verified uint16/uint32 token caches;
- :mod:`~headwise.families.lm.packing`: packed, resumable training blocks;
- :mod:`~headwise.families.lm.report_heads`, :mod:`~headwise.families.lm.report_depth`: the
  ``heads`` (the blog) and ``depth`` (Leaner Transformers) report layouts;
- :mod:`~headwise.families.lm.bench`: the tokenizer section of ``headwise bench``;
- ``progression.toml``, ``depth-for-heads.toml``: the built-in studies.
"""

from headwise.families.lm import task as task  # registers the family
