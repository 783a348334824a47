"""headwise models in the Hugging Face ecosystem: every spec whose output head names a class,
heterogeneous ones included, as a ``transformers`` model (:class:`HeadwiseForCausalLM` with
``generate()`` and a KV cache, :class:`HeadwiseForMaskedLM`, :class:`HeadwiseForSequenceClassification`,
:class:`HeadwiseForImageClassification`, the generic :class:`HeadwiseModel`;
``save_pretrained``/``from_pretrained``).

Importing this package registers ``model_type = "headwise"`` with ``AutoConfig`` and the
classes with their Auto classes (not ``import headwise`` itself: loading ``transformers`` takes
seconds, which every CLI command would pay). Folders written by :func:`headwise.hf.export.export_hf`
(``headwise export RUN_DIR --hf OUT``) carry their own modelling code and load with
``trust_remote_code=True`` where headwise is not installed.
"""

from __future__ import annotations

from pathlib import Path

import transformers
from transformers import AutoConfig

from headwise.errors import HeadwiseError
from headwise.hf.checkpoint_files import has_safetensors, load_weights
from headwise.hf.models.configuration_headwise import HeadwiseConfig
from headwise.hf.models.modeling_headwise import (
    HF_CLASSES,
    HeadwiseForCausalLM,
    HeadwiseForImageClassification,
    HeadwiseForMaskedLM,
    HeadwiseForSequenceClassification,
    HeadwiseModel,
    HeadwisePreTrainedModel,
)
from headwise.model import Transformer
from headwise.parts import FRONT_END_PARTS, OUTPUT_HEAD_PARTS
from headwise.spec import ModelSpec

__all__ = ["HeadwiseConfig", "HeadwiseForCausalLM", "HeadwiseForImageClassification", "HeadwiseForMaskedLM",
           "HeadwiseForSequenceClassification", "HeadwiseModel", "config_for", "from_headwise", "from_run", "hf_class",
           "load_export", "run_model", "to_headwise"]

AutoConfig.register(HeadwiseConfig.model_type, HeadwiseConfig, exist_ok=True)
for _cls in HF_CLASSES.values():
    getattr(transformers, _cls.auto_class_name).register(HeadwiseConfig, _cls, exist_ok=True)


def hf_class(spec: ModelSpec) -> tuple[str, type[HeadwisePreTrainedModel]]:
    """The Auto class name and the headwise ``transformers`` class for ``spec``: the class its
    output head's declaration names, as its front end's refines it (a HeadwiseError, with the
    reason, for a model whose head names none)."""
    head = OUTPUT_HEAD_PARTS[spec.output_head]
    name = FRONT_END_PARTS[spec.inputs].hf_class(head)
    if name is None:
        exporting = ", ".join(n for n, part in OUTPUT_HEAD_PARTS.items() if part.hf_class is not None)
        raise HeadwiseError(f"no transformers class for a model with inputs {spec.inputs!r} and outputs "
                            f"{spec.output_head!r}: its output head names none (heads that export: {exporting})")
    if name not in HF_CLASSES:
        raise HeadwiseError(f"output head {spec.output_head!r} exports as {name!r}, which is not a headwise "
                            f"transformers class (choices: {', '.join(HF_CLASSES)})")
    cls = HF_CLASSES[name]
    return cls.auto_class_name, cls


def config_for(spec: ModelSpec, eot_id: int | None = None, bos_id: int | None = None) -> HeadwiseConfig:
    """The :class:`HeadwiseConfig` of ``spec``: every field (None included), the output head it
    resolves to and each layer's shape; ``eot_id`` (the tokenizer's end-of-text) becomes the end-
    and padding-token id, and the beginning one unless the tokenizer has its own ``bos_id``."""
    fields = {**spec.model_dump(mode="json"), "output_head": spec.output_head}
    shapes = [{"heads": s.heads, "head_dim": s.head_dim, "mlp_hidden": s.mlp_hidden, "attention": s.attention,
               "kv_heads": s.kv_heads} for s in spec.layers()]
    extra: dict = {} if eot_id is None else {"bos_token_id": eot_id if bos_id is None else bos_id,
                                             "eos_token_id": eot_id, "pad_token_id": eot_id}
    # a head that decodes into the vocabulary has no labels, whatever num_classes says
    if spec.num_classes is not None and not OUTPUT_HEAD_PARTS[spec.output_head].vocabulary:
        extra["num_labels"] = spec.num_classes
    return HeadwiseConfig(spec=fields, layer_shapes=shapes, **extra)


