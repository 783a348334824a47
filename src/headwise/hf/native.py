"""The native ``transformers`` classes ``headwise export`` can write a language model as, instead
of headwise's own ``HeadwiseForCausalLM`` (which loads with ``trust_remote_code=True``).

``--native`` names the target:

- ``llama``, ``qwen3``: ``LlamaForCausalLM`` / ``Qwen3ForCausalLM`` (:mod:`headwise.hf.llama`), for
  a uniform Llama-style model (one query-head count, key/value-head count, head width and MLP width
  for every layer; pre-RMSNorm, RoPE over the whole head, SwiGLU; Qwen3 with q/k RMSNorm);
- ``laguna``: ``LagunaForCausalLM`` (:mod:`headwise.hf.laguna`), for per-layer query heads over one
  key/value-head count and head width, with q/k RMSNorm and a softplus output gate;
- ``gpt-neo``: ``GPTNeoForCausalLM`` (:mod:`headwise.hf.gpt_neo`, what ``--gpt-neo`` writes);
- ``none``: ``HeadwiseForCausalLM``, any spec (its modelling code in the folder);
- ``auto`` (the default): the first of :data:`AUTO_ORDER` that expresses the model, else
  ``HeadwiseForCausalLM`` with one line saying which rule of the nearest native class forced it.
  ``auto`` never picks GPT-Neo: GPT-Neo's attention is computed in another order than headwise's
  (equal to 1e-5, not bit for bit), so the seed works' blocks keep the exact
  ``HeadwiseForCausalLM`` unless ``--native gpt-neo`` asks for it.

A model that is not a language model (an encoder, a classifier) has no native target here; an
explicit target that cannot express the model is refused, with the rule, before anything is written.
Each target is an :class:`~headwise.hf.convert.Architecture` of the registry, which also reads its
class back (``spec_from_config``, ``from_hf``): ``headwise convert`` (:mod:`headwise.hf.importer`)
picks the target of a folder's ``config.json`` from :func:`targets`.
"""

from __future__ import annotations

from typing import Any

from headwise.errors import HeadwiseError
from headwise.hf.architectures import architectures
from headwise.hf.convert import Architecture
from headwise.spec import ModelSpec


def targets() -> dict[str, Architecture]:
    """Every native target, by its ``--native`` name: the registry's causal LMs of ``transformers``."""
    return {name: arch for name, arch in architectures().items() if arch.model_class and arch.head == "lm"}


#: ``--native`` choices: the targets, ``auto`` and ``none``
CHOICES = ("auto", "llama", "qwen3", "laguna", "gpt-neo", "none")
#: what ``auto`` tries, in order (at most one of them fits a spec: Llama has no q/k norms, Qwen3
#: no output gate, Laguna always both)
AUTO_ORDER = ("llama", "qwen3", "laguna")


def _nearest(spec: ModelSpec) -> str:
    """The ``auto`` target whose rule is the one to name when none fits: Laguna for a model with an
    output gate or per-layer query heads, Qwen3 for one with q/k norms, else Llama."""
    if spec.output_gate is not None or len(set(spec.heads)) > 1:
        return "laguna"
    return "qwen3" if spec.qk_norm else "llama"


def choose(spec: ModelSpec, native: str) -> tuple[Architecture | None, str | None]:
    """The native target to write ``spec`` as (None: ``HeadwiseForCausalLM``), and, where ``auto``
    fell back to ``HeadwiseForCausalLM`` for a language model, one line saying which rule forced it.
    An explicit target that cannot express ``spec`` is a HeadwiseError naming the rule."""
    if native not in CHOICES:
        raise HeadwiseError(f"--native {native!r}: choose one of {', '.join(CHOICES)}")
    if native == "none":
        return None, None
    known = targets()
    if native != "auto":
        target = known[native]
        reason = target.incompatibility(spec)
        if reason:
            flag = "--gpt-neo" if native == "gpt-neo" else f"--native {native}"
            raise HeadwiseError(f"{flag}: {target.model_class} cannot express this model: {reason}; export without "
                                f"{flag} (--native auto writes the native class that fits, else headwise's own, "
                                "which takes every spec; nothing was written)")
        return target, None
    if spec.output_head != "lm":
        return None, None
    for name in AUTO_ORDER:
        if known[name].incompatibility(spec) is None:
            return known[name], None
    nearest = known[_nearest(spec)]
    return None, (f"no native transformers class expresses this model ({nearest.model_class}: "
                  f"{nearest.incompatibility(spec)}), so it is exported as HeadwiseForCausalLM, which loads with "
                  "trust_remote_code=True")


def to_native(model: Any, target: Architecture, eot_id: int | None, bos_id: int | None = None) -> Any:
    """``model`` as ``target``'s class, with the tokenizer's end-of-text ``eot_id`` as its eos and
    pad, and its ``bos_id`` (a converted model's own, Llama's ``<s>``) as its bos, else the
    end-of-text too (GPT-2's tokenizer has no bos): in the config and in the generation config."""
    hf = target.to_hf(model)
    if eot_id is not None:
        bos = eot_id if bos_id is None else bos_id
        hf.config.bos_token_id, hf.config.eos_token_id = bos, eot_id
        hf.generation_config.bos_token_id, hf.generation_config.eos_token_id = bos, eot_id
        hf.generation_config.pad_token_id = eot_id
    hf.config.architectures = [target.model_class]
    return hf
