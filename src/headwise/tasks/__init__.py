"""What every task family shares: the interface a task gives the trainer
(:mod:`~headwise.tasks.base`), the family record and registry (:mod:`~headwise.tasks.family`),
classification loss and accuracy (:mod:`~headwise.tasks.classify`) and the ``[task]`` table
(:mod:`~headwise.tasks.union`). The families themselves live in :mod:`headwise.families`."""
