"""headwise models in the Hugging Face ecosystem: every language-model spec, heterogeneous ones
included, as a ``transformers`` model (:class:`HeadwiseForCausalLM`: ``.logits``, ``generate()``
with a KV cache, ``save_pretrained``/``from_pretrained``).

Importing this package registers ``model_type = "headwise"`` with ``AutoConfig`` and
``AutoModelForCausalLM`` (not ``import headwise`` itself: loading ``transformers`` takes seconds,
which every CLI command would pay). Folders written by :func:`headwise.hf_model.export.export_hf`
(``headwise export RUN_DIR --hf OUT``) carry their own modelling code and load with
``trust_remote_code=True`` where headwise is not installed.
"""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM

from headwise.errors import HeadwiseError
from headwise.hf_model.configuration_headwise import HeadwiseConfig
from headwise.hf_model.modeling_headwise import HeadwiseForCausalLM
from headwise.model import Transformer
from headwise.spec import ModelSpec

__all__ = ["HeadwiseConfig", "HeadwiseForCausalLM", "config_for", "from_headwise", "from_run", "load_export",
           "to_headwise"]

AutoConfig.register(HeadwiseConfig.model_type, HeadwiseConfig, exist_ok=True)
AutoModelForCausalLM.register(HeadwiseConfig, HeadwiseForCausalLM, exist_ok=True)


def config_for(spec: ModelSpec, eot_id: int | None = None) -> HeadwiseConfig:
    """The :class:`HeadwiseConfig` of ``spec``: every field (None included), the output head it
    resolves to and each layer's shape; ``eot_id`` (the tokenizer's end-of-text) becomes the
    beginning-, end- and padding-token id."""
    fields = {**spec.model_dump(mode="json"), "output_head": spec.output_head}
    shapes = [{"heads": s.heads, "head_dim": s.head_dim, "mlp_hidden": s.mlp_hidden, "attention": s.attention}
              for s in spec.layers()]
    tokens = {} if eot_id is None else {"bos_token_id": eot_id, "eos_token_id": eot_id, "pad_token_id": eot_id}
    return HeadwiseConfig(spec=fields, layer_shapes=shapes, **tokens)


def from_headwise(model: Transformer, eot_id: int | None = None) -> HeadwiseForCausalLM:
    """A :class:`HeadwiseForCausalLM` with a copy of ``model``'s weights (in eval mode)."""
    if model.spec.output_head != "lm":
        raise HeadwiseError(f"only language models convert to HeadwiseForCausalLM; this one has outputs = "
                            f"{model.spec.output_head!r}")
    hf = HeadwiseForCausalLM(config_for(model.spec, eot_id))
    hf.model.load_state_dict(model.state_dict())
    if eot_id is not None:
        hf.generation_config.bos_token_id = hf.generation_config.eos_token_id = eot_id
        hf.generation_config.pad_token_id = eot_id
    return hf.to(next(model.parameters()).device).eval()


def spec_of(config: HeadwiseConfig) -> ModelSpec:
    """The validated headwise spec a :class:`HeadwiseConfig` carries."""
    fields = {k: v for k, v in config.spec.items() if k != "output_head"}
    return ModelSpec.parse(fields, source="config.json [spec]")


def to_headwise(hf: HeadwiseForCausalLM) -> Transformer:
    """The headwise :class:`Transformer` of a :class:`HeadwiseForCausalLM` (a copy of its weights)."""
    model = Transformer(spec_of(hf.config))
    model.load_state_dict(hf.model.state_dict())
    return model.eval()


def from_run(run_dir: str | Path, checkpoint: str | Path | None = None) -> HeadwiseForCausalLM:
    """The model of a language-model run as a :class:`HeadwiseForCausalLM`: its final weights
    (or ``checkpoint``), with the run tokenizer's end-of-text as eos."""
    from headwise.train.generate import load_run_model, run_config, run_tokenizer

    run_dir = Path(run_dir)
    cfg = run_config(run_dir)
    model, _ = load_run_model(run_dir, Path(checkpoint) if checkpoint is not None else None)
    return from_headwise(model, run_tokenizer(run_dir, cfg).eot_id)


def load_export(directory: str | Path) -> Transformer:
    """The headwise model of a folder that :func:`headwise.hf_model.export.export_hf` wrote (or
    ``HeadwiseForCausalLM.save_pretrained``): its spec from ``config.json`` and its weights."""
    directory = Path(directory)
    config_path, weights_path = directory / "config.json", directory / "model.safetensors"
    if not config_path.is_file() or not weights_path.is_file():
        raise HeadwiseError(f"{directory} is not a saved HeadwiseForCausalLM (it needs config.json and "
                            "model.safetensors)")
    config = HeadwiseConfig.from_pretrained(directory)
    if config.model_type != HeadwiseConfig.model_type or not config.spec:
        raise HeadwiseError(f"{config_path} is not a headwise model's config (model_type {config.model_type!r})")
    model = Transformer(spec_of(config))
    prefix = HeadwiseForCausalLM.base_model_prefix + "."
    state = {k.removeprefix(prefix): v for k, v in load_file(str(weights_path)).items()}
    # A tied output layer is saved once, as the embedding
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if model.spec.tie_embeddings else set()
    if set(missing) - tied or unexpected:
        raise HeadwiseError(f"{weights_path} does not match {config_path}: missing {sorted(set(missing) - tied)}, "
                            f"unexpected {sorted(unexpected)}")
    return model.eval()


