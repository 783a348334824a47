"""headwise: study how a transformer's attention heads are allocated.

The pipeline: spec (:mod:`headwise.spec`, :mod:`headwise.plans`) -> model (:mod:`headwise.model`)
-> task families (:mod:`headwise.families`, one folder each, on :mod:`headwise.tasks` and
:mod:`headwise.data`) -> training (:mod:`headwise.train`)
-> studies (:mod:`headwise.study`) -> reports (:mod:`headwise.report`) and analysis
(:mod:`headwise.analysis`).
"""

from __future__ import annotations

import importlib
from typing import Any

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
    "HeadwiseForSequenceClassification": "headwise.hf.models",
    "HeadwiseForImageClassification": "headwise.hf.models",
}
__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'headwise' has no attribute {name!r}")
