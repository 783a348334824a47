"""The model's parts as the spec and the tools know them, without their model code: one
declaration per input front end (``ModelSpec.inputs``) and per output head (``ModelSpec.outputs``).

A declaration says what checking a spec, counting its parameters and FLOPs
(:mod:`headwise.params`), generating, the model card and export need to know of a part (the head
a front end defaults to, whether it reads a vocabulary, the ``causal`` setting it needs, its exact
parameter count, the ``transformers`` class its models export as, ...), so that no shared file
branches on a part's name. The part's model code (torch) registers under the same name in
:data:`headwise.model.inputs.FRONT_ENDS` or :data:`headwise.model.outputs.OUTPUT_HEADS` where it
is written. This module imports no torch: a spec that uses built-in parts is checked without
loading the model.

The built-in parts (their model code in :mod:`headwise.model`) are declared here. A family
declares its own in its folder's ``model`` or ``model_*`` modules (the encoder's ``mlm`` and
``cls_pooler`` in ``families/encoder/model_parts.py``, LRA's ``token_pairs`` and ``pair_classes``
in ``families/lra/model_parts.py``), which are imported on the first lookup of a name not
declared here or the first listing (:func:`headwise.families.import_family_modules`): checking a
spec that names a family's part loads no torch. The model code's registries import the families'
``model`` and ``model_*`` modules on their first miss, through the discovery this module supplies.
The declarations go in a module of their own: an exported model carries the module of its parts'
model code, which may import only the model's modules::

    # families/toy/model.py: the model code          # families/toy/model_parts.py
    @FRONT_ENDS.register("scalars")                  FRONT_END_PARTS.register("scalars", FrontEndPart(
    class ScalarInputs(FrontEnd): ...                    default_outputs="mean", param_counts=_scalars,
                                                         vocabulary=False))

A test builds every declared pair and checks that the declarations' counts are what it holds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from headwise.layer_shape import divisors
from headwise.model.features import POSITIONS
from headwise.registry import MODEL_CODE, Registry, supply_discovery

if TYPE_CHECKING:
    from headwise.spec import ModelSpec

#: the stem of a family's modules that declare and implement its model parts (``model``,
#: ``model_parts``, ...), which the model code's registries import (:data:`headwise.registry.MODEL_CODE`)
FAMILY_MODULES = "model"
#: the stem of a family's modules that declare its parts (no torch), all this module's registries need
DECLARATIONS = "model_parts"


def _nothing(spec: ModelSpec) -> str:
    return ""


def _no_params(spec: ModelSpec) -> dict[str, int]:
    return {}


def sequence_positions(spec: ModelSpec, seq_len: int) -> int:
    """The positions the blocks see for one sequence of ``seq_len`` units: those and the class
    token, if the model has one (the default :attr:`FrontEndPart.positions`)."""
    return seq_len + has_class_token(spec)


@dataclass(frozen=True)
class FrontEndPart:
    """What the spec and the tools know of a front end (see the module docstring)."""

    #: the output head of a spec that names none
    default_outputs: str
    #: the exact parameter count of the modules the front end builds, per component (weights an
    #: output head ties to them counted here)
    param_counts: Callable[[ModelSpec], dict[str, int]]
    #: the positions T the blocks see for one sequence of a task whose examples are ``seq_len``
    #: long in the task's own units (tokens, points; one image)
    positions: Callable[[ModelSpec, int], int] = sequence_positions
    #: how many sequences through the blocks one example is (2 for a pair of documents)
    sequences_per_example: int = 1
    #: the inputs are token ids: a spec without them has no ``vocab_size``
    vocabulary: bool = True
    #: the ``causal`` setting the inputs need; None: either
    causal: bool | None = None
    #: ``headwise generate`` continues a prompt of token ids with such a model
    prompts: bool = False
    #: spec fields, besides those every model's data fixes (``headwise.train.generate.DATA_FIELDS``),
    #: that the inputs' data fixes (a vector model's width)
    data_fields: tuple[str, ...] = ()
    #: what the model reads, in a few words (the model card's line of totals); None: see :meth:`reads`
    describe: Callable[[ModelSpec], str] | None = None
    #: completes a spec's raw fields before they are checked, given them and the declaration of
    #: the head they resolve to (None: an unknown one): an image model's ``max_seq_len``
    complete: Callable[[dict[str, Any], OutputHeadPart | None], dict[str, Any]] | None = None
    #: the ``transformers`` class a model of these inputs exports as, by the class its head names,
    #: where the two differ (images: an image classifier, not a sequence classifier)
    hf_classes: Mapping[str, str] = field(default_factory=dict)

    def reads(self, spec: ModelSpec) -> str:
        """What ``spec``'s model, of these inputs, reads: :attr:`describe`'s words, else the size of
        its vocabulary ("vocabulary 4,096") or, for inputs without one, their name ("inputs 'scalars'")."""
        if self.describe is not None:
            return self.describe(spec)
        return f"vocabulary {spec.vocab_size:,}" if self.vocabulary else f"inputs {spec.inputs!r}"

    def hf_class(self, head: OutputHeadPart) -> str | None:
        """The ``transformers`` class a model of these inputs and ``head`` exports as (None: none)."""
        return self.hf_classes.get(head.hf_class, head.hf_class) if head.hf_class is not None else None


@dataclass(frozen=True)
class OutputHeadPart:
    """What the spec and the tools know of an output head (see the module docstring)."""

    #: the exact parameter count of the modules the head builds, per component, weights tied to
    #: the front end's not counted again; by default none
    param_counts: Callable[[ModelSpec], dict[str, int]] = _no_params
    #: the head decodes into the vocabulary: the spec needs token inputs with a ``vocab_size``
    vocabulary: bool = False
    #: the ``causal`` setting the head needs; None: either
    causal: bool | None = None
    #: the head classifies one vector pooled from the sequence: the spec needs ``num_classes``,
    #: and with ``pooling = "cls"`` the front end puts a learned class token first for it to read
    pooled: bool = False
    #: its models have a token encoder a fine-tuning run may start from (``train.init_from``)
    token_encoder: bool = False
    #: its vocabulary holds ``[PAD] [CLS] [SEP] [MASK]``: an exported model carries the masked-LM
    #: tokenizer (:mod:`headwise.hf.masked_tokenizer`)
    masked_vocabulary: bool = False
    #: what a model with this head is, in the model card's first sentence
    noun: str = "model"
    #: what the head adds to the model card's line of totals (", 10 classes (cls pooling)")
    describe: Callable[[ModelSpec], str] = _nothing
    #: the class of :mod:`headwise.hf.models.modeling_headwise` its models export as
    #: ("HeadwiseForCausalLM"; "HeadwiseModel", the generic one, returns the head's outputs as
    #: ``.logits``); None: they do not export
    hf_class: str | None = None


def _discover() -> None:
    # imported here, not at the top: the families load on the first miss or listing only
    from headwise.families import import_family_modules

    import_family_modules(DECLARATIONS)


def _discover_model_code() -> None:
    from headwise.families import import_family_modules

    import_family_modules(FAMILY_MODULES)


# The model code's registries find a family's parts through this: in headwise the spec, and so
# this module, is loaded before any model is built; an exported folder imports its parts itself.
supply_discovery(MODEL_CODE, _discover_model_code)


#: every declared front end, by the name ``ModelSpec.inputs`` gives it
FRONT_END_PARTS: Registry[FrontEndPart] = Registry("front end", discover=_discover)
#: every declared output head, by the name ``ModelSpec.outputs`` gives it
OUTPUT_HEAD_PARTS: Registry[OutputHeadPart] = Registry("output head", discover=_discover)


def _image_positions(data: dict[str, Any], head: OutputHeadPart | None) -> dict[str, Any]:
    """An image spec's ``max_seq_len``: its patches plus the class token, checked where given."""
    size, patch, channels = data.get("image_size"), data.get("patch_size"), data.get("channels")
    missing = [k for k, v in (("image_size", size), ("patch_size", patch), ("channels", channels)) if v is None]
    if missing:
        raise ValueError(f"image inputs need {', '.join(missing)} (a task's data sets image_size and channels)")
    if not all(isinstance(v, int) and v > 0 for v in (size, patch)):
        return data  # the field checks say what is wrong
    if size % patch:
        valid = ", ".join(str(p) for p in divisors(size) if p < size)
        raise ValueError(f"image_size {size} is not divisible by patch_size {patch}; patch sizes that divide it: {valid}")
    cls = data.get("pooling", "cls") == "cls" and head is not None and head.pooled
    positions = (size // patch) ** 2 + cls
    given = data.get("max_seq_len")
    if given is not None and given != positions:
        raise ValueError(
            f"max_seq_len {given} differs from the image's {positions} positions ({size // patch}x{size // patch} "
            f"patches{' and the class token' if cls else ''}): remove max_seq_len (an image model's is set from "
            "image_size and patch_size)"
        )
    return {**data, "max_seq_len": positions}


def has_class_token(spec: ModelSpec) -> bool:
    """Whether the sequence starts with a learned class token: a pooled classifier that reads it."""
    return OUTPUT_HEAD_PARTS[spec.output_head].pooled and spec.pooling == "cls"


def class_token_params(spec: ModelSpec) -> int:
    """Parameters of the class token (one d_model vector), if the spec has one."""
    return spec.d_model if has_class_token(spec) else 0


def position_params(spec: ModelSpec) -> int:
    """Parameters of a spec's absolute positions (its :data:`~headwise.model.features.POSITIONS` record's)."""
    return POSITIONS[spec.positions].params(spec)


def token_params(spec: ModelSpec) -> dict[str, int]:
    """Token inputs' parameters: embeddings, the class token, positions."""
    return {"token_embedding": spec.vocab_size * spec.d_model, "class_token": class_token_params(spec),
            "position_embedding": position_params(spec)}


def classifier_params(spec: ModelSpec, in_dim: int) -> int:
    """Parameters of a classifier from ``in_dim`` to the classes: one linear map, or through a
    hidden layer of ``classifier_hidden``."""
    if spec.classifier_hidden is None:
        return (in_dim + 1) * spec.num_classes
    h = spec.classifier_hidden
    return (in_dim + 1) * h + (h + 1) * spec.num_classes


def lm_head_params(spec: ModelSpec) -> dict[str, int]:
    """A decoder into the vocabulary: none of its own when tied to the token embedding."""
    return {"lm_head": 0 if spec.tie_embeddings else spec.vocab_size * spec.d_model}


def _vector_params(spec: ModelSpec) -> dict[str, int]:
    return {"class_token": class_token_params(spec), "position_embedding": position_params(spec)}


def _image_params(spec: ModelSpec) -> dict[str, int]:
    # the patch embedding is a convolution with stride = kernel = patch_size, with bias
    d = spec.d_model
    return {"patch_embedding": spec.channels * spec.patch_size**2 * d + d, **_vector_params(spec)}


def _image_positions_per(spec: ModelSpec, seq_len: int) -> int:
    # an image is one unit of its task, every patch (and the class token) a position
    return spec.max_seq_len * seq_len


def _images(spec: ModelSpec) -> str:
    return f"{spec.image_size} px images, {spec.channels} channels, patch {spec.patch_size}"


def _vectors(spec: ModelSpec) -> str:
    return f"vectors of width {spec.d_model}"


def describe_classes(spec: ModelSpec) -> str:
    """A pooled classifier's words on the model card (", 10 classes (cls pooling)")."""
    return f", {spec.num_classes} classes ({spec.pooling} pooling)"


# the front ends and heads of headwise.model.inputs and headwise.model.outputs
FRONT_END_PARTS.register("tokens", FrontEndPart(default_outputs="lm", param_counts=token_params, prompts=True))
FRONT_END_PARTS.register("vectors", FrontEndPart(default_outputs="vectors", param_counts=_vector_params,
                                                 vocabulary=False, data_fields=("d_model",), describe=_vectors))
FRONT_END_PARTS.register("images", FrontEndPart(
    default_outputs="classes", param_counts=_image_params, positions=_image_positions_per, vocabulary=False,
    causal=False, describe=_images, complete=_image_positions,
    hf_classes={"HeadwiseForSequenceClassification": "HeadwiseForImageClassification"}))

OUTPUT_HEAD_PARTS.register("lm", OutputHeadPart(param_counts=lm_head_params, vocabulary=True, token_encoder=True,
                                                noun="decoder language model", hf_class="HeadwiseForCausalLM"))
OUTPUT_HEAD_PARTS.register("vectors", OutputHeadPart())
OUTPUT_HEAD_PARTS.register("classes", OutputHeadPart(
    param_counts=lambda spec: {"classifier": classifier_params(spec, spec.d_model)}, pooled=True,
    describe=describe_classes, hf_class="HeadwiseForSequenceClassification"))