def from_headwise(model: Transformer, eot_id: int | None = None, bos_id: int | None = None) -> HeadwisePreTrainedModel:
    """``model`` as its ``transformers`` class (:func:`hf_class`), with a copy of its weights, in
    eval mode; ``eot_id``: a language model's end-of-text id, for generation; ``bos_id``: its
    tokenizer's own beginning-of-text id where it has one (a converted Llama's ``<s>``)."""
    _, cls = hf_class(model.spec)
    hf = cls(config_for(model.spec, eot_id, bos_id))
    hf.model.load_state_dict(model.state_dict())
    if hf.can_generate():
        # generate() by default stops where the learned positions end (transformers' default is 20 tokens)
        hf.generation_config.max_length = model.spec.max_seq_len
    if eot_id is not None and hf.can_generate():
        hf.generation_config.bos_token_id = hf.config.bos_token_id
        hf.generation_config.eos_token_id = hf.generation_config.pad_token_id = eot_id
    return hf.to(next(model.parameters()).device).eval()


def spec_of(config: HeadwiseConfig) -> ModelSpec:
    """The validated headwise spec a :class:`HeadwiseConfig` carries."""
    fields = {k: v for k, v in config.spec.items() if k != "output_head"}
    return ModelSpec.parse(fields, source="config.json [spec]")


def to_headwise(hf: HeadwisePreTrainedModel) -> Transformer:
    """The headwise :class:`Transformer` of a headwise ``transformers`` model (a copy of its weights)."""
    model = Transformer(spec_of(hf.config))
    model.load_state_dict(hf.model.state_dict())
    return model.eval()


def run_model(run_dir: str | Path, checkpoint: str | Path | None = None) -> tuple[Transformer, str, int | None]:
    """A run's headwise model, where its weights came from (the final weights, else the latest
    checkpoint, or ``checkpoint``, as ``headwise generate`` reads them), and a language run's
    end-of-text id (None for other tasks)."""
    from headwise.train.generate import load_run_model, run_config, run_tokenizer

    run_dir = Path(run_dir)
    cfg = run_config(run_dir)
    model, source = load_run_model(run_dir, Path(checkpoint) if checkpoint is not None else None)
    return model, source, run_tokenizer(run_dir, cfg).eot_id if cfg.task.family.generates_text else None


def from_run(run_dir: str | Path,
             checkpoint: str | Path | None = None) -> tuple[HeadwisePreTrainedModel, str]:
    """The model of a run as its ``transformers`` class, and where its weights came from (see
    :func:`run_model`); a language model gets its tokenizer's end-of-text as eos."""
    model, source, eot_id = run_model(run_dir, checkpoint)
    return from_headwise(model, eot_id), source


def load_export(directory: str | Path) -> Transformer:
    """The headwise model of a folder that :func:`headwise.hf.export.export_hf` wrote (or a
    headwise class's ``save_pretrained``), sharded or not: its spec from ``config.json`` and its weights."""
    directory = Path(directory)
    config_path = directory / "config.json"
    if not config_path.is_file() or not has_safetensors(directory):
        raise HeadwiseError(f"{directory} is not a saved headwise transformers model (it needs config.json and "
                            "model.safetensors, or its shards and their index)")
    config = HeadwiseConfig.from_pretrained(directory)
    if config.model_type != HeadwiseConfig.model_type or not config.spec:
        raise HeadwiseError(f"{config_path} is not a headwise model's config (model_type {config.model_type!r})")
    model = Transformer(spec_of(config))
    prefix = HeadwisePreTrainedModel.base_model_prefix + "."
    state = {k.removeprefix(prefix): v for k, v in load_weights(directory).items()}
    # A tied output layer is saved once, as the embedding
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if model.spec.tie_embeddings else set()
    if set(missing) - tied or unexpected:
        raise HeadwiseError(f"the weights in {directory} do not match {config_path}: missing {sorted(set(missing) - tied)}, "
                            f"unexpected {sorted(unexpected)}")
    return model.eval()


