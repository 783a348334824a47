"""Input front ends: what turns a batch of raw inputs into the sequence [B, T, d_model] the blocks
read. ``ModelSpec.inputs`` names one in :data:`FRONT_ENDS`; see :mod:`headwise.model` for how a
task family adds its own.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor, nn

from headwise.spec import ModelSpec


class SequenceTooLong(ValueError):
    """The input is longer than the model's ``max_seq_len``."""


class FrontEnd(Protocol):
    """What a front end provides. Front ends are stateless classes: their parameters live in the
    modules :meth:`build` returns, which the Transformer holds under those names, so that state-dict
    keys carry no prefix (``tok_emb.weight``, as saved models and :mod:`headwise.hf` expect)."""

    @staticmethod
    def build(spec: ModelSpec) -> dict[str, nn.Module | None]:
        """The modules to set on the Transformer, by attribute name, in the order they are built."""
        ...

    @staticmethod
    def param_counts(spec: ModelSpec) -> dict[str, int]:
        """The exact parameter count of those modules, per component (for :mod:`headwise.params`)."""
        ...

    @staticmethod
    def forward(model: nn.Module, inputs: Tensor, past: int) -> Tensor:
        """The sequence [B, T, d_model] of ``inputs``, whose first position is ``past`` (the number
        of positions already in the model's cache)."""
        ...


def learned_positions(spec: ModelSpec) -> nn.Embedding | None:
    """The learned absolute positions ``pos_emb`` of a spec, or None (``positions = "none"``)."""
    return nn.Embedding(spec.max_seq_len, spec.d_model) if spec.positions == "learned" else None


def position_params(spec: ModelSpec) -> int:
    """Parameters of :func:`learned_positions`."""
    return spec.max_seq_len * spec.d_model if spec.positions == "learned" else 0


def add_positions(model: nn.Module, x: Tensor, past: int) -> Tensor:
    """``x`` [B, T, d_model] plus the model's positions ``past .. past+T-1`` (when it has them);
    :class:`SequenceTooLong` when those run past ``max_seq_len``."""
    t = x.shape[1]
    if past + t > model.spec.max_seq_len:
        raise SequenceTooLong(
            f"sequence of {past + t} positions is longer than the model's max_seq_len {model.spec.max_seq_len}"
        )
    if model.pos_emb is not None:
        x = x + model.pos_emb(torch.arange(past, past + t, device=x.device))
    return x


class TokenInputs(FrontEnd):
    """Token ids [B, T]: token embeddings ``tok_emb`` plus learned positions ``pos_emb`` (GPT-Neo's
    ``wte`` and ``wpe``)."""

    @staticmethod
    def build(spec: ModelSpec) -> dict[str, nn.Module | None]:
        return {"tok_emb": nn.Embedding(spec.vocab_size, spec.d_model), "pos_emb": learned_positions(spec)}

    @staticmethod
    def param_counts(spec: ModelSpec) -> dict[str, int]:
        return {"token_embedding": spec.vocab_size * spec.d_model, "position_embedding": position_params(spec)}

    @staticmethod
    def forward(model: nn.Module, inputs: Tensor, past: int) -> Tensor:
        return add_positions(model, model.tok_emb(inputs), past)


class VectorInputs(FrontEnd):
    """Vectors [B, N, d_model], taken as they are, plus learned positions if the spec has them."""

    @staticmethod
    def build(spec: ModelSpec) -> dict[str, nn.Module | None]:
        return {"pos_emb": learned_positions(spec)}

    @staticmethod
    def param_counts(spec: ModelSpec) -> dict[str, int]:
        return {"position_embedding": position_params(spec)}

    @staticmethod
    def forward(model: nn.Module, inputs: Tensor, past: int) -> Tensor:
        return add_positions(model, inputs, past)


#: ``ModelSpec.inputs`` -> its front end.
FRONT_ENDS: dict[str, type[FrontEnd]] = {"tokens": TokenInputs, "vectors": VectorInputs}
