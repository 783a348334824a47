"""``headwise convert``: a ``transformers`` causal LM (a local folder, or a hub name) as a headwise
run directory that every run command reads (``analyze``, ``eval``, ``generate``, ``export``, and
``train`` with ``train.init_from``).

The classes it reads are the native targets of ``headwise export`` (:mod:`headwise.hf.native`:
``LlamaForCausalLM``, ``Qwen3ForCausalLM``, ``LagunaForCausalLM``, ``GPTNeoForCausalLM``), each
converted by its own ``from_hf``. The run it writes is laid out as ``headwise train`` lays one out
(:mod:`headwise.run.layout`):

- ``config.toml``: ``[model]`` the converted spec; the other tables those of the folder's
  ``headwise_config.toml`` when ``headwise export`` wrote it (the original run's data and
  settings), else headwise's defaults (language modelling on TinyStories); ``--set`` overrides them
  (data it names must exist, as ``headwise train`` requires);
- ``model/``: the weights as the trainer saves its final model, in the checkpoint's dtype (the one
  ``transformers`` loads it in by default: its ``config.json``'s ``dtype``, else its weights') or
  the one ``dtype`` asks for (``--dtype``), and ``checkpoints/step_00000000/``
  the same files (hard links where the file system allows), so ``headwise analyze`` measures them.
  It has no trainer state: a converted model is trained on with ``train.init_from``, never ``--resume``;
- ``tokenizer.json`` / the summary's tokenizer record: the folder's tokenizer as a headwise
  tokenizer that gives exactly its ids (:func:`headwise.hf.tokenizer.from_hf_tokenizer`): GPT-2's
  is ``gpt-neo``, one ``headwise export`` wrote is its ``bpe:N``, any other (Llama's, Qwen3's)
  is ``hf:N``, the folder's ``tokenizer.json`` with the model's eos as end-of-text (a folder
  without a tokenizer, or with one headwise cannot encode with, is converted without one; a
  damaged tokenizer file is refused, named);
- ``summary.json``: status ``completed`` after 0 steps, its ``task`` facts saying where the model
  came from (``converted_from``: the source, its class, the transformers version, the checkpoint's
  dtype and the run's, the logits check).

The weights are one ``model.safetensors`` or shards named by ``model.safetensors.index.json``
(read by ``transformers``' own reader, :func:`transformers.utils.hub.get_checkpoint_shard_files`);
a damaged file (a truncated shard, an index that does not parse, names a missing shard or a tensor
its shard does not hold) is refused in one line naming it, as is a damaged tokenizer file.

Before anything is written the converted model's logits are compared with the ``transformers``
model's on random ids; everything is written into a folder beside ``--out`` and renamed into place
last, so a refusal or a failure leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from headwise.config import apply_overrides, describe_validation_error, read_toml
from headwise.errors import HeadwiseError
from headwise.hf.checkpoint_files import SAFETENSORS, SHARD_INDEX, check_weights
from headwise.hf.convert import Architecture
from headwise.hf.native import targets
from headwise.model import Transformer
from headwise.model.pretrained import DamagedFile, first_line
from headwise.params import count_params, kv_cache_budget
from headwise.plans import Plan
from headwise.run.summary import RunStatus, RunSummary
from headwise.run.tokenizer import tokenizer_record
from headwise.spec import ModelSpec
from headwise.text.tokenizer import Tokenizer
from headwise.train.config import RunConfig, resolve_run_model, resolved_config
from headwise.train.run_folder import check_new_run_folder, write_run_atomically

#: ``--class`` choices besides ``auto``: the native targets that have a ``from_hf``
CLASSES = ("llama", "qwen3", "laguna", "gpt-neo")
#: what a folder's weights may be called (sharded ones through their index)
WEIGHT_FILES = (SAFETENSORS, SHARD_INDEX, "pytorch_model.bin",
                "pytorch_model.bin.index.json")
#: files that make a tokenizer
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "tokenizer.model")
#: a tokenizer's JSON files, each read before ``transformers`` reads them, so that a damaged one is named
TOKENIZER_JSON = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                  "vocab.json")
#: what a hub download fetches: configs, safetensors weights and tokenizer files (``*.bin`` only
#: where a model has no safetensors: many repositories hold both)
HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.toml"]
#: a hub name: ``name`` or ``owner/name``; anything else (``./x``, ``/x``, ``a/b/c``) is a path
HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
#: how many random ids the logits check feeds, and its tolerance relative to the largest logit
CHECK_IDS, CHECK_TOLERANCE = 16, 1e-4
#: the ``--set`` keys that choose the run's data (checked as headwise train checks them)
DATA_KEYS = ("task.source", "task.validation", "task.format", "task.field", "task.split")
#: the [train] length of a written config (headwise train's --set changes it)
TRAIN_STEPS = 1000


@dataclass(frozen=True)
class Converted:
    """What :func:`convert` wrote."""

    out: Path
    model_class: str
    spec: ModelSpec
    tokenizer: str | None
    #: the largest |logit difference| against the transformers model on the check's ids
    max_diff: float
    #: the dtype of the run's weights (torch's name: ``"bfloat16"``)
    dtype: str


def source_folder(src: str) -> tuple[Path, bool]:
    """The local folder of ``src`` and whether it came from the hub: a path that exists is the
    folder; a hub name is downloaded (or found in the cache with ``HF_HUB_OFFLINE=1``)."""
    path = Path(src).expanduser()
    if path.exists():
        if not path.is_dir():
            raise HeadwiseError(f"{src} is a file: give a transformers model folder (config.json and weights) or "
                                "a hub name (nothing was written)")
        return path, False
    if not HUB_NAME.fullmatch(src):
        raise HeadwiseError(f"{src} does not exist: give a transformers model folder or a hub name (nothing was "
                            "written)")
    return _download(src), True


def _download(name: str) -> Path:
    """The snapshot of hub model ``name`` (configs, weights, tokenizer files), downloaded into the
    Hugging Face cache unless ``HF_HUB_OFFLINE`` asks for the cache alone."""
    from huggingface_hub import snapshot_download

    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    try:
        folder = Path(snapshot_download(name, allow_patterns=HUB_FILES, local_files_only=offline))
        if not list(folder.glob("*.safetensors")):
            folder = Path(snapshot_download(name, allow_patterns=[*HUB_FILES, "*.bin"], local_files_only=offline))
    except Exception as exc:  # huggingface_hub raises a family of errors (offline, missing, gated, network)
        if offline:
            raise HeadwiseError(f"{name} is not a folder here, and not in the Hugging Face cache as a hub model "
                                "(HF_HUB_OFFLINE is set, so nothing is downloaded): give a local folder, or "
                                "unset HF_HUB_OFFLINE (nothing was written)") from None
        raise HeadwiseError(f"{name} is not a folder here, and the Hugging Face hub does not give it "
                            f"({first_line(exc)}) (nothing was written)") from None
    return folder


def choose_target(config: dict[str, Any], cls: str, where: Path) -> Architecture:
    """The converter of a folder's ``config.json`` (``config``): ``cls`` names it, or ``auto``
    takes the one of its ``architectures``, else of its ``model_type``."""
    known = {name: t for name, t in targets().items() if name in CLASSES}
    model_type = config.get("model_type")
    archs = config.get("architectures") or []
    supported = ", ".join(t.model_class for t in known.values())
    if cls != "auto":
        if cls not in known:
            raise HeadwiseError(f"--class {cls}: choose auto or one of {', '.join(CLASSES)}")
        target = known[cls]
        if model_type != target.arch:
            raise HeadwiseError(f"--class {cls} reads {target.arch!r} models, but {where} has model_type "
                                f"{model_type!r}: use --class auto (nothing was written)")
        return target
    by_class = {t.model_class: t for t in known.values()}
    for arch in archs:
        if arch in by_class:
            return by_class[arch]
    for target in known.values():
        if not archs and model_type == target.arch:
            return target
    what = archs[0] if archs else f"model_type {model_type!r}"
    raise HeadwiseError(f"{where} is a {what} model: headwise convert reads {supported} (nothing was written)")


def _tokenizer(folder: Path, vocab_size: int) -> tuple[Tokenizer | None, str | None]:
    """The headwise tokenizer of the folder's tokenizer, or None and why there is none; a damaged
    tokenizer file is refused, named (:func:`_check_tokenizer_files`), as are files that
    ``transformers`` cannot read otherwise."""
    from transformers import AutoTokenizer

    from headwise.hf.tokenizer import from_hf_tokenizer

    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return None, f"{folder} has no tokenizer ({', '.join(TOKENIZER_FILES)})"
    try:
        _check_tokenizer_files(folder)
        hf = AutoTokenizer.from_pretrained(str(folder))
    except Exception as exc:  # a damaged file, a tokenizer class that needs a missing package, ...
        why = str(exc) if isinstance(exc, DamagedFile) else first_line(exc)
        raise HeadwiseError(f"{folder}: its tokenizer cannot be read ({why}); repair or remove its tokenizer files "
                            "(nothing was written)") from None
    tokenizer, why = from_hf_tokenizer(hf, vocab_size)
    return tokenizer, None if tokenizer is not None else f"its tokenizer: {why}"


def _check_tokenizer_files(folder: Path) -> None:
    """A :class:`DamagedFile` naming a damaged tokenizer file: each of :data:`TOKENIZER_JSON` must
    be a JSON object, and ``tokenizer.json`` a file the ``tokenizers`` library reads."""
    from tokenizers import Tokenizer as Backend

    for path in (folder / name for name in TOKENIZER_JSON):
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_bytes().decode("utf-8"))
        except ValueError as exc:  # JSON and UTF-8 errors alike
            raise DamagedFile(path, f"it is not JSON ({first_line(exc)})") from None
        if not isinstance(data, dict):
            raise DamagedFile(path, f"it is a JSON {type(data).__name__}, not an object")
    path = folder / "tokenizer.json"
    if path.is_file():
        try:
            Backend.from_file(str(path))
        except Exception as exc:  # tokenizers raises plain Exceptions for what it cannot read
            raise DamagedFile(path, f"the tokenizers library cannot read it ({first_line(exc)})") from None


def _load(folder: Path, target: Architecture) -> tuple[Any, torch.dtype]:
    """The folder's model as ``target``'s class, every weight read from the folder, in float32 (the
    converted copy and the check are then exact), and the dtype ``transformers`` loads it in by
    default (``dtype="auto"``: its ``config.json``'s, else its weights'), the checkpoint's."""
    import transformers
    from transformers.utils import logging

    cls = getattr(transformers, target.model_class)
    logging.disable_progress_bar()
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # transformers warns of every unused key: what matters is checked below
    try:
        # mismatched sizes come back in `info`, named, rather than as an error that points at a
        # report transformers logs (and that the verbosity above hides)
        hf, info = cls.from_pretrained(str(folder), dtype="auto", output_loading_info=True,
                                       ignore_mismatched_sizes=True)
    except Exception as exc:  # a damaged or foreign weights file
        raise HeadwiseError(f"{folder}: {target.model_class} cannot load it ({first_line(exc)}) "
                            "(nothing was written)") from None
    finally:
        logging.set_verbosity(verbosity)
    missing = sorted(k for k in info.get("missing_keys", ())
                     if not (k == "lm_head.weight" and hf.config.tie_word_embeddings))
    mismatched = sorted(info.get("mismatched_keys", ()))
    if missing:
        raise HeadwiseError(f"{folder}: its weights do not fit its config.json (missing {missing[0]}) (nothing was "
                            "written)")
    if mismatched:
        name, saved, expected = mismatched[0]
        raise HeadwiseError(f"{folder}: its weights do not fit its config.json ({name} is {list(saved)} in the "
                            f"weights file, {list(expected)} by config.json) (nothing was written)")
    kept = hf.dtype
    return hf.float().eval(), kept


