"""Long Range Arena's pair models as the spec and the tools know them (their model code is in
:mod:`~headwise.families.lra.model`): the ``token_pairs`` front end, which defaults to the
``pair_classes`` head. That head names no ``transformers`` class: a pair model does not export.
No torch."""

from __future__ import annotations

from headwise.parts import FRONT_END_PARTS, OUTPUT_HEAD_PARTS, FrontEndPart, OutputHeadPart, describe_classes

FRONT_END_PARTS.register("token_pairs", FrontEndPart(default_outputs="pair_classes"))
OUTPUT_HEAD_PARTS.register("pair_classes", OutputHeadPart(pooled=True, describe=describe_classes))
