"""headwise models as ``transformers`` models. Each class wraps headwise's
:class:`~headwise.model.transformer.Transformer`, so any spec (per-layer head counts and widths,
local or Nyström layers, unit-norm blocks) loads with an Auto class and returns ``.logits``:
``HeadwiseForCausalLM`` (``AutoModelForCausalLM``; ``generate()`` with a KV cache),
``HeadwiseForMaskedLM`` (``AutoModelForMaskedLM``: masked-LM encoders),
``HeadwiseForSequenceClassification`` (sequence classifiers, GLUE fine-tuning's first-token
pooler included), ``HeadwiseForImageClassification`` (ViTs) and ``HeadwiseModel``
(``AutoModel``: any head's outputs as ``.logits``, with no loss). Which class a model exports as
is its output head's declaration (``OutputHeadPart.hf_class`` in :mod:`headwise.parts`, refined
by its front end's): no class here names a part.

This module is copied into folders that ``headwise export --hf`` writes, together with the model
modules it imports; there, every ``headwise`` import reads from a sibling file (see
:mod:`headwise.hf.export`), so loading needs only torch and transformers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import (
    CausalLMOutputWithPast, ImageClassifierOutput, MaskedLMOutput, SequenceClassifierOutput,
)
from transformers.utils import ModelOutput

from headwise.hf.models.configuration_headwise import HeadwiseConfig
from headwise.model.feature_modules import ScaledSinusoid
from headwise.model.rotary import Rotary
from headwise.model.transformer import Transformer


# The output field that carries the cache back to generate(): `cache` from transformers 5.24,
# `past_key_values` before (5.24 still accepts the old name, with a deprecation warning)
OUTPUT_CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


class CacheLayerView:
    """One layer of a ``transformers`` :class:`Cache` with the interface headwise's attention
    uses (``length``, ``extend``), so ``generate()``'s own cache object carries the keys and values."""

    def __init__(self, cache: Cache, index: int) -> None:
        self.cache, self.index = cache, index

    @property
    def length(self) -> int:
        """Positions cached in this layer."""
        return self.cache.get_seq_length(self.index)

    def extend(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append ``k``, ``v`` [B, heads, t, head_dim]; returns all keys and values so far."""
        return self.cache.update(k, v, self.index)


class CacheView:
    """A ``transformers`` :class:`Cache` as headwise's :class:`~headwise.model.cache.KVCache`."""

    def __init__(self, cache: Cache, n_layers: int) -> None:
        self.layers = [CacheLayerView(cache, i) for i in range(n_layers)]
        self.length = cache.get_seq_length()


class HeadwisePreTrainedModel(PreTrainedModel):
    """Loading, saving and initialisation shared by headwise's ``transformers`` classes."""

    config_class = HeadwiseConfig
    base_model_prefix = "model"
    _no_split_modules = ["Block"]

    #: the Auto class that loads the class (``auto_map``'s key in an exported folder)
    auto_class_name: ClassVar[str]

    def __init__(self, config: HeadwiseConfig) -> None:
        super().__init__(config)
        saved_as = config.architectures or []
        if saved_as and type(self).__name__ not in saved_as and not isinstance(self, HeadwiseModel):
            raise ValueError(f"this model was saved as {', '.join(saved_as)}: load it with that class's Auto class "
                             f"(or AutoModel), not as {type(self).__name__}")
        self.model = Transformer(config.model_spec())
        self.post_init()

    def _init_weights(self, module: torch.nn.Module) -> None:
        # headwise's own initialisation (GPT-Neo's), for weights a checkpoint does not hold
        Transformer._init_weights(self.model, module)
        if isinstance(module, ScaledSinusoid):
            # its sinusoid table is not saved (a non-persistent buffer): from_pretrained builds the
            # model without computing buffers, so the table is computed again here
            rows, width = module.table.shape
            with torch.device("cpu"):
                table = ScaledSinusoid(rows, width).table
            with torch.no_grad():
                module.table.copy_(table)
        elif isinstance(module, Rotary):
            module.recompute_buffers()  # the rotary frequencies, likewise not saved


class TokenLMPreTrainedModel(HeadwisePreTrainedModel):
    """A headwise model that reads tokens and decodes them: its token embedding ``tok_emb`` and
    the decoder ``lm_head`` tied to it (unless ``tie_embeddings = false``), as ``transformers``
    asks of a language model's input and output embeddings."""

    _tied_weights_keys = {"model.lm_head.weight": "model.tok_emb.weight"}

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.model.tok_emb

    def set_input_embeddings(self, value: torch.nn.Embedding) -> None:
        self.model.tok_emb = value

    def get_output_embeddings(self) -> torch.nn.Linear:
        return self.model.lm_head

    def set_output_embeddings(self, value: torch.nn.Linear) -> None:
        self.model.lm_head = value


class HeadwiseForCausalLM(TokenLMPreTrainedModel, GenerationMixin):
    """A headwise decoder language model (token inputs, a causal head that decodes into the
    vocabulary) for ``transformers``.

    Batches must not be padded (``attention_mask`` all ones): the model has learned absolute
    positions counted from each sequence's start and no padding mask, so a left-padded row
    would be shifted. Give unpadded batches (for example batch size 1 for generation).
    """

    auto_class_name = "AutoModelForCausalLM"

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, cache: Cache | None = None,
                use_cache: bool | None = None, labels: Tensor | None = None,
                past_key_values: Cache | None = None, **kwargs: Any) -> CausalLMOutputWithPast:
        """Logits [B, T, vocab] for ``input_ids`` [B, T] (after the positions in ``cache``); with
        ``labels``, the next-token loss (``transformers``' causal-LM loss, -100 ignored).

        ``cache`` is the key/value cache; transformers before 5.24 passes it as ``past_key_values``,
        and either name is taken. A new cache's first forward computes what a forward without one does.
        """
        if past_key_values is not None:
            if cache is not None:
                raise ValueError("give the key/value cache once: as `cache` or as `past_key_values`, not both")
            cache = past_key_values
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("headwise models take unpadded batches (attention_mask all ones): their learned "
                             "positions count from each sequence's start; use batch size 1 or sequences of equal length")
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        logits = self.model(input_ids, CacheView(cache, len(self.model.blocks)) if cache is not None else None)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{OUTPUT_CACHE_FIELD: cache if use_cache else None})


