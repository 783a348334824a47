"""The model: a transformer whose layers each have their own head count and head width.

- :mod:`~headwise.model.transformer`: attention, MLP, block and the :class:`Transformer` (front
  end -> blocks -> final norm -> output head), one nanoGPT-style file;
- :mod:`~headwise.model.frontends` and :mod:`~headwise.model.heads`: the input front ends and
  output heads, chosen by ``ModelSpec.inputs`` and ``ModelSpec.outputs`` through the registries
  :data:`FRONT_ENDS` and :data:`OUTPUT_HEADS`;
- :mod:`~headwise.model.kernels`: how attention and logits are computed, with the CPU workarounds;
- :mod:`~headwise.model.cache`: key/value caches for decoding;
- :mod:`~headwise.model.pretrained`: saving and loading (safetensors plus ``spec.json``).

Adding a task family (sequence classification, masked-LM pretraining, ...; images are done this
way: ``ImageInputs`` and ``ClassifierHead``):

1. In :mod:`headwise.spec`, add the front end's name to ``Inputs`` and the head's to ``Outputs``
   (and the front end's usual head to ``DEFAULT_OUTPUTS``), with whatever fields they need.
2. Write a front end (a class with ``build``, ``param_counts``, ``forward`` and the positions
   an input gives the blocks, ``positions`` and ``input_positions``; see
   :class:`~headwise.model.frontends.FrontEnd`) and add it to :data:`FRONT_ENDS`; write a head
   (an :class:`~headwise.model.heads.OutputHead` subclass; ``positions_read`` says when it reads
   only the first positions, as a ViT's classifier does) and add it to :data:`OUTPUT_HEADS`.

Nothing else changes: the Transformer builds and calls whatever the spec names, and
:func:`headwise.params.count_params` adds up their ``param_counts`` (a test checks that this equals
the built model's count for every registered pair). The modules a front end or head builds sit on
the Transformer under the names it gives them, and those names are the state-dict keys of saved
models: choose them once.
"""

from headwise.model.cache import KVCache, LayerCache
from headwise.model.frontends import FRONT_ENDS, SequenceTooLong
from headwise.model.heads import OUTPUT_HEADS
from headwise.model.kernels import (
    CPU_MIN_HEAD_DIM,
    CPU_SPLIT_QUERIES,
    VOCAB_PAD,
    attention_mask,
    causal_attention_in_halves,
    padded_logits,
    padded_vocab_size,
)
from headwise.model.pretrained import SPEC_FILE, WEIGHTS_FILE, load_pretrained, save_pretrained
from headwise.model.transformer import MLP, Attention, Block, Transformer

__all__ = [
    "Transformer", "Attention", "MLP", "Block", "KVCache", "LayerCache", "SequenceTooLong",
    "FRONT_ENDS", "OUTPUT_HEADS", "save_pretrained", "load_pretrained", "SPEC_FILE", "WEIGHTS_FILE",
    "CPU_MIN_HEAD_DIM", "CPU_SPLIT_QUERIES", "VOCAB_PAD", "attention_mask", "causal_attention_in_halves",
    "padded_logits", "padded_vocab_size",
]