@torch.no_grad()
def logits_difference(ours: Transformer, hf: Any) -> float:
    """The largest |logit difference| of the two models on :data:`CHECK_IDS` random ids, as a
    fraction of the largest |logit| (at least 1)."""
    n = min(CHECK_IDS, ours.spec.max_seq_len)
    ids = torch.randint(0, ours.spec.vocab_size, (2, n), generator=torch.Generator().manual_seed(0))
    theirs = hf(ids).logits
    return float((ours(ids) - theirs).abs().max()) / max(1.0, float(theirs.abs().max()))


def run_config(spec: ModelSpec, folder: Path, tokenizer: Tokenizer | None, overrides: list[str],
               notes: list[str]) -> RunConfig:
    """The run's config: ``[model]`` the spec, the other tables the folder's ``headwise_config.toml``
    (a headwise export's) or headwise's defaults, then ``overrides`` (not of the model, nor the tokenizer)."""
    data: dict[str, Any] = {
        "task": {"kind": "lm", "block_size": min(256, spec.max_seq_len)},
        "train": {"steps": TRAIN_STEPS},
    }
    saved = folder / "headwise_config.toml"
    if saved.is_file():
        try:
            original = RunConfig.parse(read_toml(saved), source=str(saved)).to_dict()
            if original["task"].get("kind", "lm") != "lm":
                raise HeadwiseError(f"its task is {original['task']['kind']!r}, not language modelling")
            data = {k: v for k, v in original.items() if k != "model"}
            # the weights come from the folder now, not from the run that the original was fine-tuned from
            for key in ("init_from", "init_checkpoint"):
                data["train"].pop(key, None)
        except HeadwiseError as exc:
            notes.append(f"{saved} is not used ({exc}): the run's [task] and [train] are headwise's defaults")
    data["task"]["tokenizer"] = tokenizer.spec if tokenizer is not None else "gpt-neo"
    for item in overrides:
        key = item.partition("=")[0].strip()
        if key.startswith("model.") or key == "task.tokenizer":
            raise HeadwiseError(f"--set {item}: the model and its tokenizer are the checkpoint's (set the other "
                                "tables: task.source, train.steps, ...)")
    apply_overrides(data, overrides)
    data["model"] = spec.to_dict()
    cfg = RunConfig.parse(data, source="headwise convert's config")
    _check_data(cfg, overrides)
    if tokenizer is not None:
        # what headwise train would check of this config: the model fits the task (a tokenizer-less
        # run has no task to train on)
        resolved, _ = resolve_run_model(cfg.to_dict(), source="headwise convert's config")
        if resolved != spec:
            raise HeadwiseError("the task of this config changes the model (--set task.*): nothing was written")
    return resolved_config(cfg, spec)


