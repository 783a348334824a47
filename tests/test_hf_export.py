"""Hugging Face models for every spec: HeadwiseForCausalLM against headwise's own model, the
exported folder loaded in a fresh process without headwise, and the way back."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", reason="transformers (the hf extra) is not installed")

from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402
from transformers.cache_utils import DynamicCache  # noqa: E402

from headwise.cli import main  # noqa: E402
from headwise.errors import HeadwiseError  # noqa: E402
from headwise.hf.models import HeadwiseConfig, HeadwiseForCausalLM, from_headwise, load_export, to_headwise  # noqa: E402
from headwise.hf.export import ALLOWED_IMPORTS, bundled_sources  # noqa: E402
from headwise.hf.models.modeling_headwise import OUTPUT_CACHE_FIELD  # noqa: E402
from headwise.model import Transformer  # noqa: E402
from headwise.spec import ModelSpec  # noqa: E402
from headwise.train.generate import generate, load_run_model, run_config, run_tokenizer  # noqa: E402
from tests.helpers import one_line_error  # noqa: E402
from tests.test_image_task import idx_folder, vit_config  # noqa: E402, F401 - idx_folder is a fixture

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

SPECS = {
    "heterogeneous": dict(heads=[4, 2, 1], head_dim=[8, 12, 5]),
    "local and untied": dict(heads=[2, 4, 2], attention=["global", "local", "local"], window=5, tie_embeddings=False),
    "unit-norm post-norm": dict(heads=[4, 2, 2], norm="unitnorm_post", score_scale="inv_sqrt", mlp_hidden=[40, 24, 8]),
    # per-layer query and key/value heads, partial RoPE and q/k norms: no native class has them
    "llama-style per-layer kv heads": dict(heads=[4, 4, 2], kv_heads=[2, 1, 2], norm="rmsnorm_pre", positions="rope",
                                           partial_rotary_factor=0.5, qk_norm="rmsnorm", activation="swiglu",
                                           mlp_hidden=[48, 64, 32], score_scale="inv_sqrt", out_bias=False,
                                           mlp_bias=False, attention=["global", "local", "global"], window=6),
    # a softplus output gate per channel (Laguna's per-element gating) on per-layer query heads
    "gated per-layer heads": dict(heads=[4, 2, 2], kv_heads=2, norm="rmsnorm_pre", positions="rope",
                                  qk_norm="rmsnorm", activation="swiglu", output_gate="softplus_element",
                                  score_scale="inv_sqrt"),
}


def _model(**fields) -> Transformer:
    torch.manual_seed(0)
    # a large init makes the logits far apart, so greedy choices are decided well above float noise
    base = dict(vocab_size=97, d_model=32, n_layers=3, max_seq_len=48, init_std=0.3)
    return Transformer(ModelSpec(**{**base, **fields})).eval()


@pytest.mark.parametrize("name", SPECS)
def test_logits_and_greedy_generation_equal_headwise(name):
    model = _model(**SPECS[name])
    hf = from_headwise(model, eot_id=96)
    ids = torch.randint(0, 97, (3, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        # a plain forward (which starts a cache: use_cache defaults to true) and one without a
        # cache compute exactly what headwise computes, on any CPU
        assert torch.equal(hf(ids).logits, model(ids))
        assert torch.equal(hf(ids, use_cache=False).logits, model(ids))
        out = hf.generate(ids[:1, :6], max_new_tokens=30, do_sample=False)
    # KV-cached generate() of transformers equals headwise's own greedy decoding (which stops at end-of-text too)
    assert out[0, 6:].tolist() == generate(model, ids[0, :6].tolist(), 30, temperature=0, stop_id=96)
    assert len(set(out[0, 6:].tolist())) > 3


@pytest.mark.parametrize("name", ["cache", "past_key_values"])
def test_the_cache_is_taken_under_either_name(name):
    # transformers 5.24 passes the cache to forward() as `cache`; earlier releases as `past_key_values`
    model = _model(**SPECS["local and untied"])
    hf = from_headwise(model)
    ids = torch.randint(0, 97, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(ids)
        cache = DynamicCache(config=hf.config)
        first = hf(ids[:, :8], **{name: cache})
        steps = [hf(ids[:, i:i + 1], **{name: cache}).logits for i in range(8, 12)]
    assert getattr(first, OUTPUT_CACHE_FIELD) is cache and cache.get_seq_length() == 12
    assert torch.equal(first.logits, model(ids[:, :8]))
    # each decoding step sees the cached positions: the whole sequence's logits, up to the rounding
    # of another summation order (one query against cached keys; this large init gives logits ~5)
    torch.testing.assert_close(torch.cat(steps, dim=1), full[:, 8:], rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="not both"):
        hf(ids, cache=DynamicCache(config=hf.config), past_key_values=DynamicCache(config=hf.config))


def test_labels_give_the_shifted_next_token_loss():
    model = _model(**SPECS["heterogeneous"])
    hf = from_headwise(model)
    ids = torch.randint(0, 97, (2, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        loss = hf(ids, labels=ids).loss
        expected = torch.nn.functional.cross_entropy(model(ids)[:, :-1].reshape(-1, 97), ids[:, 1:].reshape(-1))
    torch.testing.assert_close(loss, expected)


def test_padded_batches_are_refused_with_the_reason():
    hf = from_headwise(_model(**SPECS["heterogeneous"]))
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[1, :2] = 0
    with pytest.raises(ValueError, match="unpadded batches"):
        hf(torch.zeros(2, 5, dtype=torch.long), attention_mask=mask)


def test_auto_classes_know_headwise_and_save_load_round_trips(tmp_path):
    model = _model(**SPECS["local and untied"])
    hf = from_headwise(model, eot_id=96)
    hf.save_pretrained(tmp_path)
    config = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(config, HeadwiseConfig) and config.num_attention_heads_per_layer == [2, 4, 2]
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert isinstance(loaded, HeadwiseForCausalLM)
    for (k, a), (_, b) in zip(sorted(model.state_dict().items()), sorted(to_headwise(loaded).state_dict().items())):
        assert torch.equal(a, b), k
    back = load_export(tmp_path)
    assert back.spec == model.spec
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), back.state_dict().values()))


def test_a_sharded_save_loads_back_whole_and_a_missing_shard_is_named(tmp_path):
    model = _model(**SPECS["local and untied"])
    from_headwise(model, eot_id=96).save_pretrained(tmp_path, max_shard_size="20KB")
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 1 and not (tmp_path / "model.safetensors").exists()
    back = load_export(tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), back.state_dict().values()))
    shards[-1].unlink()
    with pytest.raises(HeadwiseError, match=f"names the shard {shards[-1].name}, which is missing"):
        load_export(tmp_path)


@pytest.mark.parametrize("kind", ["global", "local", "nystrom"])
def test_the_bundled_code_imports_only_torch_transformers_and_itself(kind):
    # docs/architecture.md, "What exported model code may import": the standard library, these
    # four, and the sibling files the folder carries
    bidirectional = dict(causal=False, outputs="classes", num_classes=3, nystrom_conv=3)
    sources = bundled_sources(_model(heads=[2, 4, 2], attention=kind, **(bidirectional if kind == "nystrom" else {})))
    assert {"modeling_headwise.py", "configuration_headwise.py", "spec_view.py", "layer_shape.py",
            "transformer.py", "registry.py", "errors.py", "attention.py", f"attention_{kind}.py"} <= set(sources)
    _assert_only_allowed_imports(sources)
    assert ALLOWED_IMPORTS == {"torch", "transformers", "safetensors", "numpy"}


@pytest.mark.parametrize("fields, parts", [
    (dict(causal=False, outputs="mlm"), ["MaskedLMHead"]),
    (dict(causal=False, outputs="cls_pooler", num_classes=2), ["ClsPoolerHead"]),
    (dict(inputs="token_pairs", causal=False, num_classes=2), ["PairClassifierHead", "TokenPairInputs"]),
])
def test_parts_written_in_a_family_folder_travel_with_the_bundled_code(fields, parts):
    # the encoder's and LRA's parts live in families/<name>/model.py: carried as model.py, imported
    # at the end of modeling_headwise.py (nothing else there imports them) so that they register
    sources = bundled_sources(_model(heads=[2, 4, 2], **fields))
    for part in parts:
        assert f"class {part}(" in sources["model.py"], part
        assert f"from .model import {part}  # noqa" in sources["modeling_headwise.py"], part
    _assert_only_allowed_imports(sources)


def _assert_only_allowed_imports(sources: dict[str, str]) -> None:
    """Every bundled file imports the standard library, ALLOWED_IMPORTS and its sibling files only."""
    for name, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom):
                assert node.level == 1 or node.module.split(".")[0] != "headwise", (name, node.module)
                if node.level == 1:
                    assert f"{node.module}.py" in sources, (name, node.module)
                else:
                    assert node.module.split(".")[0] in ALLOWED_IMPORTS | sys.stdlib_module_names, (name, node.module)
            elif isinstance(node, ast.Import):
                assert all(a.name.split(".")[0] in ALLOWED_IMPORTS | sys.stdlib_module_names for a in node.names), name


def test_the_spec_view_names_what_headwise_spec_names():
    from headwise.hf.models import spec_view
    from headwise.spec import LayerShape

    assert spec_view.LayerShape is LayerShape  # one class, carried into the exported folder


# ------------------------------------------------------------------ a trained run, exported

@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    from tests.conftest import shared_data_dir

    data = shared_data_dir()
    root = tmp_path_factory.mktemp("lm")
    with pytest.MonkeyPatch.context() as mp:  # for the whole module: the tests below train and export too
        mp.setenv("HEADWISE_DATA", str(data))
        mp.setenv("HEADWISE_CACHE", str(root / "cache"))
        out = root / "run"
        # heterogeneous heads and head widths, a local layer: nothing GPT-Neo expresses
        assert main(["train", str(CONFIGS / "lm-tiny.toml"), "--out", str(out), "--set", "train.steps=20",
                     "--set", "eval.every=0", "--set", "checkpoint.every=0", "--set", "model.plan.total_heads=6",
                     "--set", "model.head_dim=[24,20]", "--set", 'model.attention=["global","local"]',
                     "--set", "model.window=16"]) == 0
        yield out


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
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
    model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval()
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(torch.arange(100).view(1, 100) % model.config.vocab_size).logits
        out = model.generate(ids, max_new_tokens=25, do_sample=False, output_logits=True, return_dict_in_generate=True)
    new = out.sequences[0, ids.shape[1]:]
    print(json.dumps({"class": type(model).__name__, "module": type(model).__module__, "prompt_ids": ids[0].tolist(),
                      "logits": logits[0].tolist(), "new_ids": new.tolist(), "text": tokenizer.decode(new),
                      "step_logits": torch.cat(out.logits).tolist()}))
""")


