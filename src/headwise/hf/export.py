"""``headwise export RUN_DIR --hf OUT``: a run's model as a folder the Hugging Face ecosystem
loads without headwise.

The folder holds ``config.json`` (with ``auto_map``), ``model.safetensors``, the modelling code,
the run's ``config.toml`` and a model card (``README.md``); a language model's also the tokenizer
as a ``transformers`` tokenizer and ``generation_config.json``, a masked-LM encoder's its
vocabulary with ``[PAD] [CLS] [SEP] [MASK]`` (:mod:`headwise.hf.masked_tokenizer`), a fine-tuned
encoder's that of its pretraining run (``tokenizer_from``). Each is built from the tokenizer the
run saved in its folder (:mod:`headwise.run.tokenizer`), never from its training text again. The
modelling code is headwise's own model modules, copied with their ``headwise`` imports pointed at
sibling files (and the spec read from ``config.json`` through :mod:`headwise.hf.models.spec_view`):
the exported model computes exactly what headwise does, and
``AutoModelForCausalLM.from_pretrained(OUT, trust_remote_code=True)`` (``AutoModelForMaskedLM``
for an encoder, ``AutoModelForImageClassification`` for a ViT, ...) needs only torch and
transformers. ``gpt_neo=True`` writes a plain ``GPTNeoForCausalLM`` instead,
for specs GPT-Neo expresses.
"""

from __future__ import annotations

import ast
import re
import shutil
import sys
import tempfile
from pathlib import Path

import headwise.hf.models as hf_models_package
import headwise.model as model_package
from headwise.paths import nearest_existing
from headwise.errors import HeadwiseError, RunFailure
from headwise.hf.models import from_headwise, hf_class, run_model
from headwise.hf.card import model_card
from headwise.run.layout import RunDir
from headwise.spec import ModelSpec

#: The modules whose classes ``auto_map`` names, and where the bundled code starts from
ENTRY_MODULES = ("configuration_headwise", "modeling_headwise")
#: Top-level packages the exported code may import: what a transformers user has
ALLOWED_IMPORTS = {"torch", "transformers", "safetensors", "numpy"}

_PACKAGES = {"headwise.model": Path(model_package.__file__).parent,
             "headwise.hf.models": Path(hf_models_package.__file__).parent}
_SPEC_MODULE = "headwise.spec"
_IMPORT = re.compile(r"^(\s*)from (headwise\.(?:model|hf\.models)\.(\w+)|headwise\.spec) import", re.MULTILINE)


def _source_of(name: str) -> Path:
    """The file of a bundled module, by its flat name (``transformer``, ``spec_view``)."""
    for directory in _PACKAGES.values():
        if (directory / f"{name}.py").is_file():
            return directory / f"{name}.py"
    raise RunFailure(f"the exported model code needs a module {name!r} that headwise does not have")


def _flat_name(module: str) -> str:
    return "spec_view" if module == _SPEC_MODULE else module.rsplit(".", 1)[1]


def bundled_sources() -> dict[str, str]:
    """The exported modelling code, file name -> text: the entry modules and every headwise
    module they import, transitively, with those imports made relative to the folder. Each
    file may import only the standard library, :data:`ALLOWED_IMPORTS` and names its sibling
    files define; anything else is a :class:`RunFailure` here rather than in a user's process."""
    sources: dict[str, str] = {}
    wanted: list[tuple[str, str, list[str]]] = []  # (importing file, sibling module, names)
    todo = list(ENTRY_MODULES)
    while todo:
        name = todo.pop()
        if f"{name}.py" in sources:
            continue
        text = _IMPORT.sub(lambda m: f"{m.group(1)}from .{_flat_name(m.group(2))} import",
                           _source_of(name).read_text(encoding="utf-8"))
        for module, names in _imports(name, text):
            wanted.append((name, module, names))
            todo.append(module)
        sources[f"{name}.py"] = text
    for name, module, names in wanted:
        missing = set(names) - _defined_names(sources[f"{module}.py"])
        if missing:
            raise RunFailure(f"{name}.py imports {', '.join(sorted(missing))} from {module}, which the exported "
                             f"{module}.py does not define")
    return sources


def _imports(name: str, text: str) -> list[tuple[str, list[str]]]:
    """The sibling modules (and names) a bundled file imports; refuses any other import but the
    standard library and :data:`ALLOWED_IMPORTS` (the model modules must stay self-contained)."""
    siblings = []
    for node in ast.walk(ast.parse(text)):
        modules = []
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            siblings.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.ImportFrom):
            modules = [f"{'.' * node.level}{node.module or ''}"]
        for module in modules:
            top = module.split(".")[0]
            if top not in ALLOWED_IMPORTS and top not in sys.stdlib_module_names:
                raise RunFailure(f"{name}.py imports {module}, which an exported folder cannot carry: "
                                 "the model modules may import only torch, transformers and each other")
    return siblings