def _check_data(cfg: RunConfig, overrides: list[str]) -> None:
    """Data that ``overrides`` name must exist, as ``headwise train`` checks it first
    (:func:`headwise.text.data_plan.plan_data`): a run naming missing data is refused before
    anything is written. Data nobody named (the defaults, or the export's) is not looked up: it
    may be a hub dataset, and the run is used without it (generate, export)."""
    from headwise.text.data_plan import DataConfig, plan_data

    named = [item for item in overrides if item.partition("=")[0].strip() in DATA_KEYS]
    if named and isinstance(cfg.task, DataConfig):
        try:
            plan_data(cfg.task)
        except HeadwiseError as exc:
            raise HeadwiseError(f"--set {' '.join(named)}: {exc} (nothing was written)") from None


def _summary(spec: ModelSpec, tokenizer: Tokenizer | None, facts: dict[str, Any]) -> RunSummary:
    """A summary of 0 steps whose task facts say where the model came from (``facts``)."""
    record = tokenizer_record(tokenizer)
    if record is None:
        # recorded, so that reading the run's tokenizer stops with this reason rather than taking
        # the config's placeholder ("gpt-neo") for the ids the model was trained with
        why = f"headwise convert wrote this run without a tokenizer: {facts['tokenizer_note']}"
        record = {"spec": "none", "why": why}
    data = f"converted from {facts['source']} ({facts['class']}) by headwise convert; not trained by headwise"
    return RunSummary(status=RunStatus.COMPLETED, params=count_params(spec), d_model=spec.d_model,
                      plan=Plan.explicit(spec.heads).with_head_dims(spec.head_dims), steps=0, total_steps=0,
                      kv_cache_bytes_per_token=kv_cache_budget(spec) if spec.causal else None,
                      task={"task": "lm", "data": data, "converted_from": facts}, tokenizer=record)


