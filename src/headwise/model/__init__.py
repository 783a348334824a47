"""The model: a transformer whose layers each have their own head count and head width.

- :mod:`~headwise.model.transformer`: attention, MLP, block and the :class:`Transformer` (front
  end -> blocks -> final norm -> output head), one nanoGPT-style file;
- :mod:`~headwise.model.inputs` and :mod:`~headwise.model.outputs`: the input front ends and
  output heads, chosen by ``ModelSpec.inputs`` and ``ModelSpec.outputs`` through the registries
  :data:`FRONT_ENDS` and :data:`OUTPUT_HEADS`;
- :mod:`~headwise.model.kernels`: how attention and logits are computed, with the CPU workarounds;
- :mod:`~headwise.model.cache`: key/value caches for decoding;
- :mod:`~headwise.model.pretrained`: saving and loading (safetensors plus ``spec.json``).

A task family that needs a new input or output (sequence classification, masked-LM pretraining,
...; images are done this way: ``ImageInputs`` and ``ClassifierHead``) writes, in its own folder:

1. a front end (a class with ``build``, ``param_counts``, ``forward``, the positions an input
   gives the blocks, ``positions`` and ``input_positions``, and its ``default_outputs`` and
   ``vocabulary``; see :class:`~headwise.model.inputs.FrontEnd`), registered with
   :func:`~headwise.model.inputs.register_front_end`;
2. a head (an :class:`~headwise.model.outputs.OutputHead` subclass; ``positions_read`` says when it
   reads only the first positions, as a ViT's classifier does, ``padding_row`` which token
   embedding row an encoder keeps at zero), registered with
   :func:`~headwise.model.outputs.register_output_head`.

The registries are the single source of the names ``ModelSpec.inputs`` and ``outputs`` accept
(:func:`headwise.spec.front_ends`, :func:`headwise.spec.output_heads`).
Nothing else changes: the Transformer builds and calls whatever the spec names, and
:func:`headwise.params.count_params` adds up their ``param_counts`` (a test checks that this equals
the built model's count for every registered pair). The modules a front end or head builds sit on
the Transformer under the names it gives them, and those names are the state-dict keys of saved
models: choose them once.
"""

from headwise.model.cache import KVCache, LayerCache
from headwise.model.inputs import FRONT_ENDS, SequenceTooLong
from headwise.model.outputs import OUTPUT_HEADS
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
