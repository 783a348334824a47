"""Encoders (Crammed BERT): masked-LM pretraining and GLUE fine-tuning.

- :mod:`~headwise.families.encoder.task`: ``MLMTask`` and ``[task] kind = "mlm"`` (registers the
  family), on the lm family's text sources and token caches;
- :mod:`~headwise.families.encoder.masking`: the vocabulary with ``[PAD] [CLS] [SEP] [MASK]``,
  packed ``[CLS] ... [SEP]`` rows, cramming's 80/10/10 masking and the resumable stream;
- :mod:`~headwise.families.encoder.finetune`: ``[task] kind = "glue"`` (registers the family; its
  output head ``cls_pooler`` is in :mod:`headwise.model.outputs`); :mod:`~headwise.families.encoder.glue_task`, the fine-tuning
  tasks (classification, STS-B's regression) scored over whole splits;
  :mod:`~headwise.families.encoder.standin`, the offline stand-ins;
- :mod:`~headwise.families.encoder.report`: the ``encoder`` layout (Table 1);
- ``encoder.toml``: the built-in study (pretraining, then a fine-tuning stage per task).
"""

from headwise.families.encoder import finetune as finetune  # registers the glue family
from headwise.families.encoder import task as task  # registers the family
