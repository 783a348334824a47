"""A sweep of bad inputs on the Llama-style block options (grouped-query key/value heads, RoPE,
RMSNorm, SwiGLU, q/k norms) and sliding windows, through ``headwise train`` and ``headwise plan``
as a user drives them, and ``headwise export --native`` targets that cannot express a model.

Each case checks what every sweep checks (:mod:`bad_input_harness`): exit status 2, one line on
stderr that names the layer (where a rule is a layer's) and the rule, no traceback, nothing on
disk changed and no new file. The configs are the repository's tiny language and nearest-neighbour
configs. A language run's vocabulary is its trained tokenizer's, so the model is checked after the
token cache exists: the module's folder prepares it once, and the cases then write nothing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bad_input_harness import Case, c, run_case
from conftest import REPO, shared_data_dir
from headwise.cli import main

# The tiny LM config (2 layers of d_model 64) on the Llama-style preset: 4 query heads sharing
# 2 KV heads in each layer
LLAMA = ("--set", "model.preset=llama-tiny", "--set", "model.plan.total_heads=8",
         "--set", "model.plan.scheme=constant")


def train(id: str, *sets: str, config: str = "lm.toml", says: tuple[str, ...] | str = ()) -> Case:
    """``headwise train CONFIG --out new-run`` on the Llama-style preset, with ``--set`` overrides."""
    argv = ["train", config, "--out", "new-run", *(LLAMA if config == "lm.toml" else ())]
    return c(id, *argv, *(a for s in sets for a in ("--set", s)), says=says, data="shared")


CASES = [
    # grouped-query attention: a layer's query heads are a multiple of its KV heads
    train("kv-heads-not-a-divisor", "model.kv_heads=3", says=("layer 0", "not a multiple of kv_heads = 3")),
    train("kv-heads-per-layer", "model.kv_heads=[2,3]", says=("layer 1", "not a multiple")),
    train("kv-heads-more-than-heads", "model.kv_heads=8", says=("layer 0", "heads = 4", "kv_heads = 8")),
    train("kv-heads-zero", "model.kv_heads=0", says="kv_heads"),
    train("kv-heads-count", "model.kv_heads=[2,2,2]", says=("kv_heads has 3 entries", "one per layer")),
    train("kv-heads-text", 'model.kv_heads="two"', says="kv_heads"),
    # a plan whose layers lose the KV heads' multiple: the first such layer is named
    train("kv-heads-plan", "model.plan.scheme=descending", "model.plan.total_heads=3",
          says=("layer 1", "heads = 1", "not a multiple")),
    # RoPE: the rotated share of a head's channels is in (0, 1], an even count of channels
    train("rotary-factor-above-1", "model.partial_rotary_factor=1.5", says=("partial_rotary_factor", "(0, 1]")),
    train("rotary-factor-0", "model.partial_rotary_factor=0", says=("partial_rotary_factor", "(0, 1]")),
    train("rotary-factor-negative", "model.partial_rotary_factor=-0.5", says="(0, 1]"),
    train("rotary-odd-channels", "model.partial_rotary_factor=0.2", says=("layer 0", "3 channels", "pairs")),
    train("rope-theta-0", "model.rope_theta=0", says="rope_theta"),
    # RoPE's options where the positions are not rotary: refused, not ignored
    train("rope-theta-learned-positions", "model.positions=learned", "model.rope_theta=500000",
          says=("rope_theta = 500000.0 has no effect with positions = 'learned'", "positions = 'rope'")),
    train("rotary-factor-sinusoid-positions", "model.positions=scaled_sinusoid", "model.partial_rotary_factor=0.5",
          says=("partial_rotary_factor = 0.5", "positions = 'scaled_sinusoid'", "remove partial_rotary_factor")),
    train("positions-unknown", "model.positions=rotary", says=("positions", "'rope'")),
    train("norm-unknown", "model.norm=rmsnorm", says=("norm", "'rmsnorm_pre'")),
    train("qk-norm-unknown", "model.qk_norm=layernorm", says=("qk_norm", "'rmsnorm'")),
    train("output-gate-unknown", "model.output_gate=sigmoid", says=("output_gate", "'softplus_head'")),
    train("swiglu-odd-width", "model.mlp_hidden=705", says=("layer 0", "odd", "'swiglu'")),
    # a sliding window on a bidirectional model (the nearest-neighbour encoder): the layer named
    train("window-bidirectional", "model.n_layers=2", "model.heads=[1,1]", 'model.attention=["global","local"]',
          config="nn.toml", says=("layer 1", "local attention layers need causal = true")),
    # headwise plan --kv-heads
    c("plan-kv-heads-not-a-divisor", "plan", "--scheme", "explicit", "--layers", "2", "--heads", "4,6",
      "--kv-heads", "4", says=("layer 1", "heads = 6", "not a multiple of kv_heads = 4")),
    c("plan-kv-heads-count", "plan", "--scheme", "explicit", "--layers", "2", "--heads", "4,4", "--kv-heads",
      "2,2,2", says="one per layer"),
    c("plan-kv-heads-not-ints", "plan", "--total-heads", "8", "--kv-heads", "2,x", says="comma-separated"),
    # headwise export --native: a target that cannot express the model names its rule, writes nothing
    c("export-qwen3-without-qk-norm", "export", "llama-run", "--hf", "out/q", "--native", "qwen3",
      says=("Qwen3ForCausalLM cannot express", "qk_norm = None", "without --native qwen3")),
    c("export-llama-per-layer-kv", "export", "kv-run", "--hf", "out/l", "--native", "llama",
      says=("LlamaForCausalLM cannot express", "different key/value heads [2, 1]")),
    c("export-laguna-without-gate", "export", "llama-run", "--hf", "out/g", "--native", "laguna",
      says=("LagunaForCausalLM cannot express", "output_gate = None", "softplus")),
    c("export-gpt-neo-gqa", "export", "llama-run", "--hf", "out/n", "--native", "gpt-neo",
      says=("GPTNeoForCausalLM cannot express", "key/value heads")),
    c("export-gpt-neo-flag-gqa", "export", "llama-run", "--hf", "out/n", "--gpt-neo",
      says=("GPTNeoForCausalLM cannot express", "without --gpt-neo")),
    c("export-gpt-neo-and-native", "export", "llama-run", "--hf", "out/n", "--gpt-neo", "--native", "llama",
      says=("--gpt-neo and --native llama", "give one")),
    c("export-native-unknown", "export", "llama-run", "--hf", "out/n", "--native", "mistral", says="--native"),
]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """The tiny LM and nearest-neighbour configs, as a user would copy them, the LM's token cache,
    and two Llama-style runs to export (2 steps): uniform GQA (``llama-run``) and per-layer key/value
    heads (``kv-run``)."""
    root = tmp_path_factory.mktemp("bad-blocks")
    shutil.copy(REPO / "configs" / "lm-tiny.toml", root / "lm.toml")
    shutil.copy(REPO / "configs" / "nearest-tiny.toml", root / "nn.toml")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HEADWISE_DATA", str(shared_data_dir()))
        mp.setenv("HEADWISE_CACHE", str(root / "cache"))
        mp.chdir(root)
        assert main(["data", "prepare", "--config", "lm.toml", "--quiet"]) == 0
        for out, sets in (("llama-run", ()), ("kv-run", ("--set", "model.kv_heads=[2,1]"))):
            assert main(["train", "lm.toml", "--out", out, *LLAMA, *sets, "--set", "train.steps=2",
                         "--set", "eval.every=0", "--set", "checkpoint.every=0"]) == 0
    return root


@pytest.mark.parametrize("case", [pytest.param(k, id=k.id) for k in CASES])
def test_bad_block_options(case: Case, world: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("HEADWISE_DATA", str(shared_data_dir()))
    monkeypatch.setenv("HEADWISE_CACHE", str(world / "cache"))
    run_case(case, world, monkeypatch, capsys, leftovers=("new-run",))


def test_case_ids_are_distinct() -> None:
    assert len({k.id for k in CASES}) == len(CASES)
