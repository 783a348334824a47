"""Which ``transformers`` class a model exports as: the class its output head's declaration names
(``OutputHeadPart.hf_class``), as its front end refines it; the generic ``HeadwiseModel``
(``AutoModel``) loads any headwise folder, tied weights included; a folder loaded as another
task-specific class is refused."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="transformers (the hf extra) is not installed")

from transformers import AutoModel, AutoModelForMaskedLM  # noqa: E402

from headwise.hf.models import from_headwise, hf_class  # noqa: E402
from headwise.model import Transformer  # noqa: E402
from headwise.spec import ModelSpec  # noqa: E402
from tests.helpers import one_line_error  # noqa: E402

#: the fields every spec below shares
BASE = dict(d_model=16, n_layers=1, heads=[2], max_seq_len=12)


@pytest.mark.parametrize("fields, auto, name", [
    (dict(vocab_size=30), "AutoModelForCausalLM", "HeadwiseForCausalLM"),
    (dict(vocab_size=30, outputs="mlm", causal=False), "AutoModelForMaskedLM", "HeadwiseForMaskedLM"),
    (dict(vocab_size=30, outputs="classes", num_classes=3, causal=False), "AutoModelForSequenceClassification",
     "HeadwiseForSequenceClassification"),
    (dict(vocab_size=30, outputs="cls_pooler", num_classes=3, causal=False), "AutoModelForSequenceClassification",
     "HeadwiseForSequenceClassification"),
    (dict(inputs="images", image_size=8, patch_size=4, channels=3, num_classes=5, max_seq_len=None, causal=False),
     "AutoModelForImageClassification", "HeadwiseForImageClassification"),
])
def test_each_head_exports_as_the_class_its_declaration_names(fields, auto, name):
    spec = ModelSpec(**{**BASE, **fields})
    got_auto, cls = hf_class(spec)
    assert (got_auto, cls.__name__) == (auto, name)


def test_a_head_that_names_no_class_is_refused():
    spec = ModelSpec(**{**BASE, "inputs": "token_pairs", "vocab_size": 30, "num_classes": 2, "causal": False})
    one_line_error(hf_class, spec, match="no transformers class for a model with inputs 'token_pairs' and outputs "
                                         "'pair_classes': its output head names none")


@pytest.mark.parametrize("tie", [True, False])
def test_the_generic_class_loads_any_folder_and_other_classes_are_refused(tmp_path, tie):
    torch.manual_seed(0)
    model = Transformer(ModelSpec(**BASE, vocab_size=30, tie_embeddings=tie)).eval()
    from_headwise(model).save_pretrained(tmp_path)
    loaded = AutoModel.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, 30, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert type(loaded).__name__ == "HeadwiseModel" and torch.equal(loaded(ids).logits, model(ids))
    with pytest.raises(ValueError, match="saved as HeadwiseForCausalLM"):
        AutoModelForMaskedLM.from_pretrained(tmp_path)
