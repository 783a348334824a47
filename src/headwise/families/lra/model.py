"""Long Range Arena's pair models, their model code: the ``token_pairs`` front end and the
``pair_classes`` head of Retrieval, which compares two documents. Their declarations are in
:mod:`~headwise.families.lra.model_parts`. Like every part's model code, it imports only
:mod:`headwise.model`'s modules and torch, as exported model code must (a pair model does not
export: its head names no ``transformers`` class).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from headwise.model.inputs import FRONT_ENDS, TokenInputs
from headwise.model.outputs import OUTPUT_HEADS, ClassifierHead, OutputHead, make_classifier, pool
from headwise.spec import ModelSpec


@FRONT_ENDS.register("token_pairs")
class TokenPairInputs(TokenInputs):
    """Pairs of token sequences [B, 2, T] (LRA Retrieval's two documents): both sequences of each
    pair go through the same embeddings and blocks as a batch of 2B sequences (pair i's are rows
    2i and 2i + 1); the pair head combines their pooled vectors. A task's ``seq_len`` counts both
    documents (2T tokens an example)."""

    @staticmethod
    def forward(model: nn.Module, inputs: Tensor, past: int) -> Tensor:
        return TokenInputs.forward(model, _pairs_as_rows(inputs), past)

    @staticmethod
    def input_positions(spec: ModelSpec, inputs: Tensor) -> int:
        return TokenInputs.input_positions(spec, inputs[:, 0])

    @staticmethod
    def key_mask(model: nn.Module, inputs: Tensor) -> Tensor | None:
        return TokenInputs.key_mask(model, _pairs_as_rows(inputs))


def _pairs_as_rows(inputs: Tensor) -> Tensor:
    if inputs.dim() != 3 or inputs.shape[1] != 2:
        raise ValueError(f"token pairs of shape {tuple(inputs.shape)}; this model takes [batch, 2, length]")
    return inputs.reshape(-1, inputs.shape[-1])


@OUTPUT_HEADS.register("pair_classes")
class PairClassifierHead(OutputHead):
    """Class logits [B, num_classes] for pairs of sequences (rows 2i and 2i + 1 of the blocks'
    output, see :class:`TokenPairInputs`): the pooled u and v combined as [u, v, u * v, u - v]
    (the LRA Retrieval models' rule), then ``classifier``."""

    pooled = True

    @staticmethod
    def build(spec: ModelSpec, model: nn.Module) -> dict[str, nn.Module | None]:
        return {"classifier": make_classifier(spec, 4 * spec.d_model)}

    @staticmethod
    def forward(model: nn.Module, x: Tensor, pad_vocab: bool, key_mask: Tensor | None = None) -> Tensor:
        pooled = pool(model.spec, x, key_mask).view(-1, 2, x.shape[-1])
        u, v = pooled[:, 0], pooled[:, 1]
        return model.classifier(torch.cat([u, v, u * v, u - v], dim=-1))

    @staticmethod
    def positions_read(spec: ModelSpec) -> int | None:
        return ClassifierHead.positions_read(spec)
