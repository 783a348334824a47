"""``headwise export RUN_DIR --hf OUT``: a run's model as a folder the Hugging Face ecosystem
loads without headwise.

The folder holds ``config.json`` (with ``auto_map``), ``model.safetensors`` (or shards of at most
``max_shard_size`` with their ``model.safetensors.index.json``, as ``save_pretrained`` writes them)
in the run's dtype (the dtype its weights file holds: a converted bfloat16 checkpoint's stays
bfloat16) or the one ``dtype`` asks for, the modelling code,
the run's ``config.toml`` and a model card (``README.md``); a language model's also the tokenizer
as a ``transformers`` tokenizer and ``generation_config.json``, a masked-LM encoder's its
vocabulary with ``[PAD] [CLS] [SEP] [MASK]`` (:mod:`headwise.hf.masked_tokenizer`), a fine-tuned
encoder's that of its pretraining run (``tokenizer_from``). Each is built from the tokenizer the
run saved in its folder (:mod:`headwise.run.tokenizer`), never from its training text again. The
modelling code is headwise's own modules that the model uses (the model's, its parts' wherever
they are written, and what these import), copied flat with their ``headwise`` imports pointed at
sibling files (and the spec read from ``config.json`` through :mod:`headwise.hf.models.spec_view`):
the exported model computes exactly what headwise does, and
``AutoModelForCausalLM.from_pretrained(OUT, trust_remote_code=True)`` (``AutoModelForMaskedLM``
for an encoder, ``AutoModelForImageClassification`` for a ViT, ...) needs only torch and
transformers. A language model that a native ``transformers`` class expresses is written as that
class instead (``native``, :mod:`headwise.hf.native`: ``LlamaForCausalLM``, ``Qwen3ForCausalLM``,
``LagunaForCausalLM``, or ``GPTNeoForCausalLM`` when asked for, as ``gpt_neo=True`` does), which
needs no remote code.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shutil
import sys
from pathlib import Path

import torch
from torch import nn

from headwise.paths import nearest_existing, staged_folder
from headwise.errors import HeadwiseError, RunFailure
from headwise.hf.models import from_headwise, hf_class, run_model
from headwise.hf.card import model_card
from headwise.model.pretrained import weights_dtype
from headwise.parts import OUTPUT_HEAD_PARTS
from headwise.run.layout import RunDir
from headwise.spec import ModelSpec
from headwise.train.checkpoint import spec_difference

#: The modules whose classes ``auto_map`` names, and where the bundled code starts from
ENTRY_MODULES = ("headwise.hf.models.configuration_headwise", "headwise.hf.models.modeling_headwise")
#: Top-level packages the exported code may import besides the standard library: what a
#: transformers user has (docs/architecture.md, "What exported model code may import")
ALLOWED_IMPORTS = {"torch", "transformers", "safetensors", "numpy"}
#: Modules carried as another: the exported code reads the spec from config.json, without pydantic
_VIEWS = {"headwise.spec": "headwise.hf.models.spec_view"}
_HEADWISE_IMPORT = re.compile(r"^(\s*)from (headwise(?:\.\w+)+) import", re.MULTILINE)
#: ``--dtype`` choices of ``headwise export`` and ``headwise convert``: ``keep`` (the run's dtype, the
#: checkpoint's), or the torch dtype to cast the weights to
DTYPES = ("keep", "float32", "bfloat16", "float16")
_RULE = (f"exported model code may import only the standard library, {', '.join(sorted(ALLOWED_IMPORTS))}, and "
         "headwise modules as `from headwise.<module> import <names>`")


def _source_of(module: str) -> Path:
    """The file of the headwise module ``module`` (a module carried as a view: the view's)."""
    found = importlib.util.find_spec(_VIEWS.get(module, module))
    if found is None or found.origin is None or found.submodule_search_locations is not None:
        raise RunFailure(f"the exported model code needs the module {module}, which is not a headwise module file "
                         "(import names from the module that defines them, not from a package)")
    return Path(found.origin)


def _flat_name(module: str) -> str:
    """The file name (without ``.py``) a headwise module has in the exported folder: its last part."""
    return _VIEWS.get(module, module).rsplit(".", 1)[-1]


def bundled_sources(model: nn.Module) -> dict[str, str]:
    """The exported modelling code of ``model``, file name -> text: the entry modules, the modules
    that define the model's parts (its front end, output head and attention kinds, wherever they
    are written: ``headwise.model`` or a family's folder), and every headwise module these import,
    transitively, each flat-named (``headwise.families.x.heads`` -> ``heads.py``) with its
    headwise imports made relative to the folder. A part's module that nothing imports is imported
    at the end of ``modeling_headwise.py``, so that it registers there too. Each file may import
    only what :data:`_RULE` says, and names its sibling files define; anything else, or two
    modules of one flat name, is a :class:`RunFailure` here rather than in a user's process."""
    carried: dict[str, str] = {}  # flat name -> the module it is
    sources: dict[str, str] = {}
    wanted: list[tuple[str, str, list[str]]] = []  # (importing file, sibling, names)

    def carry(todo: list[str]) -> None:
        while todo:
            module = todo.pop()
            module, flat = _VIEWS.get(module, module), _flat_name(module)
            if carried.setdefault(flat, module) != module:
                raise RunFailure(f"the exported model code needs {carried[flat]} and {module}, which would both be "
                                 f"{flat}.py in the exported folder: rename one of them")
            if f"{flat}.py" in sources:
                continue
            text = _source_of(module).read_text(encoding="utf-8")
            for dependency, names in _imports(module, text):
                wanted.append((flat, _flat_name(dependency), names))
                todo.append(dependency)
            relative = _HEADWISE_IMPORT.sub(lambda m: f"{m.group(1)}from .{_flat_name(m.group(2))} import", text)
            sources[f"{flat}.py"] = relative

    carry(list(ENTRY_MODULES))
    entry = _flat_name(ENTRY_MODULES[-1])
    classes = [part if isinstance(part, type) else type(part) for part in _parts(model)]
    unreached = sorted({(c.__module__, c.__name__) for c in classes if c.__module__ not in carried.values()})
    if unreached:
        sources[f"{entry}.py"] += (
            "\n\n# Added by headwise export: the modules of this model's parts that nothing above imports, so that\n"
            "# they register (and transformers copies them beside this file)\n"
            + "".join(f"from .{_flat_name(module)} import {name}  # noqa: E402,F401\n" for module, name in unreached))
        wanted += [(entry, _flat_name(module), [name]) for module, name in unreached]
        carry([module for module, _ in unreached])
    for name, sibling, names in wanted:
        missing = set(names) - _defined_names(sources[f"{sibling}.py"])
        if missing:
            raise RunFailure(f"{name}.py imports {', '.join(sorted(missing))} from {sibling}, which the exported "
                             f"{sibling}.py does not define")
    return sources


def _parts(model: nn.Module) -> list[object]:
    """The registered parts ``model`` is built from: its front end, output head and attention kinds."""
    return [model.front_end, model.output_head, *(block.attn.kind for block in model.blocks)]


def _imports(module: str, text: str) -> list[tuple[str, list[str]]]:
    """The headwise modules (and names) that the file of ``module`` imports, relative imports
    resolved; refuses any other import but the standard library and :data:`ALLOWED_IMPORTS`."""
    flat, package = _flat_name(module), module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(text)):
        imported: list[str] = []
        if isinstance(node, ast.Import):
            imported = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] == "headwise":
            found.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            found.append((f"{package}.{node.module}", [a.name for a in node.names]))
        elif isinstance(node, ast.ImportFrom):
            imported = [f"{'.' * node.level}{node.module or ''}"]
        for name in imported:
            top = name.split(".")[0]
            if top not in ALLOWED_IMPORTS and top not in sys.stdlib_module_names:
                raise RunFailure(f"{flat}.py imports {name}, which an exported folder cannot carry: {_RULE}")
    return found


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


