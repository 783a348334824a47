"""headwise and the Hugging Face ecosystem, in one package (``transformers`` is imported only by
the modules that need it, never by training):

- :mod:`~headwise.hf.gpt_neo`, :mod:`~headwise.hf.vit`, :mod:`~headwise.hf.llama`,
  :mod:`~headwise.hf.laguna`, :mod:`~headwise.hf.openelm`: exact conversion to and from
  ``GPTNeoForCausalLM``, ``ViTForImageClassification``, ``LlamaForCausalLM`` /
  ``Qwen3ForCausalLM``, ``LagunaForCausalLM`` and OpenELM for the specs they express, each one
  :class:`~headwise.hf.convert.Architecture` record (the fields it maps and fixes, config both
  ways, the weight layout; one generic check refuses every other field away from its default),
  all of them in :mod:`~headwise.hf.architectures`;
- :mod:`~headwise.hf.models`: every spec as a ``transformers`` model (``HeadwiseConfig``,
  ``HeadwiseFor...``; importing it registers the Auto classes);
- :mod:`~headwise.hf.tokenizer`: a run's tokenizer as a ``transformers`` tokenizer;
  :mod:`~headwise.hf.masked_tokenizer`: a masked-LM run's, ``[PAD] [CLS] [SEP] [MASK]`` in front;
- :mod:`~headwise.hf.export` and :mod:`~headwise.hf.card`: ``headwise export``, a folder that loads
  without headwise, with its model card; :mod:`~headwise.hf.native`: the native classes it writes,
  which :mod:`~headwise.hf.importer` (``headwise convert``) reads back into a run directory;
- :mod:`~headwise.hf.evaluation`: lm-evaluation-harness on a run (``headwise eval``).
"""
