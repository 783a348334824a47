"""Output heads: what the model returns for the final hidden states [B, T, d_model].
``ModelSpec.outputs`` (by default the inputs' own head) names one in :data:`OUTPUT_HEADS`, whose
declaration (:class:`headwise.parts.OutputHeadPart`) says what the spec knows of it; see
:mod:`headwise.model` for how a task family adds its own.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor, nn

from headwise.model.kernels import padded_logits
from headwise.registry import Registry
from headwise.spec import ModelSpec

#: [PAD] in a masked LM's vocabulary (the encoder family's ``masking.PAD_ID``): the token
#: embedding row :meth:`MaskedLMHead.padding_row` keeps at zero when the spec names no ``pad_id``
#: (pretraining rows hold no padding, so its spec has none)
MASKED_LM_PAD_ID = 0


#: ``ModelSpec.output_head`` -> its head's model code, registered where it is written (a family's
#: in a ``model`` module of its folder, which checking a spec that names it imports)
OUTPUT_HEADS: Registry[type["OutputHead"]] = Registry("output head")


class OutputHead(Protocol):
    """What an output head provides. Like front ends (:class:`~headwise.model.inputs.FrontEnd`),
    heads are stateless classes whose modules the Transformer holds under the names :meth:`build`
    returns. Its declaration says what the spec knows of it; the model reads these two
    attributes, which are the declaration's (a test checks them): an exported model has no
    declarations."""

    #: whether the head decodes into the vocabulary (and so may decode selected positions only)
    vocabulary: bool = False
    #: whether the head reads one vector pooled from the sequence (:func:`pool`): with
    #: ``pooling = "cls"``, the class token the front end puts first
    pooled: bool = False

    @staticmethod
    def build(spec: ModelSpec, model: nn.Module) -> dict[str, nn.Module | None]:
        """The modules to set on the Transformer, by name; ``model`` is the Transformer being
        built, its front end and blocks already in place (a head may tie weights to them)."""
        ...

    @staticmethod
    def param_counts(spec: ModelSpec) -> dict[str, int]:
        """The exact parameter count of those modules, per component, weights tied to the front
        end's counted there (for :mod:`headwise.params`)."""
        ...

    @staticmethod
    def forward(model: nn.Module, x: Tensor, pad_vocab: bool, key_mask: Tensor | None = None) -> Tensor:
        """The output for the final hidden states ``x`` [B, T, d_model]. ``pad_vocab``: the caller
        accepts logits padded past the vocabulary with -inf (see :data:`~headwise.model.kernels.VOCAB_PAD`).
        ``key_mask`` [B, T]: False at padding (see :meth:`~headwise.model.inputs.FrontEnd.key_mask`)."""
        ...

    @staticmethod
    def positions_read(spec: ModelSpec) -> int | None:
        """How many leading positions :meth:`forward` reads (the model may skip computing the
        others in its last block); None, the default: all of them."""
        return None

    @staticmethod
    def padding_row(spec: ModelSpec) -> int | None:
        """The token id whose embedding row stays zero and takes no gradient from the embedding
        lookup (``nn.Embedding``'s ``padding_idx``; a tied decoder still trains it); None, the
        default: no such row. The encoder heads use it, as cramming's embedding does."""
        return None


@OUTPUT_HEADS.register("lm")
class LMHead(OutputHead):
    """Next-token logits [B, T, vocab] from ``lm_head``, whose weight is the token embedding's
    unless ``tie_embeddings = false``."""

    vocabulary = True

    @staticmethod
    def build(spec: ModelSpec, model: nn.Module) -> dict[str, nn.Module | None]:
        lm_head = nn.Linear(spec.d_model, spec.vocab_size, bias=False)
        if spec.tie_embeddings:
            lm_head.weight = model.tok_emb.weight
        return {"lm_head": lm_head}

    @staticmethod
    def param_counts(spec: ModelSpec) -> dict[str, int]:
        return {"lm_head": 0 if spec.tie_embeddings else spec.vocab_size * spec.d_model}

    @staticmethod
    def forward(model: nn.Module, x: Tensor, pad_vocab: bool, key_mask: Tensor | None = None) -> Tensor:
        return padded_logits(x, model.lm_head.weight) if pad_vocab else model.lm_head(x)


@OUTPUT_HEADS.register("mlm")
class MaskedLMHead(LMHead):
    """Masked-LM logits [B, T, vocab]: at each position, the token that position holds (BERT's
    objective), by a decoder without bias or transform whose weight is the token embedding's
    unless ``tie_embeddings = false`` (cramming's ``crammed-bert``: ``skip_head_transform``,
    ``decoder_bias = false``, tied). The model reads both ways. :meth:`forward` decodes the
    hidden states it is given: every position of a plain model call; in training and evaluation
    only the masked ones, gathered first (``Transformer.forward(select=...)``, called by
    :func:`headwise.model.loss.masked_lm_loss`). [PAD]'s row of the token embedding starts at
    zero and takes no gradient from the lookup, as in cramming (:meth:`padding_row`)."""

    @staticmethod
    def padding_row(spec: ModelSpec) -> int | None:
        """The spec's ``pad_id``, else :data:`MASKED_LM_PAD_ID` (a pretraining spec names none)."""
        return MASKED_LM_PAD_ID if spec.pad_id is None else spec.pad_id


@OUTPUT_HEADS.register("vectors")
class VectorOutputs(OutputHead):
    """The final hidden states themselves, [B, N, d_model] (no parameters)."""

    @staticmethod
    def build(spec: ModelSpec, model: nn.Module) -> dict[str, nn.Module | None]:
        return {}

    @staticmethod
    def param_counts(spec: ModelSpec) -> dict[str, int]:
        return {}

    @staticmethod
    def forward(model: nn.Module, x: Tensor, pad_vocab: bool, key_mask: Tensor | None = None) -> Tensor:
        return x


