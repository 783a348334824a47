"""``headwise export``: a run's model as a folder that loads in the Hugging Face ecosystem.

    headwise export runs/lm-tiny --hf exports/lm-tiny            # HeadwiseForCausalLM, any spec
    headwise export runs/llama --hf exports/llama                # LlamaForCausalLM where it fits (--native auto)
    headwise export runs/llama --hf exports/llama --native none  # HeadwiseForCausalLM even so
    headwise export runs/laguna --hf exports/laguna              # LagunaForCausalLM: per-layer query heads
    headwise export runs/vit --hf exports/vit                    # HeadwiseForImageClassification
    headwise export runs/lm-tiny --hf exports/lm-tiny-neo --gpt-neo
    headwise export runs/llama --hf exports/llama-bf16 --dtype bfloat16 --max-shard-size 2GB
    headwise export runs/deit --timm exports/deit                # a [model.timm] run, as timm.create_model loads it
    python -c "from transformers import AutoModelForCausalLM as A; A.from_pretrained('exports/lm-tiny', trust_remote_code=True)"
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from headwise.errors import HeadwiseError

NAME = "export"
HELP = "write a run's model as a Hugging Face folder (its Auto class, tokenizer, model card), or a timm model's as timm loads it"


#: ``--native`` choices (:data:`headwise.hf.native.CHOICES`, kept here so the parser needs no torch)
CHOICES = ("auto", "llama", "qwen3", "laguna", "gpt-neo", "none")
#: ``--dtype`` choices (:data:`headwise.hf.export.DTYPES`, kept here for the same reason)
DTYPES = ("keep", "float32", "bfloat16", "float16")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR",
                   help="a run written by headwise train: a language model, a masked-LM encoder, or a text or "
                        "image classifier")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--timm", metavar="OUT_DIR",
                        help="a run of a timm model ([model.timm]): the folder timm.create_model(name, pretrained=True, "
                             "pretrained_cfg_overlay=..., **the changes) loads to the same logits: model.safetensors, "
                             "config.json (timm's), headwise.json (the create_model arguments and the overlay)")
    target.add_argument("--hf", metavar="OUT_DIR",
                   help="the folder to write (must not exist, or be empty): config.json, model.safetensors, the "
                        "modelling code (loads with trust_remote_code=True without headwise), a language model's or "
                        "masked LM's tokenizer, a language model's generation config, model card")
    p.add_argument("--native", default="auto", choices=CHOICES,
                   help="the transformers class to write a language model as (no remote code): auto (default) "
                        "writes LlamaForCausalLM or Qwen3ForCausalLM for a uniform Llama-style model, "
                        "LagunaForCausalLM for per-layer query heads with q/k norms and a softplus output gate, "
                        "else HeadwiseForCausalLM, saying which rule forced it; llama, qwen3, laguna, gpt-neo: "
                        "that class or exit 2 naming the rule; none: always HeadwiseForCausalLM")
    p.add_argument("--gpt-neo", action="store_true",
                   help="write a plain GPTNeoForCausalLM instead (no remote code), where GPT-Neo can express the "
                        "spec: one head count and width for every layer (the same as --native gpt-neo)")
    p.add_argument("--dtype", default="keep", choices=DTYPES,
                   help="--hf: the dtype of the written weights: keep (default) the run's (that of its weights file: "
                        "float32 for a trained run, the checkpoint's for a converted one), or cast them to float32, "
                        "bfloat16 or float16")
    p.add_argument("--max-shard-size", metavar="SIZE",
                   help="--hf: write the weights as shards of at most SIZE (e.g. 5GB, 500MB, or bytes) with a "
                        "model.safetensors.index.json, as transformers' save_pretrained does (default: its own, 50GB)")
    p.add_argument("--checkpoint", metavar="PATH",
                   help="a checkpoint folder of the run, inside RUN_DIR (default: the final model); another run's "
                        "is refused, since the export describes RUN_DIR's config, losses and command")


def run(args: argparse.Namespace) -> int:
    from headwise.paths import refuse_unwritable_parent

    if args.timm is not None:
        if args.dtype != "keep" or args.max_shard_size is not None:
            raise HeadwiseError("--dtype and --max-shard-size are options of --hf; --timm writes the run's weights as "
                                "they are, in one file (nothing was written)")
        return _export_timm(args)
    from headwise.hf.export import export_hf

    # the folder is written beside OUT_DIR and renamed into place: its parent takes the writes
    refuse_unwritable_parent("--hf", Path(args.hf), "the export")
    notes: list[str] = []
    size = int(args.max_shard_size) if (args.max_shard_size or "").isdigit() else args.max_shard_size
    out = export_hf(Path(args.run_dir), Path(args.hf), checkpoint=args.checkpoint, gpt_neo=args.gpt_neo,
                    native=args.native, notes=notes, dtype=args.dtype, max_shard_size=size)
    for note in notes:
        print(f"headwise export: {note}", file=sys.stderr)
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    remote = " (load with trust_remote_code=True)" if "auto_map" in config else ""
    print(f"wrote {out}: {config['architectures'][0]}{remote}")
    return 0


def _export_timm(args: argparse.Namespace) -> int:
    from headwise.families.vision.timm_export import export_timm_run
    from headwise.paths import refuse_unwritable_parent

    refuse_unwritable_parent("--timm", Path(args.timm), "the export")
    out, name = export_timm_run(Path(args.run_dir), Path(args.timm), checkpoint=args.checkpoint)
    print(f"wrote {out}: timm {name}; its create_model arguments and overlay are in {out / 'headwise.json'}")
    return 0
