"""The nearest-neighbour target of Amsel, Yehudai & Bruna (ICLR 2025): vectors in, vectors out.

- :mod:`~headwise.families.nearest.task`: ``[task] kind = "nearest"`` (registers the family) and the
  "learned nothing" loss, no torch; :mod:`~headwise.families.nearest.nearest_task`: the task;
- :mod:`~headwise.families.nearest.presets`: the ``amsel-nn`` model preset;
- :mod:`~headwise.families.nearest.report`: the ``rank`` report layout (error vs rank per head);
- ``rank.toml``: the built-in study.
"""

from headwise.families.nearest import task as task  # registers the family