def _read_source(src: str, cls: str) -> tuple[Path, bool, Architecture, Any, ModelSpec]:
    """The folder of ``src``, whether it came from the hub, its converter, its ``transformers``
    config and the spec of that config: everything refused before any weight is read."""
    import transformers

    folder, hub = source_folder(src)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise HeadwiseError(f"{src} is not a transformers model folder (no config.json) (nothing was written)")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HeadwiseError(f"{config_path} cannot be read as JSON ({first_line(exc)}) (nothing was written)") from None
    target = choose_target(config if isinstance(config, dict) else {}, cls, folder)
    try:
        hf_config = getattr(transformers, target.model_class).config_class.from_pretrained(str(folder))
    except Exception as exc:  # transformers checks the config's fields as it reads them
        raise HeadwiseError(f"{config_path} is not a {target.model_class} config ({first_line(exc)}) "
                            "(nothing was written)") from None
    try:
        spec = target.spec_from_config(hf_config)
    except HeadwiseError as exc:  # the converter's own reason (MoE layers, another RoPE, ...)
        raise HeadwiseError(f"{src}: {exc} (nothing was written)") from None
    except ValidationError as exc:  # a spec field out of range
        why = describe_validation_error(ModelSpec, exc, "its headwise spec")
        raise HeadwiseError(f"cannot convert {src}: {why} (nothing was written)") from None
    except (ValueError, TypeError) as exc:  # a config value the converter cannot compute with
        raise HeadwiseError(f"cannot convert {src}: {first_line(exc)} (nothing was written)") from None
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise HeadwiseError(f"{src} has no weights ({', '.join(WEIGHT_FILES)}) (nothing was written)")
    try:
        check_weights(folder)
    except DamagedFile as exc:
        raise HeadwiseError(f"{exc}; repair or replace it (nothing was written)") from None
    return folder, hub, target, hf_config, spec


