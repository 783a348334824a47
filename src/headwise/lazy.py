"""A package's names loaded from their modules on first use (PEP 562): importing the package then
loads none of those modules, so what needs no torch (a spec, a run config, a study's dry run)
does not pay for it."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """The module-level ``__getattr__`` of ``package``: ``exports`` maps a name to the module that
    defines it; the first use imports that module and keeps the name in the package."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