def chosen_dtype(name: str, kept: torch.dtype) -> torch.dtype:
    """The dtype ``--dtype name`` asks for: ``kept`` for ``keep``, else torch's dtype of that name."""
    if name not in DTYPES:
        raise HeadwiseError(f"--dtype {name!r}: choose one of {', '.join(DTYPES)} (nothing was written)")
    return kept if name == "keep" else getattr(torch, name)


def _check_shard_size(size: str | int | None) -> None:
    """Refuse a ``--max-shard-size`` that ``save_pretrained`` would refuse (it parses it as
    ``huggingface_hub`` does: an int of bytes, or ``"5GB"``, ``"500MB"``, ``"50KB"``)."""
    from huggingface_hub import split_torch_state_dict_into_shards

    if size is None:
        return
    try:
        split_torch_state_dict_into_shards({}, max_shard_size=size)
    except (ValueError, TypeError) as exc:
        raise HeadwiseError(f"--max-shard-size {size}: {exc} (nothing was written)") from None


def export_hf(run_dir: str | Path, out_dir: str | Path, checkpoint: str | Path | None = None,
              gpt_neo: bool = False, native: str = "auto", notes: list[str] | None = None, dtype: str = "keep",
              max_shard_size: str | int | None = None) -> Path:
    """Write a run's model to ``out_dir`` (which must not exist, or be empty) as a Hugging Face
    folder; returns ``out_dir``. ``checkpoint``: one of the run's own checkpoint folders instead
    of its final model (another run's is refused). ``native``: the ``transformers`` class to write
    (:func:`headwise.hf.native.choose`; ``gpt_neo=True`` is ``native="gpt-neo"``); where ``auto``
    falls back to headwise's own class, the line saying why is put in the card and appended to
    ``notes``. ``dtype``: the weights' dtype (one of :data:`DTYPES`; ``keep``: the dtype of the
    weights file read); ``max_shard_size``: shard the weights (``save_pretrained``'s). What
    cannot be exported is refused before anything is written; the folder is written in a
    :func:`~headwise.paths.staged_folder`, so a failure leaves nothing half-written (nor the
    folders made above it)."""
    from transformers.utils.logging import disable_progress_bar

    from headwise.hf.masked_tokenizer import save_masked_hf_tokenizer
    from headwise.hf.native import choose, to_native
    from headwise.hf.tokenizer import save_hf_tokenizer
    from headwise.train.generate import run_config, run_spec, run_tokenizer

    run_dir, out_dir = Path(run_dir), Path(out_dir)
    chosen_dtype(dtype, torch.float32)  # an unknown name is refused before anything is read
    _check_shard_size(max_shard_size)
    _check_out_dir(out_dir)
    cfg = run_config(run_dir)
    model, source, eot_id = run_model(run_dir, checkpoint)
    if not isinstance(model.spec, ModelSpec):
        raise HeadwiseError(f"{run_dir} is a run of a timm model: export it with --timm OUT_DIR (nothing was written)")
    cast = chosen_dtype(dtype, weights_dtype(Path(source) / "model.safetensors"))
    save = {"max_shard_size": max_shard_size} if max_shard_size is not None else {}
    if checkpoint is not None:
        _check_own_checkpoint(model.spec, run_spec(run_dir, cfg), Path(checkpoint), run_dir)
    auto, cls = hf_class(model.spec)
    if gpt_neo and native not in ("auto", "gpt-neo"):
        raise HeadwiseError(f"--gpt-neo and --native {native} name two targets: give one (nothing was written)")
    target, note = choose(model.spec, "gpt-neo" if gpt_neo else native)
    if note is not None and notes is not None:
        notes.append(note)
    language = cls.can_generate()
    # transformers draws a progress bar for writing even a one-file model: noise on a terminal
    disable_progress_bar()
    # the tokenizer's own bos (a converted Llama's <s>), where it has one
    bos_id = run_tokenizer(run_dir, cfg).bos_id if eot_id is not None else None
    with staged_folder(out_dir) as tmp:
        if target is not None:
            hf = to_native(model, target, eot_id, bos_id).to(cast)
            hf.save_pretrained(tmp, **save)
        else:
            hf = save_with_code(model, tmp, eot_id, cast, bos_id, **save)
        if language:
            save_hf_tokenizer(run_dir, tmp)
        elif OUTPUT_HEAD_PARTS[model.spec.output_head].masked_vocabulary:
            save_masked_hf_tokenizer(run_dir, cfg, tmp, model.spec.max_seq_len)
        elif cfg.task.vocabulary_run() is not None:
            # a fine-tuned encoder reads the vocabulary it fine-tuned with (its pretraining run's, saved
            # in its own folder), truncated as fine-tuning truncates
            save_masked_hf_tokenizer(run_dir, cfg, tmp, cfg.task.dims()[1])
        shutil.copyfile(RunDir(run_dir).config, tmp / "headwise_config.toml")
        arch = type(hf).__name__
        card = model_card(run_dir, cfg, model.spec, source, arch, auto, target is None, note)
        (tmp / "README.md").write_text(card, encoding="utf-8")
    return out_dir


