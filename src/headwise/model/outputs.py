"""Output heads: what the model returns for the final hidden states [B, T, d_model].
``ModelSpec.outputs`` (by default the inputs' own head) names one in :data:`OUTPUT_HEADS`, whose
declaration (:class:`headwise.parts.OutputHeadPart`) says what the spec knows of it. The built-in
ones are here (``lm``, ``vectors``, ``classes``); a family's are in its folder (the encoder's
``mlm`` and ``cls_pooler``: :mod:`headwise.families.encoder.model`), see :mod:`headwise.model` for
how a family adds its own.
"""

from __future__ import annotations

from typing import Protocol

from torch import Tensor, nn

from headwise.model.kernels import padded_logits
from headwise.registry import MODEL_CODE, Registry
from headwise.spec import ModelSpec

#: ``ModelSpec.output_head`` -> its head's model code, registered where it is written (a family's
#: in a ``model`` module of its folder, which checking a spec that names it imports)
OUTPUT_HEADS: Registry[type["OutputHead"]] = Registry("output head", discover_key=MODEL_CODE)


class OutputHead(Protocol):
    """What an output head provides. Like front ends (:class:`~headwise.model.inputs.FrontEnd`),
    heads are stateless classes whose modules the Transformer holds under the names :meth:`build`
    returns. Its declaration says what the spec knows of it (its parameter count too); the model
    reads these two attributes, which are the declaration's (a test checks them): an exported
    model has no declarations."""

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
    def forward(model: nn.Module, x: Tensor, pad_vocab: bool, key_mask: Tensor | None = None) -> Tensor:
        return padded_logits(x, model.lm_head.weight) if pad_vocab else model.lm_head(x)


@OUTPUT_HEADS.register("vectors")
class VectorOutputs(OutputHead):
    """The final hidden states themselves, [B, N, d_model] (no parameters)."""

    @staticmethod
    def build(spec: ModelSpec, model: nn.Module) -> dict[str, nn.Module | None]:
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
    def forward(model: nn.Module, x: Tensor, pad_vocab: bool, key_mask: Tensor | None = None) -> Tensor:
        return model.classifier(pool(model.spec, x, key_mask))

    @staticmethod
    def positions_read(spec: ModelSpec) -> int | None:
        """The class token alone, or every position for mean pooling."""
        return 1 if spec.pooling == "cls" else None
