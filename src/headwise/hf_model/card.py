"""The model card (``README.md``) of an exported folder: the head plan, the data, the losses, the
command that trained the model and how to load it."""

from __future__ import annotations

from pathlib import Path

from headwise.params import count_params
from headwise.run.metrics import read_metrics
from headwise.run.summary import read_summary
from headwise.spec import ModelSpec


def _loss(value: float | None) -> str:
    return "not recorded" if value is None else f"{value:.4f}"


def model_card(run_dir: Path, cfg, spec: ModelSpec, weights: str, gpt_neo: bool) -> str:
    """The card's markdown for the model of ``run_dir`` (``cfg``: its resolved config; ``weights``:
    where the exported weights came from)."""
    summary = read_summary(run_dir)
    rows = read_metrics(run_dir)
    train_losses = [r["loss"] for r in rows if isinstance(r.get("loss"), (int, float))]
    task = summary.task if summary is not None else {}
    layers = spec.layers()
    arch = "GPTNeoForCausalLM" if gpt_neo else "HeadwiseForCausalLM"
    load = (f"model = AutoModelForCausalLM.from_pretrained(path)" if gpt_neo else
            f"model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)")
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: text-generation",
        "tags: [headwise, attention-heads]",
        "---",
        "",
        f"# {run_dir.name}: heads {','.join(str(s.heads) for s in layers)}",
        "",
        f"A {spec.n_layers}-layer decoder trained with headwise and exported as "
        f"`{arch}`{'' if gpt_neo else ' (its modelling code is in this folder)'}.",
        "",
        "## Head plan",
        "",
        "| layer | heads | head width | attention width | attention | MLP width |",
        "|---|---|---|---|---|---|",
        *(f"| {i} | {s.heads} | {s.head_dim} | {s.width} | {s.attention}"
          f"{f' (window {spec.window})' if s.attention == 'local' else ''} | {s.mlp_hidden} |"
          for i, s in enumerate(layers)),
        "",
        f"d_model {spec.d_model}, {spec.total_heads} heads in all, {count_params(spec):,} parameters, "
        f"vocabulary {spec.vocab_size:,}, context {spec.max_seq_len} tokens, {spec.norm} norm, "
        f"{spec.positions} positions, {spec.activation}.",
        "",
        "## Data",
        "",
        f"- {task.get('data') or getattr(cfg.task, 'source', '') or 'see headwise_config.toml'}",
        f"- tokenizer `{task.get('tokenizer', getattr(cfg.task, 'tokenizer', '?'))}`"
        + (f", {task['train_tokens']:,} training tokens, {task['valid_tokens']:,} validation tokens"
           if "train_tokens" in task else ""),
        "",
        "## Training",
        "",
        f"- weights: {weights}",
    ]
    if summary is not None:
        lines += [
            f"- status {summary.status.value}, "
            f"{summary.steps:,} steps, {summary.tokens:,} tokens, {summary.train_time_s:.0f} s on "
            f"{summary.device} ({summary.precision})",
            f"- eval loss {_loss(summary.last_eval_loss)}; last logged train loss "
            f"{_loss(train_losses[-1] if train_losses else None)}",
        ]
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
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        "path = \"path/to/this/folder\"",
        f"tokenizer = AutoTokenizer.from_pretrained(path{'' if gpt_neo else ', trust_remote_code=True'})",
        load,
        "ids = tokenizer(\"Once upon a time\", return_tensors=\"pt\").input_ids",
        "print(tokenizer.decode(model.generate(ids, max_new_tokens=50, do_sample=False)[0]))",
        "```",
        "",
    ]
    if not gpt_neo:
        lines += ["Batches must not be padded: the model has learned positions counted from each sequence's "
                  "start and no padding mask (generate one prompt at a time, or prompts of equal length).", ""]
    return "\n".join(lines)