def convert(src: str, out: str | Path, cls: str = "auto", overrides: list[str] | None = None,
            notes: list[str] | None = None, dtype: str = "keep") -> Converted:
    """Write the ``transformers`` causal LM ``src`` (a folder, or a hub name) as a headwise run in
    ``out`` (a new or empty folder), converted by ``cls``'s ``from_hf`` (``auto``: the one its
    ``config.json`` names), its weights in the checkpoint's dtype (``keep``) or cast to ``dtype``
    (one of :data:`headwise.hf.export.DTYPES`). Lines the caller should show (no tokenizer, an unused
    ``headwise_config.toml``) are appended to ``notes``. Bad input is a HeadwiseError before
    anything is written (see the module docstring)."""
    import transformers

    from headwise.hf.export import chosen_dtype

    out, notes = Path(out), notes if notes is not None else []
    chosen_dtype(dtype, torch.float32)  # an unknown name is refused before anything is read
    check_new_run_folder(out)
    folder, hub, target, hf_config, spec = _read_source(src, cls)
    tokenizer, why = _tokenizer(folder, spec.vocab_size)
    if why is not None:
        notes.append(f"{why}; the model is converted without one (headwise generate, eval, analyze and export need "
                     "a tokenizer)")
    cfg = run_config(spec, folder, tokenizer, list(overrides or []), notes)
    hf, kept = _load(folder, target)
    model = target.from_hf(hf).eval()
    diff = logits_difference(model, hf)
    if not diff <= CHECK_TOLERANCE:
        raise HeadwiseError(f"the converted model's logits differ from {target.model_class}'s by {diff:.3g} of the "
                            f"largest logit (more than {CHECK_TOLERANCE:g}): some setting of {folder / 'config.json'} "
                            "has no headwise counterpart that the converter knows of (nothing was written)")
    del hf  # a large model is held twice until here
    # the check ran in float32, on the checkpoint's values exactly; the run keeps them in this dtype
    model.to(chosen_dtype(dtype, kept))
    run_dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    facts = {"source": src, "folder": str(folder.resolve()), "hub": hub,
             "commit": getattr(hf_config, "_commit_hash", None) if hub else None,
             "class": target.model_class, "transformers": transformers.__version__,
             "checkpoint_dtype": str(kept).removeprefix("torch."), "dtype": run_dtype, "tokenizer_note": why,
             "check": {"random_ids": 2 * min(CHECK_IDS, spec.max_seq_len), "max_logits_diff_of_largest": diff}}
    write_run_atomically(out, model, cfg, tokenizer, _summary(spec, tokenizer, facts))
    return Converted(out, target.model_class, spec, tokenizer.spec if tokenizer is not None else None, diff,
                     run_dtype)
