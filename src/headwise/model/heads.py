"""Output heads: what the model returns for the final hidden states [B, T, d_model].
``ModelSpec.outputs`` (by default the inputs' own head) names one in :data:`OUTPUT_HEADS`; see
:mod:`headwise.model` for how a task family adds its own.
"""

from __future__ import annotations

from typing import Protocol

from torch import Tensor, nn

from headwise.model.kernels import padded_logits
from headwise.spec import ModelSpec


class OutputHead(Protocol):
    """What an output head provides. Like front ends (:class:`~headwise.model.frontends.FrontEnd`),
    heads are stateless classes whose modules the Transformer holds under the names :meth:`build`
    returns."""

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
    def forward(model: nn.Module, x: Tensor, pad_vocab: bool) -> Tensor:
        """The output for the final hidden states ``x`` [B, T, d_model]. ``pad_vocab``: the caller
        accepts logits padded past the vocabulary with -inf (see :data:`~headwise.model.kernels.VOCAB_PAD`)."""
        ...

    @staticmethod
    def positions_read(spec: ModelSpec) -> int | None:
        """How many leading positions :meth:`forward` reads (the model may skip computing the
        others in its last block); None, the default: all of them."""
        return None


class LMHead(OutputHead):
    """Next-token logits [B, T, vocab] from ``lm_head``, whose weight is the token embedding's
    unless ``tie_embeddings = false``."""

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
    def forward(model: nn.Module, x: Tensor, pad_vocab: bool) -> Tensor:
        return padded_logits(x, model.lm_head.weight) if pad_vocab else model.lm_head(x)


class VectorOutputs(OutputHead):
    """The final hidden states themselves, [B, N, d_model] (no parameters)."""

    @staticmethod
    def build(spec: ModelSpec, model: nn.Module) -> dict[str, nn.Module | None]:
        return {}

    @staticmethod
    def param_counts(spec: ModelSpec) -> dict[str, int]:
        return {}

    @staticmethod
    def forward(model: nn.Module, x: Tensor, pad_vocab: bool) -> Tensor:
        return x


class ClassifierHead(OutputHead):
    """Class logits [B, num_classes] from ``classifier``, a linear map (with bias) of the class
    token's final state (``pooling = "cls"``) or of the mean over positions (``"mean"``)."""

    @staticmethod
    def build(spec: ModelSpec, model: nn.Module) -> dict[str, nn.Module | None]:
        return {"classifier": nn.Linear(spec.d_model, spec.num_classes)}

    @staticmethod
    def param_counts(spec: ModelSpec) -> dict[str, int]:
        return {"classifier": (spec.d_model + 1) * spec.num_classes}

    @staticmethod
    def forward(model: nn.Module, x: Tensor, pad_vocab: bool) -> Tensor:
        pooled = x[:, 0] if model.spec.pooling == "cls" else x.mean(dim=1)
        return model.classifier(pooled)

    @staticmethod
    def positions_read(spec: ModelSpec) -> int | None:
        """The class token alone, or every position for mean pooling."""
        return 1 if spec.pooling == "cls" else None


#: ``ModelSpec.output_head`` -> its output head.
OUTPUT_HEADS: dict[str, type[OutputHead]] = {"lm": LMHead, "vectors": VectorOutputs, "classes": ClassifierHead}