def save_with_code(model: nn.Module, folder: Path, eot_id: int | None = None, dtype: torch.dtype = torch.float32,
                   bos_id: int | None = None, **save: object) -> nn.Module:
    """Save ``model`` into ``folder`` as its headwise ``transformers`` class with the code that
    class runs (``config.json`` with ``auto_map``, ``model.safetensors``, :func:`bundled_sources`):
    what loads with ``trust_remote_code=True`` where headwise is not installed. Returns the
    ``transformers`` model, in ``dtype``; ``eot_id``: a language model's end-of-text id (``bos_id``:
    its tokenizer's own beginning-of-text id, where it has one); ``save``:
    ``save_pretrained``'s options (``max_shard_size``)."""
    auto, cls = hf_class(model.spec)
    hf = from_headwise(model, eot_id, bos_id).to(dtype)
    hf.config.auto_map = {"AutoConfig": "configuration_headwise.HeadwiseConfig",
                          auto: f"modeling_headwise.{cls.__name__}"}
    hf.config.architectures = [cls.__name__]
    hf.save_pretrained(folder, **save)
    for name, text in bundled_sources(model).items():
        (folder / name).write_text(text, encoding="utf-8")
    return hf


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


def _check_own_checkpoint(spec: ModelSpec, run: ModelSpec, checkpoint: Path, run_dir: Path) -> None:
    """A ``--checkpoint`` (of model ``spec``) must be one of the run's own (of model ``run``): the
    export writes it under the run's config, losses and command (its card,
    ``headwise_config.toml``), which another run's weights would contradict. It must be inside
    the run, as written or as resolved (a run whose ``checkpoints/`` links elsewhere passes), and
    hold the run's model (not one copied in from elsewhere)."""
    pairs = ((Path(os.path.abspath(checkpoint)), Path(os.path.abspath(run_dir))),
             (checkpoint.resolve(), run_dir.resolve()))
    if not any(path.is_relative_to(folder) for path, folder in pairs):
        raise HeadwiseError(f"--checkpoint {checkpoint} is not a checkpoint of {run_dir} (it is not inside it): the "
                            f"export would describe {run_dir}'s config, losses and command with another model's "
                            f"weights; pass one of {RunDir(run_dir).checkpoints}/*, or export the run the checkpoint "
                            "belongs to (nothing was written)")
    diff = spec_difference(spec, run)
    if diff is not None:
        raise HeadwiseError(f"--checkpoint {checkpoint} holds another model than {run_dir}'s config.toml describes "
                            f"({diff}, checkpoint vs run): it is not a checkpoint of this run (nothing was written)")
