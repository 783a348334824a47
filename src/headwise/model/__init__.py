"""The model: a transformer whose layers each have their own head count and head width.

- :mod:`~headwise.model.transformer`: attention, MLP, block and the :class:`Transformer` (front
  end -> blocks -> final norm -> output head), one nanoGPT-style file;
- :mod:`~headwise.model.attention`: the attention kinds' plug-in shape and registry, chosen per
  layer by ``ModelSpec.attention``; the built-in kinds in ``attention_*.py`` (``global``,
  ``local``, ``nystrom``), Nyström's approximation itself in :mod:`~headwise.model.nystrom`;
- :mod:`~headwise.model.inputs` and :mod:`~headwise.model.outputs`: the input front ends and
  output heads, chosen by ``ModelSpec.inputs`` and ``ModelSpec.outputs`` through the registries
  :data:`FRONT_ENDS` and :data:`OUTPUT_HEADS`;
- :mod:`~headwise.model.kernels`: how attention and logits are computed, with the CPU workarounds;
- :mod:`~headwise.model.features`: the block features' settings (``norm``, ``positions``,
  ``activation``, ``qk_norm``, ``output_gate``, ``embedding_norm``) as records, one per setting;
- :mod:`~headwise.model.rotary`: rotary positions (RoPE) on each layer's q and k;
- :mod:`~headwise.model.loss`: the training losses (next-token cross-entropy without the full-size
  temporaries, the masked LM's over its masked positions);
- :mod:`~headwise.model.cache`: key/value caches for decoding;
- :mod:`~headwise.model.pretrained`: saving and loading (safetensors plus ``spec.json``).

Every front end and head is two things, each registered under the part's name: a declaration
(:mod:`headwise.parts`: what the spec, generation, the model card and export know of it, without
torch) and its model code here. The built-in ones are the ``tokens``, ``vectors`` and ``images``
front ends and the ``lm``, ``vectors`` and ``classes`` heads; the encoder's ``mlm`` and
``cls_pooler`` heads are in ``families/encoder/model.py``, LRA's ``token_pairs`` front end and
``pair_classes`` head in ``families/lra/model.py``. A task family that needs another input or
output writes both in ``model`` or ``model_*`` modules of its own folder (the declarations apart
from the model code, which an exported model carries), and edits no file here:

1. a front end: a :class:`~headwise.model.inputs.FrontEnd` subclass (``build``, ``forward``, the
   positions a batch gives the blocks, ``input_positions``) registered in
   :data:`~headwise.model.inputs.FRONT_ENDS`, and its :class:`~headwise.parts.FrontEndPart` (its
   default head, whether it reads a vocabulary, its parameter count, the positions a task's
   examples give the blocks, ...) in :data:`~headwise.parts.FRONT_END_PARTS`;
2. a head: an :class:`~headwise.model.outputs.OutputHead` subclass (``positions_read`` says when
   it reads only the first positions, as a ViT's classifier does, ``padding_row`` which token
   embedding row an encoder keeps at zero) registered in
   :data:`~headwise.model.outputs.OUTPUT_HEADS`, and its :class:`~headwise.parts.OutputHeadPart`
   (what the spec needs of it, its parameter count, the ``transformers`` class it exports as, ...) in
   :data:`~headwise.parts.OUTPUT_HEAD_PARTS`.

The declarations are the single source of the names ``ModelSpec.inputs`` and ``outputs`` accept;
the first spec that names a family's part imports the family's ``model_parts`` modules (no torch),
and the first model built with it the family's ``model`` modules, with the part's model code.
Nothing else changes: the Transformer builds and calls whatever the spec names, and
:func:`headwise.params.count_params` adds up their declarations' ``param_counts``, without torch
(a test checks that this equals the built model's count for every registered pair). The modules a
front end or head builds sit on the Transformer under the names it gives them, and those names are
the state-dict keys of saved models: choose them once.
"""

from headwise.lazy import lazy_exports

# Every name below, loaded from its module on first use (PEP 562): importing a module of this
# package that needs no torch (the attention kinds and the block features, whose options
# headwise.spec reads) then does not load torch and the whole model.
_EXPORTS = {
    "KVCache": "cache", "LayerCache": "cache", "FRONT_ENDS": "inputs", "SequenceTooLong": "inputs",
    "OUTPUT_HEADS": "outputs", "CPU_MIN_HEAD_DIM": "kernels", "CPU_SPLIT_QUERIES": "kernels",
    "VOCAB_PAD": "kernels", "attention_mask": "kernels", "causal_attention_in_halves": "kernels",
    "padded_logits": "kernels", "padded_vocab_size": "kernels", "SPEC_FILE": "pretrained",
    "WEIGHTS_FILE": "pretrained", "load_pretrained": "pretrained", "save_pretrained": "pretrained",
    "MLP": "transformer", "Attention": "transformer", "Block": "transformer", "Transformer": "transformer",
}

__all__ = [
    "Transformer", "Attention", "MLP", "Block", "KVCache", "LayerCache", "SequenceTooLong",
    "FRONT_ENDS", "OUTPUT_HEADS", "save_pretrained", "load_pretrained", "SPEC_FILE", "WEIGHTS_FILE",
    "CPU_MIN_HEAD_DIM", "CPU_SPLIT_QUERIES", "VOCAB_PAD", "attention_mask", "causal_attention_in_halves",
    "padded_logits", "padded_vocab_size",
]

__getattr__ = lazy_exports(__name__, {name: f"{__name__}.{module}" for name, module in _EXPORTS.items()})
