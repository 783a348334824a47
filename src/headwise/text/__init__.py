"""Text that several task families share (language modelling, masked-LM pretraining, GLUE
fine-tuning): tokenizers, data requests, token caches, packed blocks and the masked LM's
vocabulary. It sits below the families and imports none of them; the ``[task]`` and task bases
of the tasks on text are :mod:`headwise.tasks.text` and :mod:`headwise.tasks.token_task`.

- :mod:`~headwise.text.tokenizer`: GPT-Neo's BPE and trained byte-level BPEs;
- :mod:`~headwise.text.data_plan`: what a text data request resolves to (sources, subset, hold-out);
- :mod:`~headwise.text.token_cache`: verified uint16/uint32 token caches, built once per request;
- :mod:`~headwise.text.packing`: packed, resumable training blocks of a token cache;
- :mod:`~headwise.text.masked_vocab`: a tokenizer's ids behind ``[PAD] [CLS] [SEP] [MASK]``.
"""
