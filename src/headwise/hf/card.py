"""The model card (``README.md``) of an exported folder: the head plan, the data, the losses, the
command that trained the model and how to load it."""

from __future__ import annotations

from pathlib import Path

from headwise.model.attention import ATTENTION_KINDS
from headwise.params import count_params
from headwise.parts import FRONT_END_PARTS, OUTPUT_HEAD_PARTS
from headwise.run.metrics import read_metrics
from headwise.run.summary import read_summary
from headwise.spec import ModelSpec
from headwise.text.masked_vocab import CLS_ID, MASK_ID, SEP_ID

#: How each Auto class is used, after ``model = ...from_pretrained(path, ...)`` (another: :func:`_use`)
_USE = {
    "AutoModelForCausalLM": [
        'ids = tokenizer("Once upon a time", return_tensors="pt").input_ids',
        "print(tokenizer.decode(model.generate(ids, max_new_tokens=50, do_sample=False)[0]))",
    ],
    "AutoModelForMaskedLM": [
        'ids = tokenizer("Once upon a time there was a little [MASK].", return_tensors="pt").input_ids',
        "logits = model(ids).logits  # [batch, tokens, vocabulary]",
        "print(tokenizer.decode(logits[ids == tokenizer.mask_token_id].argmax(-1)))",
    ],
    "AutoModelForSequenceClassification": ["logits = model(input_ids).logits  # input_ids [batch, tokens]"],
    "AutoModelForImageClassification": [
        "logits = model(pixel_values).logits  # [batch, channels, size, size], normalised as in training"],
}
#: The Auto classes whose folder holds a tokenizer (and a fine-tuned encoder's: its pretraining run's)
_TOKENIZED = ("AutoModelForCausalLM", "AutoModelForMaskedLM")
#: How a fine-tuned encoder (a task with a pretraining run's vocabulary) is used
_USE_PAIRS = ['batch = tokenizer(["A first sentence."], ["A second one."], padding=True, return_tensors="pt")',
              "logits = model(**batch).logits  # [batch, classes] (one score for a regression)"]
_PIPELINE = {"AutoModelForCausalLM": "text-generation", "AutoModelForMaskedLM": "fill-mask",
             "AutoModelForSequenceClassification": "text-classification",
             "AutoModelForImageClassification": "image-classification"}


def _use(auto: str) -> list[str]:
    """How a model loaded by the Auto class ``auto`` is used: :data:`_USE`'s lines, or a generic
    call for an Auto class outside it (``AutoModel``: the outputs of a family's own head)."""
    return _USE.get(auto, [f"outputs = model(inputs).logits  # {auto}: the output head's outputs for a batch as "
                           "in training"])


def _loss(value: float | None) -> str:
    return "not recorded" if value is None else f"{value:.4f}"


def _plan(spec: ModelSpec) -> list[str]:
    """The per-layer table and one line of totals."""
    layers = spec.layers()
    # what the model reads and what its head adds, in the words of the parts' declarations
    inputs = FRONT_END_PARTS[spec.inputs].reads(spec)
    outputs = OUTPUT_HEAD_PARTS[spec.output_head].describe(spec)
    embedding_norm = ", LayerNorm on the embeddings" if spec.embedding_norm else ""
    padding = f", [PAD] id {spec.pad_id} masked" if spec.pad_id is not None else ""
    return [
        "| layer | heads | head width | attention width | attention | MLP width |",
        "|---|---|---|---|---|---|",
        *(f"| {i} | {s.heads} | {s.head_dim} | {s.width} | {ATTENTION_KINDS[s.attention].describe(spec)} | "
          f"{s.mlp_hidden} |" for i, s in enumerate(layers)),
        "",
        f"d_model {spec.d_model}, {spec.total_heads} heads in all{_kv_heads(spec)}, "
        f"{count_params(spec):,} parameters, {inputs}"
        f"{outputs}, {spec.max_seq_len} positions, {'causal' if spec.causal else 'bidirectional'}, {spec.norm} "
        f"norm{embedding_norm}, {spec.positions} positions, {spec.activation}{padding}.",
    ]


def _kv_heads(spec: ModelSpec) -> str:
    """The key/value heads per layer, where they are fewer than the query heads (grouped-query attention)."""
    kv = spec.kv_heads_per_layer
    return "" if kv == spec.heads else f" sharing key/value heads {', '.join(map(str, kv))} per layer"


