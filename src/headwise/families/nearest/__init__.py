"""The nearest-neighbour target of Amsel, Yehudai & Bruna (ICLR 2025): vectors in, vectors out.

- :mod:`~headwise.families.nearest.task`: the task and ``[task] kind = "nearest"`` (registers the family);
- :mod:`~headwise.families.nearest.presets`: the ``amsel-nn`` model preset;
- :mod:`~headwise.families.nearest.report`: the ``rank`` report layout (error vs rank per head);
- ``rank.toml``: the built-in study.
"""

from headwise.families.nearest import task as task  # registers the family
