"""What every task family shares: the interface a task gives the trainer
(:mod:`~headwise.tasks.base`), the family record and registry (:mod:`~headwise.tasks.family`),
classification loss and accuracy (:mod:`~headwise.tasks.classify`), the config base of the tasks
on text, which tokenize it into a token cache (:mod:`~headwise.tasks.text`), the base of their
tasks (:mod:`~headwise.tasks.token_task`) and the ``[task]`` table (:mod:`~headwise.tasks.union`).
The families themselves live in :mod:`headwise.families`."""
