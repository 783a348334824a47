"""Every architecture headwise converts to and from, by name: the records of
:mod:`~headwise.hf.gpt_neo`, :mod:`~headwise.hf.vit`, :mod:`~headwise.hf.llama` (Llama, Qwen3),
:mod:`~headwise.hf.laguna` and :mod:`~headwise.hf.openelm`, each an
:class:`~headwise.hf.convert.Architecture`. A new one is a module with its record, named here."""

from __future__ import annotations

from headwise.hf.convert import Architecture
from headwise.hf.gpt_neo import GPT_NEO
from headwise.hf.laguna import LAGUNA
from headwise.hf.llama import LLAMA, QWEN3
from headwise.hf.openelm import OPENELM
from headwise.hf.vit import VIT


def architectures() -> dict[str, Architecture]:
    """Every architecture's record, by name."""
    return {a.name: a for a in (LLAMA, QWEN3, LAGUNA, GPT_NEO, VIT, OPENELM)}
