"""Input front ends: what turns a batch of raw inputs into the sequence [B, T, d_model] the blocks
read. ``ModelSpec.inputs`` names one in :data:`FRONT_ENDS`, whose declaration
(:class:`headwise.parts.FrontEndPart`) says what the spec knows of it. The built-in ones are
here (tokens, vectors, images); a family's are in its folder (LRA's token pairs:
:mod:`headwise.families.lra.model`), see :mod:`headwise.model` for how a family adds its own.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor, nn

from headwise.model.features import POSITIONS
from headwise.model.outputs import OUTPUT_HEADS
from headwise.registry import MODEL_CODE, Registry
from headwise.spec import ModelSpec


class SequenceTooLong(ValueError):
    """The input is longer than the model's ``max_seq_len``."""


#: ``ModelSpec.inputs`` -> its front end's model code, registered where it is written (a family's
#: in a ``model`` module of its folder, which checking a spec that names it imports)
FRONT_ENDS: Registry[type["FrontEnd"]] = Registry("front end", discover_key=MODEL_CODE)


class FrontEnd(Protocol):
    """What a front end provides. Front ends are stateless classes: their parameters live in the
    modules :meth:`build` returns, which the Transformer holds under those names, so that state-dict
    keys carry no prefix (``tok_emb.weight``, as saved models and :mod:`headwise.hf.gpt_neo` expect).
    What the spec knows of it (its default head, whether it reads a vocabulary, its parameter
    count and the positions a task's examples give it) is its declaration's."""

    @staticmethod
    def build(spec: ModelSpec) -> dict[str, nn.Module | None]:
        """The modules to set on the Transformer, by attribute name, in the order they are built."""
        ...

    @staticmethod
    def forward(model: nn.Module, inputs: Tensor, past: int) -> Tensor:
        """The sequence [B, T, d_model] of ``inputs``, whose first position is ``past`` (the number
        of positions already in the model's cache)."""
        ...

    @staticmethod
    def input_positions(spec: ModelSpec, inputs: Tensor) -> int:
        """The positions T the blocks see for a batch of ``inputs`` (by default [B, T, ...]: T and
        the class token, if any)."""
        return inputs.shape[1] + has_class_token(spec)

    @staticmethod
    def key_mask(model: nn.Module, inputs: Tensor) -> Tensor | None:
        """[B', T] bool, False at the positions attention and pooling must ignore (padding), for
        the sequences :meth:`forward` returns; None when every position counts."""
        return None


def has_class_token(spec: ModelSpec) -> bool:
    """Whether the sequence starts with a learned class token: a pooled classifier that reads it."""
    return OUTPUT_HEADS[spec.output_head].pooled and spec.pooling == "cls"


def class_token(spec: ModelSpec) -> "ClassToken | None":
    """The class token ``cls_token`` of a spec that has one (see :func:`has_class_token`)."""
    return ClassToken(spec.d_model, spec.init_std) if has_class_token(spec) else None


def with_class_token(model: nn.Module, x: Tensor) -> Tensor:
    """``x`` [B, T, d] with the model's class token put first, when it has one."""
    if getattr(model, "cls_token", None) is None:
        return x
    return torch.cat([model.cls_token(x.shape[0]), x], dim=1)


def position_embedding(spec: ModelSpec) -> nn.Module | None:
    """The absolute positions ``pos_emb`` of a spec (its :data:`~headwise.model.features.POSITIONS`
    record's ``embedding``), or None."""
    return POSITIONS[spec.positions].embedding(spec)


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


@FRONT_ENDS.register("tokens")
class TokenInputs(FrontEnd):
    """Token ids [B, T]: token embeddings ``tok_emb`` plus positions ``pos_emb`` (GPT-Neo's
    ``wte`` and ``wpe`` when learned); a sequence classifier reading a class token gets ``cls_token`` first.
    With ``pad_id`` set, positions holding it are masked out of attention and pooling. An encoder's
    output head names a [PAD] row of ``tok_emb`` (:meth:`~headwise.model.outputs.OutputHead.padding_row`)
    that starts at zero and takes no gradient from the lookup, as cramming's embedding does."""

    @staticmethod
    def build(spec: ModelSpec) -> dict[str, nn.Module | None]:
        pad_row = OUTPUT_HEADS[spec.output_head].padding_row(spec)
        return {"tok_emb": nn.Embedding(spec.vocab_size, spec.d_model, padding_idx=pad_row),
                "cls_token": class_token(spec), "pos_emb": position_embedding(spec)}

    @staticmethod
    def forward(model: nn.Module, inputs: Tensor, past: int) -> Tensor:
        return add_positions(model, with_class_token(model, model.tok_emb(inputs)), past)

    @staticmethod
    def key_mask(model: nn.Module, inputs: Tensor) -> Tensor | None:
        spec = model.spec
        if spec.pad_id is None:
            return None
        mask = inputs != spec.pad_id
        if has_class_token(spec):
            mask = torch.cat([torch.ones_like(mask[:, :1]), mask], dim=1)
        return mask


@FRONT_ENDS.register("vectors")
class VectorInputs(FrontEnd):
    """Vectors [B, N, d_model], taken as they are (a classifier reading a class token gets
    ``cls_token`` first), plus positions if the spec has them."""

    @staticmethod
    def build(spec: ModelSpec) -> dict[str, nn.Module | None]:
        return {"cls_token": class_token(spec), "pos_emb": position_embedding(spec)}

    @staticmethod
    def forward(model: nn.Module, inputs: Tensor, past: int) -> Tensor:
        return add_positions(model, with_class_token(model, inputs), past)


@FRONT_ENDS.register("images")
class ImageInputs(FrontEnd):
    """Images [B, C, H, W] (float, normalised) as a ViT reads them: non-overlapping patches
    embedded by ``patch_emb`` (a convolution with stride = kernel = patch_size, i.e. one linear
    map per flattened patch), a learned class token ``cls_token`` first when ``pooling = "cls"``,
    and learned positions ``pos_emb`` over those ``max_seq_len`` positions."""

    @staticmethod
    def build(spec: ModelSpec) -> dict[str, nn.Module | None]:
        modules: dict[str, nn.Module | None] = {
            "patch_emb": nn.Conv2d(spec.channels, spec.d_model, spec.patch_size, stride=spec.patch_size),
        }
        modules["cls_token"] = class_token(spec)
        modules["pos_emb"] = position_embedding(spec)
        return modules

    @staticmethod
    def forward(model: nn.Module, inputs: Tensor, past: int) -> Tensor:
        spec = model.spec
        want = (spec.channels, spec.image_size, spec.image_size)
        if inputs.dim() != 4 or tuple(inputs.shape[1:]) != want:
            raise ValueError(f"images of shape {tuple(inputs.shape)}; this model takes [batch, {', '.join(map(str, want))}]")
        x = model.patch_emb(inputs).flatten(2).transpose(1, 2)  # [B, patches, d], row-major patches
        return add_positions(model, with_class_token(model, x), past)

    @staticmethod
    def input_positions(spec: ModelSpec, inputs: Tensor) -> int:
        return spec.max_seq_len


class ClassToken(nn.Module):
    """A learned vector put before the patches; the classifier reads its final state."""

    def __init__(self, d_model: int, std: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(1, 1, d_model) * std)

    def forward(self, batch: int) -> Tensor:
        return self.weight.expand(batch, -1, -1)