def _fresh_process(script: str, tmp_path: Path, *args: str):
    """The JSON that ``script`` prints last, run with ``args`` in a new Python process outside the
    repository, its transformers module cache in ``tmp_path``."""
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "PYTHONPATH": ""}
    result = subprocess.run([sys.executable, "-c", script, *args], capture_output=True,
                            text=True, cwd=tmp_path, env=env, timeout=300, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_an_exported_heterogeneous_run_loads_in_a_fresh_process_without_headwise(lm_run, tmp_path, capsys):
    out = tmp_path / "export"
    assert main(["export", str(lm_run), "--hf", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    for name in ("config.json", "model.safetensors", "modeling_headwise.py", "tokenizer.json",
                 "generation_config.json", "README.md", "headwise_config.toml"):
        assert (out / name).is_file(), name
    config = json.loads((out / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_headwise.HeadwiseForCausalLM"
    card = (out / "README.md").read_text()
    assert "| 0 | 4 | 24 |" in card and "| 1 | 2 | 20 | 40 | local (window 16) |" in card

    prompt = "Once upon a time there was"
    got = _fresh_process(FRESH_PROCESS, tmp_path, str(out), prompt)
    assert got["class"] == "HeadwiseForCausalLM" and got["module"].startswith("transformers_modules")
    model, _ = load_run_model(lm_run)
    tokenizer = run_tokenizer(lm_run, run_config(lm_run))
    assert got["prompt_ids"] == tokenizer.encode(prompt)
    with torch.no_grad():
        expected = model(torch.arange(100).view(1, 100) % model.spec.vocab_size)[0]
    assert torch.equal(torch.tensor(got["logits"]), expected)  # the same code and weights: the same numbers
    # greedy generate() equals headwise generate --temperature 0
    ours = generate(model, tokenizer.encode(prompt), 25, temperature=0, stop_id=tokenizer.eot_id)
    assert got["new_ids"] == ours
    # and each of its KV-cached steps scored the whole sequence so far (a briefly trained model may
    # choose the same tokens from a lost context; its logits would not be these)
    sequence = torch.tensor([got["prompt_ids"] + ours])
    with torch.no_grad():
        whole = model(sequence[:, :-1])[0, len(got["prompt_ids"]) - 1:]
    torch.testing.assert_close(torch.tensor(got["step_logits"]), whole, rtol=1e-4, atol=1e-4)
    assert main(["generate", str(lm_run), "--prompt", prompt, "--temperature", "0", "--max-new-tokens", "25",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["text"] == tokenizer.decode(ours)

    # and back into headwise: the same weights
    back = load_export(out)
    assert back.spec == model.spec
    for (k, a), (_, b) in zip(model.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), k


def test_export_refuses_what_it_cannot_write_and_keeps_existing_folders(lm_run, tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    assert main(["export", str(lm_run), "--hf", str(taken)]) == 2
    assert "already exists and is not empty" in capsys.readouterr().err
    assert [p.name for p in taken.iterdir()] == ["keep.txt"]
    assert main(["export", str(lm_run), "--hf", str(tmp_path / "neo"), "--gpt-neo"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "different head counts" in err and "export without --gpt-neo" in err
    assert not (tmp_path / "neo").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["taken"]
    assert main(["export", str(tmp_path / "nothing"), "--hf", str(tmp_path / "x")]) == 2
    assert "is not a headwise run" in capsys.readouterr().err


def test_gpt_neo_export_of_a_uniform_run(tmp_path, lm_run, capsys):
    out = tmp_path / "run"  # lm_run's fixture has set HEADWISE_DATA and the token cache it made
    assert main(["train", str(CONFIGS / "lm-tiny.toml"), "--out", str(out), "--set", "train.steps=4",
                 "--set", "eval.every=0", "--set", "checkpoint.every=0", "--set", "model.plan.scheme=constant",
                 "--set", "model.plan.total_heads=4", "--set", "model.score_scale=none"]) == 0
    neo = tmp_path / "neo"
    assert main(["export", str(out), "--hf", str(neo), "--gpt-neo"]) == 0
    config = json.loads((neo / "config.json").read_text())
    assert config["model_type"] == "gpt_neo" and "auto_map" not in config
    assert not (neo / "modeling_headwise.py").exists()
    hf = AutoModelForCausalLM.from_pretrained(neo).eval()
    model, _ = load_run_model(out)
    ids = torch.arange(64).view(1, 64)
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids), rtol=0, atol=1e-5)


# ------------------------------------------------------------------ classifiers

def test_classifiers_equal_headwise_and_load_with_their_auto_classes(tmp_path):
    from transformers import AutoModelForImageClassification, AutoModelForSequenceClassification

    torch.manual_seed(0)
    vit = Transformer(ModelSpec(inputs="images", image_size=8, patch_size=4, channels=3, num_classes=5, d_model=24,
                                n_layers=2, heads=[4, 1], head_dim=[6, 10], causal=False)).eval()
    text = Transformer(ModelSpec(vocab_size=30, pad_id=0, outputs="classes", num_classes=3, pooling="mean",
                                 d_model=16, n_layers=2, heads=[2, 4], max_seq_len=12, causal=False)).eval()
    pixels = torch.randn(2, 3, 8, 8)
    ids = torch.tensor([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14]])
    for model, auto, inputs, kwargs in ((vit, AutoModelForImageClassification, pixels, {}),
                                        (text, AutoModelForSequenceClassification, ids,
                                         {"attention_mask": (ids != 0).long()})):
        hf = from_headwise(model)
        labels = torch.tensor([1, 2])
        with torch.no_grad():
            out = hf(inputs, labels=labels, **kwargs)
            torch.testing.assert_close(out.logits, model(inputs), rtol=0, atol=0)
            torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(model(inputs), labels))
        assert hf.config.num_labels == model.spec.num_classes
        hf.save_pretrained(tmp_path / auto.__name__)
        loaded = auto.from_pretrained(tmp_path / auto.__name__).eval()
        with torch.no_grad():
            torch.testing.assert_close(loaded(inputs).logits, model(inputs), rtol=0, atol=0)
    with pytest.raises(ValueError, match="pad_id"):
        from_headwise(text)(ids, attention_mask=torch.ones_like(ids))


def test_models_no_transformers_class_expresses_are_refused_with_the_reason():
    vectors = Transformer(ModelSpec(inputs="vectors", d_model=8, n_layers=1, heads=[2], max_seq_len=4, causal=False))
    one_line_error(from_headwise, vectors, match="no transformers class for a model with inputs 'vectors'")


def test_an_exported_vit_run_loads_in_a_fresh_process(tmp_path, idx_folder):
    from headwise.train import run_training

    run = tmp_path / "run"
    run_training(vit_config(idx_folder, tmp_path / "cache", steps=3), run)
    out = tmp_path / "export"
    assert main(["export", str(run), "--hf", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["auto_map"]["AutoModelForImageClassification"] == "modeling_headwise.HeadwiseForImageClassification"
    assert not (out / "tokenizer.json").exists() and "pipeline_tag: image-classification" in (out / "README.md").read_text()
    script = textwrap.dedent("""
        import json, sys
        sys.modules["headwise"] = None
        import torch
        from transformers import AutoModelForImageClassification
        model = AutoModelForImageClassification.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
        torch.manual_seed(0)
        with torch.no_grad():
            print(json.dumps(model(torch.randn(2, 1, 16, 16)).logits.tolist()))
    """)
    got = _fresh_process(script, tmp_path, str(out))
    model, _ = load_run_model(run)
    torch.manual_seed(0)
    with torch.no_grad():
        expected = model(torch.randn(2, 1, 16, 16))
    torch.testing.assert_close(torch.tensor(got), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("line, error", [
    ("import headwise.text.tokenizer", "imports headwise.text.tokenizer, which an exported folder cannot carry"),
    ("from ..spec import ModelSpec", "imports ..spec, which an exported folder cannot carry"),
    ("from headwise.spec import NotInTheView", "imports NotInTheView from spec_view"),
    ("from .kernels import not_a_kernel", "imports not_a_kernel from kernels"),
])
def test_model_code_an_export_cannot_carry_is_refused_at_export(monkeypatch, tmp_path, line, error):
    from headwise.errors import RunFailure
    from headwise.hf import export

    original = export._source_of
    heads = original("headwise.model.outputs").read_text(encoding="utf-8")
    patched = tmp_path / "outputs.py"
    future = "from __future__ import annotations\n"
    patched.write_text(heads.replace(future, f"{future}{line}\n", 1), encoding="utf-8")
    monkeypatch.setattr(export, "_source_of",
                        lambda module: patched if module == "headwise.model.outputs" else original(module))
    with pytest.raises(RunFailure, match=error):
        export.bundled_sources(_model(heads=[2, 4, 2]))


def test_generate_stops_where_the_positions_end_by_default():
    model = _model(**SPECS["heterogeneous"])
    hf = from_headwise(model)  # no end-of-text: only the length stops it
    with torch.no_grad():
        out = hf.generate(torch.tensor([[1, 2, 3]]), do_sample=False)
    assert out.shape == (1, model.spec.max_seq_len)
