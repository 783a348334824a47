"""The encoder family's output heads, their model code: the masked-LM decoder ``mlm`` that
pretraining ends in, and the first-token pooler ``cls_pooler`` that GLUE fine-tuning puts in its
place. Their declarations are in :mod:`~headwise.families.encoder.model_parts`; an exported
encoder carries this module (it imports only :mod:`headwise.model`'s modules and torch).
"""

from __future__ import annotations

from torch import Tensor, nn

from headwise.model.outputs import OUTPUT_HEADS, LMHead, OutputHead
from headwise.spec import ModelSpec

#: [PAD] in the masked LM's vocabulary (:data:`headwise.text.masked_vocab.PAD_ID`, which this
#: module cannot import: an exported encoder carries it, and the vocabulary module reads the
#: tokenizer; a test checks the two agree): the token embedding row :meth:`MaskedLMHead.padding_row`
#: keeps at zero when the spec names no ``pad_id`` (pretraining rows hold no padding, so its spec has none)
MASKED_LM_PAD_ID = 0


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
    def forward(model: nn.Module, x: Tensor, pad_vocab: bool, key_mask: Tensor | None = None) -> Tensor:
        return model.classifier(model.pooler(x[:, 0]))

    @staticmethod
    def positions_read(spec: ModelSpec) -> int | None:
        return 1

    @staticmethod
    def padding_row(spec: ModelSpec) -> int | None:
        """The spec's ``pad_id`` (GLUE's [PAD]), as in the encoder this head fine-tunes."""
        return spec.pad_id
