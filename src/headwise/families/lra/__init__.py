"""Long Range Arena sequence classification (Nystromformers, as Leaner Transformers runs them).

- :mod:`~headwise.families.lra.task`: ``[task] kind = "lra"`` (registers the family), no torch;
  :mod:`~headwise.families.lra.sequence_task`: ``SequenceTask``;
- :mod:`~headwise.families.lra.table`: the task table, one row of facts per LRA task;
- :mod:`~headwise.families.lra.sequences`: what every reader produces (splits, packing, checks);
- :mod:`~headwise.families.lra.readers`: each LRA task's files read into token sequences;
- :mod:`~headwise.families.lra.pixels`: the pixel-sequence tasks (image, pathfinder, fashion-mnist);
- :mod:`~headwise.families.lra.listops`: the ListOps generator;
- :mod:`~headwise.families.lra.cache`: the verified sequence cache;
- :mod:`~headwise.families.lra.model_parts` and :mod:`~headwise.families.lra.model`: Retrieval's
  pair models, the ``token_pairs`` front end and ``pair_classes`` head (declarations, model code);
- :mod:`~headwise.families.lra.report`: the ``lra`` report layout;
- ``lra.toml``: the built-in study.
"""

from headwise.families.lra import task as task  # registers the family
