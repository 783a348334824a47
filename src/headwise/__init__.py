"""headwise: study how a transformer's attention heads are allocated.

The pipeline: spec (:mod:`headwise.spec`, the parts' declarations :mod:`headwise.parts`,
:mod:`headwise.plans`, :mod:`headwise.presets`) -> model (:mod:`headwise.model`, its attention
kinds, front ends and output heads as plug-ins) -> task families (:mod:`headwise.families`, one
folder each, on :mod:`headwise.tasks`, :mod:`headwise.data` and :mod:`headwise.text`) -> training
(:mod:`headwise.train`, which leaves a run folder: :mod:`headwise.run`) -> studies
(:mod:`headwise.study`) -> reports (:mod:`headwise.report`) and analysis (:mod:`headwise.analysis`);
beside them the Hugging Face conversions and export (:mod:`headwise.hf`), the speed suite
(:mod:`headwise.bench`) and the command line (:mod:`headwise.cli`, one module per command in
:mod:`headwise.commands`). Every registry of named parts is a :class:`headwise.registry.Registry`.

The names below (``__all__``) load on first use: ``from headwise import ModelSpec`` loads no torch.
"""

from __future__ import annotations

from headwise.lazy import lazy_exports

__version__ = "0.1.0"

# The package's main names, loaded on first use (PEP 562): importing `headwise` alone (the CLI,
# a study's per-run worker) then does not pay for torch.
_EXPORTS = {
    "ModelSpec": "headwise.spec",
    "Transformer": "headwise.model",
    "save_pretrained": "headwise.model",
    "load_pretrained": "headwise.model",
    "count_params": "headwise.params",
    "Plan": "headwise.plans",
    "Scheme": "headwise.plans",
    "plan_heads": "headwise.plans",
    # transformers classes (the hf extra); importing them registers model_type "headwise" with the Auto classes
    "HeadwiseConfig": "headwise.hf.models",
    "HeadwiseForCausalLM": "headwise.hf.models",
    "HeadwiseForMaskedLM": "headwise.hf.models",
    "HeadwiseForSequenceClassification": "headwise.hf.models",
    "HeadwiseForImageClassification": "headwise.hf.models",
    "HeadwiseModel": "headwise.hf.models",
}
__all__ = [*_EXPORTS, "__version__"]
__getattr__ = lazy_exports(__name__, _EXPORTS)
