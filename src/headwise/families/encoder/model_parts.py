"""The encoder family's output heads as the spec and the tools know them (their model code is in
:mod:`~headwise.families.encoder.model`): ``mlm``, the masked-LM decoder of pretraining, and
``cls_pooler``, the first-token pooler of GLUE fine-tuning. No torch."""

from __future__ import annotations

from headwise.parts import OUTPUT_HEAD_PARTS, OutputHeadPart, lm_head_params
from headwise.spec import ModelSpec


def _masked_decoder(spec: ModelSpec) -> str:
    return f", a masked-LM decoder without bias ({'tied to' if spec.tie_embeddings else 'apart from'} the embedding)"


def _cls_pooler_params(spec: ModelSpec) -> dict[str, int]:
    h = spec.classifier_hidden or spec.d_model
    return {"pooler": (spec.d_model + 1) * h, "classifier": (h + 1) * (spec.num_classes or 0)}


def _cls_pooler(spec: ModelSpec) -> str:
    what = "one score (a regression)" if spec.num_classes == 1 else f"{spec.num_classes} classes"
    return f", a first-token tanh pooler of width {spec.classifier_hidden or spec.d_model} and {what}"


OUTPUT_HEAD_PARTS.register("mlm", OutputHeadPart(param_counts=lm_head_params, vocabulary=True, causal=False,
                                                 token_encoder=True, masked_vocabulary=True, describe=_masked_decoder,
                                                 noun="bidirectional encoder (a masked language model)",
                                                 hf_class="HeadwiseForMaskedLM"))
OUTPUT_HEAD_PARTS.register("cls_pooler", OutputHeadPart(param_counts=_cls_pooler_params, describe=_cls_pooler,
                                                        hf_class="HeadwiseForSequenceClassification"))