def _defined_names(text: str) -> set[str]:
    """Names a module defines at its top level (classes, functions, assignments, imports)."""
    names: set[str] = set()
    for node in ast.parse(text).body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def export_hf(run_dir: str | Path, out_dir: str | Path, checkpoint: str | Path | None = None,
              gpt_neo: bool = False) -> Path:
    """Write a run's model to ``out_dir`` (which must not exist, or be empty) as a Hugging Face
    folder; returns ``out_dir``. What cannot be exported is refused before anything is written;
    the folder is written beside it and moved into place last, so a failure leaves nothing
    half-written (nor the folders made above it)."""
    from transformers.utils.logging import disable_progress_bar

    from headwise.hf.masked_tokenizer import save_masked_hf_tokenizer
    from headwise.hf.tokenizer import save_hf_tokenizer
    from headwise.train.generate import run_config

    run_dir, out_dir = Path(run_dir), Path(out_dir)
    _check_out_dir(out_dir)
    cfg = run_config(run_dir)
    model, source, eot_id = run_model(run_dir, checkpoint)
    auto, cls = hf_class(model.spec)
    if gpt_neo:
        _check_gpt_neo(model.spec)
    language = cls.can_generate()
    # transformers draws a progress bar for writing even a one-file model: noise on a terminal
    disable_progress_bar()
    made = _make_folders(out_dir.parent)
    tmp: Path | None = None
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
        if gpt_neo:
            hf = _gpt_neo(model, eot_id)
        else:
            hf = from_headwise(model, eot_id)
            hf.config.auto_map = {"AutoConfig": "configuration_headwise.HeadwiseConfig",
                                  auto: f"modeling_headwise.{cls.__name__}"}
            hf.config.architectures = [cls.__name__]
        hf.save_pretrained(tmp)
        if not gpt_neo:
            for name, text in bundled_sources().items():
                (tmp / name).write_text(text, encoding="utf-8")
        if language:
            save_hf_tokenizer(run_dir, tmp)
        elif model.spec.output_head == "mlm":
            save_masked_hf_tokenizer(run_dir, cfg, tmp, model.spec.max_seq_len)
        elif cfg.task.vocabulary_run() is not None:
            # a fine-tuned encoder reads the vocabulary it fine-tuned with (its pretraining run's, saved
            # in its own folder), truncated as fine-tuning truncates
            save_masked_hf_tokenizer(run_dir, cfg, tmp, cfg.task.dims()[1])
        shutil.copyfile(RunDir(run_dir).config, tmp / "headwise_config.toml")
        arch = type(hf).__name__
        (tmp / "README.md").write_text(model_card(run_dir, cfg, model.spec, source, arch, auto, not gpt_neo),
                                       encoding="utf-8")
        if out_dir.exists():
            out_dir.rmdir()
        tmp.rename(out_dir)
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        for folder in reversed(made):  # the folders made above OUT_DIR go too, deepest first
            folder.rmdir()
        raise
    return out_dir


def _check_out_dir(out_dir: Path) -> None:
    """``out_dir`` must be a new (or empty) folder that can be made: refused, with the reason,
    before anything is read or written."""
    if out_dir.exists() and not out_dir.is_dir():
        raise HeadwiseError(f"--hf {out_dir} is a file: give a new folder to export into (nothing was written)")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        raise HeadwiseError(f"{out_dir} already exists and is not empty: give a new folder (nothing was written)")
    existing = nearest_existing(out_dir)
    if not existing.is_dir():
        raise HeadwiseError(f"--hf {out_dir}: {existing} is a file, so the folder cannot be made there; give "
                            "another path (nothing was written)")


def _make_folders(folder: Path) -> list[Path]:
    """Make ``folder`` and its missing parents; returns those it made, outermost first."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()][::-1]
    for path in missing:
        path.mkdir()
    return missing


def _check_gpt_neo(spec: ModelSpec) -> None:
    """Refuse, with the reason, a spec GPT-Neo cannot express (before anything is written)."""
    from headwise.hf.gpt_neo import gpt_neo_incompatibility

    reason = gpt_neo_incompatibility(spec)
    if reason:
        raise HeadwiseError(f"--gpt-neo: GPT-Neo cannot express this model: {reason}; export without --gpt-neo "
                            "(headwise's own transformers classes take every spec)")


def _gpt_neo(model, eot_id: int):
    """The run's model as ``GPTNeoForCausalLM`` (its spec checked by :func:`_check_gpt_neo`)."""
    from headwise.hf.gpt_neo import to_hf

    hf = to_hf(model)
    hf.config.bos_token_id = hf.config.eos_token_id = eot_id
    hf.generation_config.bos_token_id = hf.generation_config.eos_token_id = eot_id
    hf.generation_config.pad_token_id = eot_id
    return hf
