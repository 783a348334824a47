"""headwise: study how a transformer's attention heads are allocated.

The pipeline: spec (:mod:`headwise.spec`, :mod:`headwise.plans`) -> model (:mod:`headwise.model`)
-> tasks and data (:mod:`headwise.tasks`, :mod:`headwise.data`) -> training (:mod:`headwise.train`)
-> studies (:mod:`headwise.study`) -> reports and analysis (:mod:`headwise.analysis`).
"""

from headwise.model import Transformer, load_pretrained, save_pretrained
from headwise.params import count_params
from headwise.plans import Plan, Scheme, plan_heads
from headwise.spec import ModelSpec

__version__ = "0.1.0"
__all__ = ["ModelSpec", "Transformer", "Plan", "Scheme", "plan_heads", "count_params", "save_pretrained",
           "load_pretrained", "__version__"]
