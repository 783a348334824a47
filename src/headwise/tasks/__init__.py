"""What every task family shares: the interface a task gives the trainer
(:mod:`~headwise.tasks.base`), the family record and registry (:mod:`~headwise.tasks.family`),
classification loss and accuracy (:mod:`~headwise.tasks.classify`), the config and task bases of
the tasks on text, which tokenize it into a token cache (:mod:`~headwise.tasks.text`), and the
``[task]`` table (:mod:`~headwise.tasks.union`). The families themselves live in
:mod:`headwise.families`."""
