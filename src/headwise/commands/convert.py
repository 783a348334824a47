"""``headwise convert``: a ``transformers`` causal LM (a folder, or a hub name) as a headwise run.

    headwise convert exports/llama --out runs/llama-back                 # a folder headwise export wrote
    headwise convert path/to/TinyStories-33M --out runs/ts33m --set task.source=tinystories-train-sample.txt
    headwise convert roneneldan/TinyStories-33M --out runs/ts33m          # a hub name (downloads it)
    headwise convert path/to/llama-bf16 --out runs/llama32 --dtype float32  # cast the checkpoint's bfloat16
    headwise analyze runs/ts33m && headwise generate runs/ts33m --prompt "Once upon a time"
    headwise train runs/ts33m/config.toml --out runs/ts33m-ft --set train.init_from=runs/ts33m --set train.steps=500
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

NAME = "convert"
HELP = "write a transformers causal LM (Llama, Qwen3, Laguna, GPT-Neo; a folder or a hub name) as a headwise run"

#: ``--class`` choices (:data:`headwise.hf.importer.CLASSES` and auto, kept here so the parser needs no torch)
CHOICES = ("auto", "llama", "qwen3", "laguna", "gpt-neo")
#: ``--dtype`` choices (:data:`headwise.hf.export.DTYPES`, kept here for the same reason)
DTYPES = ("keep", "float32", "bfloat16", "float16")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", metavar="SRC",
                   help="a transformers model folder (config.json, weights, tokenizer files), e.g. one headwise export "
                        "wrote, or a Hugging Face hub name (downloaded; with HF_HUB_OFFLINE=1 only from the cache)")
    p.add_argument("--out", required=True, metavar="RUN_DIR",
                   help="the run folder to write (must not exist, or be empty): config.toml, summary.json, model/, "
                        "checkpoints/step_00000000/, the tokenizer")
    p.add_argument("--class", dest="cls", default="auto", choices=CHOICES,
                   help="the converter: auto (default) takes the one of config.json's architectures (else its "
                        "model_type); llama, qwen3, laguna, gpt-neo name it")
    p.add_argument("--dtype", default="keep", choices=DTYPES,
                   help="the dtype of the run's weights: keep (default) the checkpoint's, the one transformers "
                        "loads it in (config.json's dtype, else its weights'), or cast them to float32, bfloat16 or "
                        "float16; headwise computes in float32 either way (the run's dtype is what export writes)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="set a table of the run's config.toml other than [model], e.g. --set task.source=FILE (the "
                        "data headwise analyze and eval read) or --set train.steps=500")


def run(args: argparse.Namespace) -> int:
    from headwise.hf.importer import convert
    from headwise.paths import refuse_unwritable_parent

    # the run is written beside RUN_DIR and renamed into place: its parent takes the writes
    refuse_unwritable_parent("--out", Path(args.out), "the run")
    notes: list[str] = []
    done = convert(args.src, Path(args.out), cls=args.cls, overrides=args.overrides, notes=notes, dtype=args.dtype)
    for note in notes:
        print(f"headwise convert: {note}", file=sys.stderr)
    spec = done.spec
    print(f"wrote {done.out}: {done.model_class} as a headwise run, heads {list(spec.heads)}, {done.dtype} weights, "
          f"tokenizer {done.tokenizer or 'none'}; logits within {done.max_diff:.2g} of transformers' (relative to the "
          "largest)")
    return 0