def check_padding_mask(model: Transformer, input_ids: Tensor, attention_mask: Tensor | None) -> None:
    """Refuse an ``attention_mask`` that differs from the padding ``model`` masks itself: the
    positions holding the spec's ``pad_id`` (none when it has no ``pad_id``)."""
    if attention_mask is None:
        return
    pad_id = model.spec.pad_id
    kept = torch.ones_like(input_ids, dtype=torch.bool) if pad_id is None else input_ids != pad_id
    if not torch.equal(attention_mask.bool(), kept):
        if pad_id is None:
            raise ValueError("this model has no pad_id, so it masks no padding: give unpadded batches "
                             "(attention_mask all ones)")
        raise ValueError(f"attention_mask must mark exactly the tokens that are not the model's pad_id "
                         f"({pad_id}): headwise masks padding by its id")


class HeadwiseForMaskedLM(TokenLMPreTrainedModel):
    """A headwise masked-LM encoder (token inputs, a masked-LM head, bidirectional): logits
    [B, T, vocab] at every position, from the decoder tied to the token embedding unless
    ``tie_embeddings = false``. Padding is the spec's ``pad_id`` (masked out of attention); an
    ``attention_mask`` must agree with it, and a model without ``pad_id`` takes unpadded batches."""

    auto_class_name = "AutoModelForMaskedLM"

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, labels: Tensor | None = None,
                **kwargs: Any) -> MaskedLMOutput:
        """Logits [B, T, vocab] for ``input_ids`` [B, T]; with ``labels`` [B, T] (the original ids
        at the masked positions, -100 elsewhere), their mean cross-entropy."""
        check_padding_mask(self.model, input_ids, attention_mask)
        logits = self.model(input_ids)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
        return MaskedLMOutput(loss=loss, logits=logits)