def model_card(run_dir: Path, cfg, spec: ModelSpec, weights: str, arch: str, auto: str, remote_code: bool,
               note: str | None = None) -> str:
    """The card's markdown for the model of ``run_dir`` (``cfg``: its resolved config; ``weights``:
    where the exported weights came from; ``arch``/``auto``: its class and the Auto class that
    loads it; ``remote_code``: whether loading needs ``trust_remote_code``; ``note``: why no native
    ``transformers`` class was written, where one was looked for)."""
    summary = read_summary(run_dir)
    fine_tuned = cfg.task.vocabulary_run() is not None
    tokenized = auto in _TOKENIZED or fine_tuned
    rows = read_metrics(run_dir)
    train_losses = [r["train_loss"] for r in rows if isinstance(r.get("train_loss"), (int, float))]
    eval_losses = [(r["step"], r["eval_loss"]) for r in rows if isinstance(r.get("eval_loss"), (int, float))]
    task = summary.task if summary is not None else {}
    trust = ", trust_remote_code=True" if remote_code else ""
    lines = [
        "---",
        "library_name: transformers",
        f"pipeline_tag: {_PIPELINE.get(auto, 'other')}",
        "tags: [headwise, attention-heads]",
        "---",
        "",
        f"# {run_dir.name}: heads {','.join(str(h) for h in spec.heads)}",
        "",
        f"A {spec.n_layers}-layer {OUTPUT_HEAD_PARTS[spec.output_head].noun} trained with headwise on the "
        f"{cfg.task.kind!r} task and exported as "
        f"`{arch}`{' (its modelling code is in this folder)' if remote_code else ''}.",
        *(["", f"Why `{arch}`: {note}."] if note else []),
        "",
        "## Head plan",
        "",
        *_plan(spec),
        "",
        "## Data",
        "",
        f"- {task.get('data') or 'see headwise_config.toml'}",
    ]
    if "train_tokens" in task:
        # a masked-LM task records its training tokens only
        valid = f", {task['valid_tokens']:,} validation tokens" if "valid_tokens" in task else ""
        lines.append(f"- {task['train_tokens']:,} training tokens{valid}")
    lines += ["", "## Training", "", f"- weights: {weights}"]
    if summary is not None:
        metrics = "".join(f", {k} {v:.4f}" for k, v in summary.eval_metrics.items())
        lines += [
            f"- status {summary.status.value}, {summary.steps:,} steps, {summary.tokens:,} {summary.unit}, "
            f"{summary.train_time_s:.0f} s on {summary.device} ({summary.precision})",
            f"- eval loss {_loss(summary.last_eval_loss)}{metrics}; last logged train loss "
            f"{_loss(train_losses[-1] if train_losses else None)}",
        ]
    if eval_losses:
        lines.append("- eval loss by step: " + ", ".join(f"{step:,}: {loss:.4f}" for step, loss in eval_losses))
    lines += [
        "",
        "Trained with (the run's full resolved config is `headwise_config.toml` here):",
        "",
        "```bash",
        f"headwise train headwise_config.toml --out runs/{run_dir.name}",
        "```",
        "",
        "## Use",
        "",
        "```python",
        f"from transformers import {auto}" + (", AutoTokenizer" if tokenized else ""),
        "",
        'path = "path/to/this/folder"',
        *([f"tokenizer = AutoTokenizer.from_pretrained(path{trust})"] if tokenized else []),
        f"model = {auto}.from_pretrained(path{trust})",
        *(_USE_PAIRS if fine_tuned else _use(auto)),
        "```",
        "",
    ]
    if remote_code and auto == "AutoModelForCausalLM":
        lines += ["Batches must not be padded: the model has learned positions counted from each sequence's "
                  "start and no padding mask (generate one prompt at a time, or prompts of equal length).", ""]
    if fine_tuned:
        lines += ["The tokenizer is the pretraining run's: it frames a pair as `[CLS] a [SEP] b [SEP]` (a single "
                  "text as `[CLS] a [SEP]`), as fine-tuning did, and pads with `[PAD]`, which the model masks out.", ""]
    if auto == "AutoModelForMaskedLM":
        lines += [f"The tokenizer frames each text as `[CLS] text [SEP]` (ids {CLS_ID} and {SEP_ID}) and reads a "
                  f"literal `[MASK]` (id {MASK_ID}, with the space before it) as the mask; " + (
                      f"padding is `[PAD]` (id {spec.pad_id}), which the model masks out of attention: pass "
                      "`padding=True` and the tokenizer's attention_mask." if spec.pad_id is not None else
                      "the model was trained without `pad_id`, so it masks no padding: give one text at a time, "
                      "or texts of equal length."), ""]
    return "\n".join(lines)
