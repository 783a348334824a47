"""``headwise export`` into native ``transformers`` classes: a uniform Llama-style run is written
as a plain ``LlamaForCausalLM`` (``Qwen3ForCausalLM`` with q/k norms and sliding-window layers),
one with per-layer query heads, q/k norms and a softplus output gate as ``LagunaForCausalLM``;
each loads in a fresh process where headwise is not importable, without remote code, and
generates the same greedy tokens as headwise. A model no native class expresses falls back to
``HeadwiseForCausalLM`` with one line naming the rule that forced it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", reason="transformers (the hf extra) is not installed")

from headwise.cli import main  # noqa: E402
from headwise.train.generate import generate, load_run_model, run_config, run_tokenizer  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
#: the tiny LM config on the Llama-style preset: 2 layers of 4 query heads sharing 2 KV heads
LLAMA = ["--set", "model.preset=llama-tiny", "--set", "model.plan.scheme=constant", "--set",
         "model.plan.total_heads=8"]
RUNS = {
    "llama": [],
    "qwen3": ["--set", "model.qk_norm=rmsnorm", "--set", 'model.attention=["global","local"]',
              "--set", "model.window=16"],
    # per-layer query heads (descending: 4, 2) over 2 KV heads, q/k norms, a softplus gate per head
    "laguna": ["--set", "model.plan.scheme=descending", "--set", "model.plan.total_heads=6",
               "--set", "model.head_dim=16", "--set", "model.qk_norm=rmsnorm",
               "--set", "model.output_gate=softplus_head"],
    # per-layer key/value heads: no native class has them
    "per-layer-kv": ["--set", "model.kv_heads=[2,1]"],
}

FRESH_PROCESS = textwrap.dedent("""
    import json, sys
    sys.modules["headwise"] = None  # headwise must not be importable here
    try:
        import headwise  # noqa: F401
        raise SystemExit("headwise is importable")
    except ImportError:
        pass
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    path, prompt = sys.argv[1], sys.argv[2]
    tokenizer = AutoTokenizer.from_pretrained(path)  # no trust_remote_code: plain transformers classes
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(torch.arange(100).view(1, 100) % model.config.vocab_size).logits
        out = model.generate(ids, max_new_tokens=25, do_sample=False)
    print(json.dumps({"class": type(model).__name__, "module": type(model).__module__, "prompt_ids": ids[0].tolist(),
                      "logits": logits[0].tolist(), "new_ids": out[0, ids.shape[1]:].tolist()}))
""")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The tiny Llama-style runs of :data:`RUNS`, trained 20 steps on the TinyStories sample."""
    from tests.conftest import shared_data_dir

    root = tmp_path_factory.mktemp("native")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HEADWISE_DATA", str(shared_data_dir()))
        mp.setenv("HEADWISE_CACHE", str(root / "cache"))
        made = {}
        for name, sets in RUNS.items():
            made[name] = root / name
            assert main(["train", str(CONFIGS / "lm-tiny.toml"), "--out", str(made[name]), *LLAMA, *sets,
                         "--set", "train.steps=20", "--set", "eval.every=0", "--set", "checkpoint.every=0"]) == 0
        yield made


def _fresh_process(tmp_path: Path, *args: str) -> dict:
    """What :data:`FRESH_PROCESS` prints, run outside the repository with an empty PYTHONPATH."""
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "PYTHONPATH": ""}
    result = subprocess.run([sys.executable, "-c", FRESH_PROCESS, *args], capture_output=True, text=True,
                            cwd=tmp_path, env=env, timeout=300, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name,cls", [("llama", "LlamaForCausalLM"), ("qwen3", "Qwen3ForCausalLM"),
                                      ("laguna", "LagunaForCausalLM")])
def test_a_run_a_native_class_expresses_exports_as_it_and_generates_the_same_tokens(runs, name, cls, tmp_path, capsys):
    out = tmp_path / "export"
    assert main(["export", str(runs[name]), "--hf", str(out)]) == 0  # --native auto, the default
    captured = capsys.readouterr()
    assert captured.err == "" and f"wrote {out}: {cls}" in captured.out and "trust_remote_code" not in captured.out
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [cls] and "auto_map" not in config
    assert not list(out.glob("*.py"))  # no modelling code: transformers' own classes
    for name_ in ("model.safetensors", "tokenizer.json", "generation_config.json", "README.md",
                  "headwise_config.toml"):
        assert (out / name_).is_file(), name_
    assert "trust_remote_code" not in (out / "README.md").read_text()

    prompt = "Once upon a time there was"
    got = _fresh_process(tmp_path, str(out), prompt)
    assert got["class"] == cls and got["module"].startswith("transformers.models.")
    model, _ = load_run_model(runs[name])
    tokenizer = run_tokenizer(runs[name], run_config(runs[name]))
    assert got["prompt_ids"] == tokenizer.encode(prompt)
    with torch.no_grad():
        expected = model(torch.arange(100).view(1, 100) % model.spec.vocab_size)[0]
    torch.testing.assert_close(torch.tensor(got["logits"]), expected, rtol=0, atol=1e-4)
    # greedy KV-cached generate() of transformers equals headwise generate --temperature 0
    assert got["new_ids"] == generate(model, tokenizer.encode(prompt), 25, temperature=0, stop_id=tokenizer.eot_id)


def test_no_native_class_falls_back_naming_the_rule(runs, tmp_path, capsys):
    out = tmp_path / "export"
    assert main(["export", str(runs["per-layer-kv"]), "--hf", str(out)]) == 0
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and "LlamaForCausalLM" in err and "different key/value heads [2, 1]" in err
    assert "HeadwiseForCausalLM" in captured.out and "trust_remote_code=True" in captured.out
    config = json.loads((out / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_headwise.HeadwiseForCausalLM"
    assert "different key/value heads [2, 1]" in (out / "README.md").read_text()


def test_native_none_and_explicit_targets(runs, tmp_path, capsys):
    # --native none keeps headwise's own class for a model Llama expresses; --native llama names it
    assert main(["export", str(runs["llama"]), "--hf", str(tmp_path / "own"), "--native", "none"]) == 0
    assert "auto_map" in json.loads((tmp_path / "own" / "config.json").read_text())
    assert main(["export", str(runs["llama"]), "--hf", str(tmp_path / "llama"), "--native", "llama"]) == 0
    assert json.loads((tmp_path / "llama" / "config.json").read_text())["model_type"] == "llama"
    capsys.readouterr()
    # Qwen3 normalises q and k; this model does not
    assert main(["export", str(runs["llama"]), "--hf", str(tmp_path / "qwen3"), "--native", "qwen3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "qk_norm = None" in err and not (tmp_path / "qwen3").exists()