def make_classifier(spec: ModelSpec, in_dim: int) -> nn.Module:
    """``in_dim`` -> classes: one linear map, or through a ReLU hidden layer of ``classifier_hidden``."""
    if spec.classifier_hidden is None:
        return nn.Linear(in_dim, spec.num_classes)
    h = spec.classifier_hidden
    return nn.Sequential(nn.Linear(in_dim, h), nn.ReLU(), nn.Linear(h, spec.num_classes))


def classifier_params(spec: ModelSpec, in_dim: int) -> int:
    """Parameters of :func:`make_classifier`."""
    if spec.classifier_hidden is None:
        return (in_dim + 1) * spec.num_classes
    h = spec.classifier_hidden
    return (in_dim + 1) * h + (h + 1) * spec.num_classes


def pool(spec: ModelSpec, x: Tensor, key_mask: Tensor | None) -> Tensor:
    """One vector per sequence [B, d]: the class token's final state (``pooling = "cls"``) or the
    mean over the positions ``key_mask`` keeps (all when None)."""
    if spec.pooling == "cls":
        return x[:, 0]
    if key_mask is None:
        return x.mean(dim=1)
    keep = key_mask[:, :x.shape[1], None].to(x.dtype)
    return (x * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1)


@OUTPUT_HEADS.register("classes")
class ClassifierHead(OutputHead):
    """Class logits [B, num_classes] from ``classifier`` (linear, or with a ReLU hidden layer) of
    the pooled sequence (see :func:`pool`)."""

    pooled = True

    @staticmethod
    def build(spec: ModelSpec, model: nn.Module) -> dict[str, nn.Module | None]:
        return {"classifier": make_classifier(spec, spec.d_model)}

    @staticmethod
    def param_counts(spec: ModelSpec) -> dict[str, int]:
        return {"classifier": classifier_params(spec, spec.d_model)}

    @staticmethod
    def forward(model: nn.Module, x: Tensor, pad_vocab: bool, key_mask: Tensor | None = None) -> Tensor:
        return model.classifier(pool(model.spec, x, key_mask))

    @staticmethod
    def positions_read(spec: ModelSpec) -> int | None:
        """The class token alone, or every position for mean pooling."""
        return 1 if spec.pooling == "cls" else None


@OUTPUT_HEADS.register("pair_classes")
class PairClassifierHead(OutputHead):
    """Class logits [B, num_classes] for pairs of sequences (rows 2i and 2i + 1 of the blocks'
    output, see :class:`~headwise.model.inputs.TokenPairInputs`): the pooled u and v combined
    as [u, v, u * v, u - v] (the LRA Retrieval models' rule), then ``classifier``."""

    pooled = True

    @staticmethod
    def build(spec: ModelSpec, model: nn.Module) -> dict[str, nn.Module | None]:
        return {"classifier": make_classifier(spec, 4 * spec.d_model)}

    @staticmethod
    def param_counts(spec: ModelSpec) -> dict[str, int]:
        return {"classifier": classifier_params(spec, 4 * spec.d_model)}

    @staticmethod
    def forward(model: nn.Module, x: Tensor, pad_vocab: bool, key_mask: Tensor | None = None) -> Tensor:
        pooled = pool(model.spec, x, key_mask).view(-1, 2, x.shape[-1])
        u, v = pooled[:, 0], pooled[:, 1]
        return model.classifier(torch.cat([u, v, u * v, u - v], dim=-1))

    @staticmethod
    def positions_read(spec: ModelSpec) -> int | None:
        return ClassifierHead.positions_read(spec)


@OUTPUT_HEADS.register("cls_pooler")
class ClsPoolerHead(OutputHead):
    """cramming's GLUE pooler (``config/eval/GLUE_sane.yaml`` ``pooler: zero_index``,
    ``crammed_bert.py`` PoolingComponent): the final state of position 0 (an encoder's ``[CLS]``),
    ``Linear(d_model, classifier_hidden)`` with bias, tanh, dropout (the spec's),
    ``Linear(classifier_hidden, num_classes)``: logits ``[B, num_classes]`` (one score for a
    regression). ``classifier_hidden`` is the pooler width (cramming: 1024). The ``classes`` head
    with ``pooling = "cls"`` would instead prepend a learned class token a pretrained encoder never
    saw (shifting every position by one) and use a ReLU hidden layer."""

    @staticmethod
    def build(spec: ModelSpec, model: nn.Module) -> dict[str, nn.Module | None]:
        if spec.num_classes is None:
            raise ValueError("outputs = 'cls_pooler' needs num_classes (let the task's data set it)")
        h = spec.classifier_hidden or spec.d_model
        pooler = nn.Sequential(nn.Linear(spec.d_model, h), nn.Tanh(), nn.Dropout(spec.dropout))
        return {"pooler": pooler, "classifier": nn.Linear(h, spec.num_classes)}

    @staticmethod
    def param_counts(spec: ModelSpec) -> dict[str, int]:
        h = spec.classifier_hidden or spec.d_model
        return {"pooler": (spec.d_model + 1) * h, "classifier": (h + 1) * (spec.num_classes or 0)}

    @staticmethod
    def forward(model: nn.Module, x: Tensor, pad_vocab: bool, key_mask: Tensor | None = None) -> Tensor:
        return model.classifier(model.pooler(x[:, 0]))

    @staticmethod
    def positions_read(spec: ModelSpec) -> int | None:
        return 1

    @staticmethod
    def padding_row(spec: ModelSpec) -> int | None:
        """The spec's ``pad_id`` (GLUE's [PAD]), as in the encoder this head fine-tunes."""
        return spec.pad_id
