"""Long Range Arena's pair models as the spec and the tools know them (their model code is in
:mod:`~headwise.families.lra.model`): the ``token_pairs`` front end, which defaults to the
``pair_classes`` head. That head names no ``transformers`` class: a pair model does not export.
No torch."""

from __future__ import annotations

from headwise.parts import (FRONT_END_PARTS, OUTPUT_HEAD_PARTS, FrontEndPart, OutputHeadPart, classifier_params,
                            describe_classes, sequence_positions, token_params)
from headwise.spec import ModelSpec


def _pair_positions(spec: ModelSpec, seq_len: int) -> int:
    # a task's seq_len counts both documents, each a sequence of its own through the blocks
    return sequence_positions(spec, seq_len // 2)


def _pair_classifier_params(spec: ModelSpec) -> dict[str, int]:
    # the classifier reads [u, v, u * v, u - v] of the two pooled documents
    return {"classifier": classifier_params(spec, 4 * spec.d_model)}


FRONT_END_PARTS.register("token_pairs", FrontEndPart(default_outputs="pair_classes", param_counts=token_params,
                                                     positions=_pair_positions, sequences_per_example=2))
OUTPUT_HEAD_PARTS.register("pair_classes", OutputHeadPart(param_counts=_pair_classifier_params, pooled=True,
                                                          describe=describe_classes))
