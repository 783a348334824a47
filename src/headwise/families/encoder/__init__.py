"""Encoders (Crammed BERT): masked-LM pretraining and GLUE fine-tuning.

- :mod:`~headwise.families.encoder.task`: ``[task] kind = "mlm"`` (registers the family), no torch;
  :mod:`~headwise.families.encoder.mlm_task`: ``MLMTask``; on the text tasks' config and task bases
  (:mod:`headwise.tasks.text`, :mod:`headwise.tasks.token_task`) and the shared token cache and
  masked vocabulary (:mod:`headwise.text`);
- :mod:`~headwise.families.encoder.masking`: packed ``[CLS] ... [SEP]`` rows, cramming's 80/10/10
  masking and the resumable stream;
- :mod:`~headwise.families.encoder.finetune`: ``[task] kind = "glue"`` (registers the family), no torch;
  :mod:`~headwise.families.encoder.glue_task`, the fine-tuning tasks (classification, STS-B's
  regression) scored over whole splits; :mod:`~headwise.families.encoder.glue`, the GLUE tasks
  and their reader; :mod:`~headwise.families.encoder.metrics`, their metrics and Table 1's
  columns; :mod:`~headwise.families.encoder.standin`, the offline stand-ins;
- :mod:`~headwise.families.encoder.model_parts` and :mod:`~headwise.families.encoder.model`: the
  output heads ``mlm`` (pretraining's decoder) and ``cls_pooler`` (fine-tuning's pooler), their
  declarations and their model code;
- :mod:`~headwise.families.encoder.presets`: the Crammed BERT presets;
- :mod:`~headwise.families.encoder.bench`: the ``encoder`` section of ``headwise bench``;
- :mod:`~headwise.families.encoder.report`: the ``encoder`` layout (Table 1);
- ``encoder.toml``: the built-in study (pretraining, then a fine-tuning stage per task).
"""

from headwise.families.encoder import finetune as finetune  # registers the glue family
from headwise.families.encoder import task as task  # registers the family
