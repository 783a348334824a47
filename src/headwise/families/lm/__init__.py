"""Language modelling: TinyStories (or any text) tokenized into a verified token cache, packed
into blocks, next-token cross-entropy. The tokenizers, caches and packing are the shared text
layer's (:mod:`headwise.text`), the ``[task]`` and task bases those of every task on text
(:mod:`headwise.tasks.text`, :mod:`headwise.tasks.token_task`).

- :mod:`~headwise.families.lm.task`: ``[task] kind = "lm"`` (registers the family; a ``[task]``
  table without ``kind`` is this one), no torch; :mod:`~headwise.families.lm.lm_task`: ``LMTask``;
- :mod:`~headwise.families.lm.presets`: the GPT-Neo model presets (the blog's, TinyStories-33M,
  Leaner Transformers' GPT-2 pair, a tiny CPU model);
- :mod:`~headwise.families.lm.report_heads`, :mod:`~headwise.families.lm.report_depth`,
  :mod:`~headwise.families.lm.report_prune`: the ``heads`` (the blog), ``depth`` (Leaner
  Transformers) and ``prune`` (pruned heads per layer) report layouts;
- :mod:`~headwise.families.lm.bench`: the ``tokenize`` section of ``headwise bench``;
- ``progression.toml``, ``depth-for-heads.toml``, ``kv-heads.toml``, ``prune.toml``: the built-in studies;
  ``search-progression.toml``, ``search-depth-for-heads.toml``, ``search-kv-heads.toml``: the
  built-in searches (:mod:`headwise.search`).
"""

from headwise.families.lm import task as task  # registers the family
