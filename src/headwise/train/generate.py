"""Sampling from a trained (or untrained) model, with a KV cache.

:func:`generate` feeds the prompt once and then one token per step through ``model.new_cache()``.
Once the context would exceed ``max_seq_len`` it recomputes each step on the last
``max_seq_len`` tokens without a cache (learned positions cannot slide), which is exactly what
decoding without a cache does, so the two agree throughout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

from headwise.config import read_toml
from headwise.text.tokenizer import Tokenizer
from headwise.errors import HeadwiseError
from headwise.model import SPEC_FILE, WEIGHTS_FILE, SequenceTooLong, Transformer, load_pretrained
from headwise.model.pretrained import DamagedFile
from headwise.parts import FRONT_END_PARTS
from headwise.model_sources import read_source_spec
from headwise.spec import ModelSpec
from headwise.tasks.base import Batch, Task
from headwise.tasks.union import build_task
from headwise.train.checkpoint import latest_checkpoint
from headwise.train.config import RunConfig
from headwise.run import RunDir


def filter_logits(logits: Tensor, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """``logits`` [..., V] with everything outside the top ``k`` and outside the smallest set whose
    probability reaches ``top_p`` (nucleus) set to -inf; the most likely token always stays."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # A token is dropped when the tokens before it already reach top_p.
        drop_sorted = probs.cumsum(dim=-1) - probs >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def next_token(logits: Tensor, temperature: float, top_k: int | None, top_p: float | None,
               generator: torch.Generator | None) -> int:
    """Pick from the last position's ``logits`` [V]: argmax when ``temperature`` is 0, else sample."""
    if temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(filter_logits(logits.float() / temperature, top_k, top_p), dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


@torch.no_grad()
def generate(model: Transformer, prompt_ids: list[int], max_new_tokens: int, *, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
             use_cache: bool = True, stop_id: int | None = None) -> list[int]:
    """New token ids continuing ``prompt_ids`` (at most ``max_new_tokens``; stops after ``stop_id``).

    ``temperature`` 0 is greedy decoding; ``seed`` makes sampling reproducible. The model is put
    in eval mode (no dropout) and left there.
    """
    if not FRONT_END_PARTS[model.spec.inputs].prompts:
        raise HeadwiseError(f"this model takes {model.spec.inputs}, not tokens: there is nothing to generate from a prompt")
    if not prompt_ids:
        raise HeadwiseError("the prompt is empty: give at least one token")
    if temperature < 0 or (top_k is not None and top_k < 1) or (top_p is not None and not 0 < top_p <= 1):
        raise HeadwiseError(f"need temperature >= 0, top_k >= 1 and 0 < top_p <= 1 "
                            f"(got {temperature}, {top_k}, {top_p})")
    model.eval()
    device = next(model.parameters()).device
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    limit = model.spec.max_seq_len
    ids = list(prompt_ids)
    cache = model.new_cache() if use_cache else None
    pending = ids[-limit:]  # what the model has not seen yet
    out: list[int] = []
    for _ in range(max_new_tokens):
        if cache is not None and cache.length + len(pending) > limit:
            cache = None  # the window slides from here on: recompute, as without a cache
        if cache is None:
            pending = ids[-limit:]
        x = torch.tensor([pending], dtype=torch.long, device=device)
        logits = model(x, cache)[0, -1]
        token = next_token(logits, temperature, top_k, top_p, generator)
        ids.append(token)
        out.append(token)
        pending = [token]
        if token == stop_id:
            break
    return out


# ------------------------------------------------------------------------- runs


def run_config(run_dir: Path) -> RunConfig:
    """The resolved config saved in a run directory."""
    path = RunDir(run_dir).config
    if not path.is_file():
        raise HeadwiseError(f"{run_dir} is not a headwise run (no {path.name})")
    return RunConfig.parse(read_toml(path), source=str(path))


def load_run_model(run_dir: Path, checkpoint: Path | None = None, untrained: bool = False,
                   seed: int | None = None) -> tuple[Transformer, str]:
    """The model of a run and where it came from: ``checkpoint`` if given, else the final
    weights (``model/``), else the latest checkpoint; ``untrained`` builds a freshly
    initialised model of the run's spec instead (seeded by ``seed``, else the run's seed)."""
    run_dir = Path(run_dir)
    if untrained:
        cfg = run_config(run_dir)
        torch.manual_seed(cfg.train.seed if seed is None else seed)
        return run_spec(run_dir, cfg).build(), "untrained (fresh initialisation)"
    if checkpoint is not None:
        model = _load(checkpoint, "pass another --checkpoint")
        _check_same_data(model.spec, run_spec(run_dir, run_config(run_dir)), checkpoint, run_dir)
        return model, str(checkpoint)
    final = RunDir(run_dir).model
    if (final / SPEC_FILE).is_file() or (final / WEIGHTS_FILE).is_file():
        def advice() -> str:
            try:
                ckpt = latest_checkpoint(run_dir)
            except HeadwiseError:
                ckpt = None
            if ckpt is None:
                return "the run has no checkpoint to write it again from: train the run again (--overwrite)"
            return (f"`headwise train --resume --out {run_dir}` writes it again from the latest checkpoint, or "
                    f"--checkpoint {ckpt} uses that checkpoint")
        return _load(final, advice), str(final)
    try:
        ckpt = latest_checkpoint(run_dir)
    except DamagedFile as exc:
        raise HeadwiseError(f"{exc}; pass a checkpoint folder with --checkpoint, or resume the run (which "
                            "repairs it)") from None
    if ckpt is None:
        raise HeadwiseError(f"{run_dir} has no final weights and no checkpoint yet: there is no trained model to "
                            "load (train the run again with --overwrite; `headwise generate --untrained` samples a "
                            "fresh model of its spec)")
    return _load(ckpt, "pass an older checkpoint with --checkpoint, or resume the run to write a new one"), str(ckpt)


def run_spec(run_dir: Path, cfg: RunConfig) -> ModelSpec:
    """The model spec of a run, from its saved config (another library's, :mod:`headwise.model_sources`, too)."""
    # A run's saved config holds its model as a full, resolved spec (beside the plan it came from).
    fields = {k: v for k, v in cfg.model.to_dict().items() if k not in ("plan", "preset")}
    where = f"{RunDir(run_dir).config} [model]"
    return read_source_spec(fields, where) or ModelSpec.parse(fields, source=where)


#: The spec fields the data fixes (what the model reads and what it answers): a model that
#: differs from a run's in one was trained on other data, which the run's tokenizer and task
#: cannot feed (another vocabulary, image size, class count, ...). A front end may add its own
#: (``data_fields``: a vector model's width is its data's too).
DATA_FIELDS = ("inputs", "output_head", "vocab_size", "pad_id", "image_size", "channels", "num_classes")


def _check_same_data(spec: ModelSpec, run: ModelSpec, checkpoint: Path, run_dir: Path) -> None:
    """Refuse a ``--checkpoint`` whose model was trained on other data than the run's."""
    fields = DATA_FIELDS + FRONT_END_PARTS[run.inputs].data_fields
    for name in fields:
        theirs, ours = getattr(spec, name), getattr(run, name)
        if theirs != ours:
            raise HeadwiseError(f"--checkpoint {checkpoint} holds a model of other data than {run_dir}'s: its {name} "
                                f"{theirs!r}, the run's {ours!r}; pass a checkpoint of this run (or of a run trained "
                                "on the same data)")


def _load(directory: Path, advice: str | Callable[[], str]) -> Transformer:
    """:func:`load_pretrained`, a damaged file named with ``advice`` (what to do) in one line."""
    try:
        return load_pretrained(directory)
    except DamagedFile as exc:
        raise HeadwiseError(f"{exc}; {advice if isinstance(advice, str) else advice()}") from None


def run_tokenizer(run_dir: Path, cfg: RunConfig) -> Tokenizer:
    """The tokenizer a run trained with, as it saved it in its folder (see
    :mod:`headwise.run.tokenizer`); a HeadwiseError for a task without one."""
    tokenizer = cfg.task.run_tokenizer(run_dir)
    if tokenizer is None:
        raise HeadwiseError(f"{run_dir} trained on the {cfg.task.kind!r} task, which has no tokenizer")
    return tokenizer


def run_task(run_dir: Path, cfg: RunConfig) -> Task:
    """A run's task with its data prepared, its text (if any) encoded with the tokenizer the run
    saved rather than one trained again on text that may have changed since."""
    return build_task(cfg.task, tokenizer=cfg.task.run_tokenizer(run_dir))


def generate_text(run_dir: str | Path, prompt: str, max_new_tokens: int = 200, *, temperature: float = 0.9,
                  top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                  checkpoint: str | Path | None = None, untrained: bool = False) -> tuple[str, str]:
    """Continue ``prompt`` with a run's model and tokenizer; returns (text, where the weights came from).
    Generation stops at the end-of-text token."""
    run_dir = Path(run_dir)
    cfg = run_config(run_dir)
    tokenizer = run_tokenizer(run_dir, cfg)
    model, source = load_run_model(run_dir, Path(checkpoint) if checkpoint else None, untrained, seed)
    new = generate(model, tokenizer.encode(prompt), max_new_tokens, temperature=temperature, top_k=top_k,
                   top_p=top_p, seed=seed, stop_id=tokenizer.eot_id)
    return tokenizer.decode(new), source


@torch.no_grad()
def held_out_predictions(model: Transformer, task: Task, batch: Batch) -> dict[str, Any]:
    """What a model that does not write text "generates": its answers on a held-out batch (see
    :meth:`headwise.tasks.base.Task.predictions`), with the task's loss and headline metric over the
    batch (:meth:`~headwise.tasks.base.Task.batch_score`, e.g. ``accuracy`` or ``pick_accuracy``),
    as training evaluates them."""
    model.eval()
    try:
        with torch.no_grad():
            outputs = model(batch.inputs)
    except SequenceTooLong as exc:  # e.g. --checkpoint of a model with a shorter context
        raise HeadwiseError(f"this model cannot read the task's samples: {exc}") from None
    what, predicted, target = task.predictions(outputs, batch)
    metric, value = task.batch_score(outputs, batch)
    return {
        "metric": metric,
        "accuracy": value,
        "loss": task.loss(outputs, batch.targets).item(),
        "shown": what,
        "predicted": predicted,
        "target": target,
    }