class HeadwiseForSequenceClassification(HeadwisePreTrainedModel):
    """A headwise sequence classifier (token inputs, a head that classifies the sequence, a
    fine-tuned encoder's pooler included): class logits [B, num_classes] ([B, 1] scores for a
    regression). Padding is the spec's ``pad_id`` (masked out of attention and pooling); an
    ``attention_mask`` must agree with it."""

    auto_class_name = "AutoModelForSequenceClassification"

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, labels: Tensor | None = None,
                **kwargs: Any) -> SequenceClassifierOutput:
        """Class logits for ``input_ids`` [B, T]; with ``labels`` [B], the cross-entropy (the squared
        error for one output)."""
        check_padding_mask(self.model, input_ids, attention_mask)
        logits = self.model(input_ids)
        loss = None
        if labels is not None and logits.shape[-1] == 1:  # one output: a regression, as transformers treats it
            loss = F.mse_loss(logits[:, 0].float(), labels.float())
        elif labels is not None:
            loss = F.cross_entropy(logits.float(), labels)
        return SequenceClassifierOutput(loss=loss, logits=logits)


class HeadwiseForImageClassification(HeadwisePreTrainedModel):
    """A headwise ViT (image inputs, a classifier head): class logits [B, num_classes] for
    ``pixel_values`` [B, channels, image_size, image_size], normalised as in training."""

    auto_class_name = "AutoModelForImageClassification"
    main_input_name = "pixel_values"

    def forward(self, pixel_values: Tensor, labels: Tensor | None = None, **kwargs: Any) -> ImageClassifierOutput:
        """Class logits for ``pixel_values``; with ``labels`` [B], the cross-entropy."""
        logits = self.model(pixel_values)
        loss = None if labels is None else F.cross_entropy(logits.float(), labels)
        return ImageClassifierOutput(loss=loss, logits=logits)


def shared_weights(module: torch.nn.Module) -> dict[str, str]:
    """Each parameter name of ``module`` whose weight is another's -> the name it first has."""
    first: dict[int, str] = {}
    shared = {}
    for name, parameter in module.named_parameters(remove_duplicate=False):
        if id(parameter) in first:
            shared[name] = first[id(parameter)]
        else:
            first[id(parameter)] = name
    return shared


@dataclass
class HeadwiseModelOutput(ModelOutput):
    """What :class:`HeadwiseModel` returns: the model's outputs, whatever their shape."""

    logits: Tensor | None = None


class HeadwiseModel(HeadwisePreTrainedModel):
    """Any headwise model (``AutoModel``): its outputs for ``inputs``, as its output head returns
    them, in ``.logits``; no loss. The class of a head that no task-specific class fits (a
    family's regression head, say); it also loads any other class's folder."""

    auto_class_name = "AutoModel"
    main_input_name = "inputs"

    def post_init(self) -> None:
        # The weights the model shares (a decoder tied to the token embedding) are saved once:
        # transformers ties them again on loading where it is told which they are
        self._tied_weights_keys = shared_weights(self)
        super().post_init()

    def forward(self, inputs: Tensor, **kwargs: Any) -> HeadwiseModelOutput:
        """The model's outputs for ``inputs``, a batch as its front end reads them."""
        return HeadwiseModelOutput(logits=self.model(inputs))


#: every class here, by name (the names output heads' declarations give)
HF_CLASSES: dict[str, type[HeadwisePreTrainedModel]] = {
    cls.__name__: cls for cls in (HeadwiseModel, HeadwiseForCausalLM, HeadwiseForMaskedLM,
                                  HeadwiseForSequenceClassification, HeadwiseForImageClassification)
}
