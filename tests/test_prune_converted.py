"""``headwise heads score`` and ``heads prune`` on converted models, as a new user runs them.

A tiny random ``LlamaForCausalLM`` (one key/value head per query head), ``Qwen3ForCausalLM``
(q/k norms, grouped key/value heads, a sliding-window layer) and ``LagunaForCausalLM`` (per-layer
query heads over 2 key/value heads, a softplus output gate) are saved with their own tokenizers
(Llama's with a bos, Qwen's without), converted with ``headwise convert``, scored, and pruned to 8
heads globally and per layer. Against ``transformers``' own model: the ablation scores are its
losses with a head's ``o_proj`` columns zeroed, and each pruned run's logits are its logits with
the removed heads' columns zeroed (and headwise's with those heads gated off). Each pruned run is
exported with ``headwise export``: where a native class holds it (a pruned Laguna's per-layer query
heads over uniform key/value heads: ``LagunaForCausalLM``) that class loads it with the same logits
and the tokenizer's own bos and eos.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers", reason="transformers (the hf extra) is not installed")
if not hasattr(transformers, "LagunaForCausalLM"):
    pytest.skip("this transformers has no Laguna (transformers >= 5.x)", allow_module_level=True)

from conftest import shared_data_dir  # noqa: E402
from decoder_parity import perturbed  # noqa: E402
from headwise.analysis.head_importance import groups_of, head_gates, head_shapes, validation_sample  # noqa: E402
from headwise.cli import main  # noqa: E402
from headwise.hf.architectures import architectures  # noqa: E402
from headwise.hf.native import choose, to_native  # noqa: E402
from headwise.model import Transformer  # noqa: E402
from headwise.spec import ModelSpec  # noqa: E402
from headwise.text.tokenizer import gpt_neo_tokenizer  # noqa: E402
from headwise.train.generate import load_run_model, run_config  # noqa: E402
from helpers import one_thread  # noqa: E402,F401  (one torch thread for this module)
from test_convert import CLASSES, LLAMA_STYLE  # noqa: E402
from test_convert_own_tokenizer import own_tokenizer  # noqa: E402

#: each model's fields beside LLAMA_STYLE's (3 layers of 4 heads of 8 over d_model 32): Laguna's
#: layers all grouped, so that any pruning keeps its 2 key/value heads in every layer
SPECS = {
    "llama": dict(tie_embeddings=False),
    "qwen3": dict(kv_heads=2, qk_norm="rmsnorm", attention=["global", "local", "global"], window=6),
    "laguna": dict(heads=[4, 6, 4], head_dim=8, kv_heads=2, qk_norm="rmsnorm", output_gate="softplus_head"),
}
#: the budget (``--to heads:10``) and the validation tokens scored on
BUDGET, TOKENS = 8, 64
#: the class each pruned run exports as: uniform layers (2 heads each) stay Llama / Qwen3, per-layer
#: query heads need Laguna (which needs the gate), else headwise's own class
EXPORTED = {("llama", "per-layer"): "LlamaForCausalLM", ("qwen3", "per-layer"): "Qwen3ForCausalLM",
            ("laguna", "per-layer"): "LagunaForCausalLM", ("laguna", "global"): "LagunaForCausalLM"}
SCOPES = ("global", "per-layer")
IDS = torch.randint(0, 150, (2, 24), generator=torch.Generator().manual_seed(0))


@dataclass
class Case:
    name: str
    hf: torch.nn.Module
    auto: object
    run: Path
    root: Path

    def pruned(self, scope: str) -> Path:
        return self.root / scope


def _save(folder: Path, name: str):
    """A tiny random ``name`` model and its own tokenizer saved in ``folder``; returns (model, AutoTokenizer)."""
    tokenizer = own_tokenizer(name)
    spec = ModelSpec(**{**LLAMA_STYLE, **SPECS[name], "vocab_size": len(tokenizer)})
    config = architectures()[name].to_config(spec)
    config.bos_token_id, config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    torch.manual_seed(0)
    hf = getattr(transformers, CLASSES[name])(config).eval()
    perturbed(hf, seed=1)
    hf.save_pretrained(folder)
    tokenizer.save_pretrained(str(folder))
    return hf, transformers.AutoTokenizer.from_pretrained(str(folder))


@pytest.fixture(scope="module", params=list(SPECS))
def case(request, tmp_path_factory) -> Case:
    """A converted model, scored, and pruned to :data:`BUDGET` heads in both scopes: globally by the
    scores ``heads score`` wrote, per layer by scores ``heads prune`` computes itself."""
    name, root = request.param, tmp_path_factory.mktemp(request.param)
    hf, auto = _save(root / "hf", name)
    run, data = root / "run", shared_data_dir()
    assert main(["convert", str(root / "hf"), "--out", str(run),
                 "--set", f"task.source={data / 'tinystories-train-sample.txt'}",
                 "--set", f"task.validation={data / 'tinystories-valid-sample.txt'}", "--set", "task.block_size=32"]) == 0
    assert main(["heads", "score", str(run), "--tokens", str(TOKENS), "--method", "gradient,ablation"]) == 0
    budget = ["--to", f"heads:{BUDGET}"]
    assert main(["heads", "prune", str(run), *budget, "--out", str(root / "global"),
                 "--scores", str(run / "heads" / "head_scores.json")]) == 0
    assert main(["heads", "prune", str(run), *budget, "--out", str(root / "per-layer"), "--scope", "per-layer",
                 "--tokens", str(TOKENS)]) == 0
    return Case(name, hf, auto, run, root)


def _zeroed(hf: torch.nn.Module, head_dims: list[int], removed: list[list[int]]) -> torch.nn.Module:
    """A copy of a ``transformers`` model whose ``o_proj`` reads nothing of the ``removed`` heads."""
    edited = copy.deepcopy(hf)
    with torch.no_grad():
        for layer, d, gone in zip(edited.model.layers, head_dims, removed):
            for h in gone:
                layer.self_attn.o_proj.weight[:, h * d:(h + 1) * d] = 0
    return edited


def _close(ours: torch.Tensor, theirs: torch.Tensor, tol: float) -> None:
    torch.testing.assert_close(ours, theirs, rtol=tol, atol=tol * theirs.abs().max().item())


def test_ablation_scores_are_transformers_losses_with_a_head_removed(case):
    record = json.loads((case.run / "heads" / "head_scores.json").read_text())
    original, _ = load_run_model(case.run)
    shapes = head_shapes(original)
    inputs, targets, _ = validation_sample(case.run, run_config(case.run), TOKENS)
    assert record["tokens"] == inputs.numel() == TOKENS

    def loss(model: torch.nn.Module) -> float:
        with torch.no_grad():
            return float(F.cross_entropy(model(inputs).logits.flatten(0, 1), targets.flatten()))

    base = loss(case.hf)
    dims = [s.head_dim for s in shapes]
    assert record["loss"] == pytest.approx(base, rel=1e-5)
    for i, (shape, layer) in enumerate(zip(shapes, record["methods"]["ablation"]["layers"])):
        for h, score in enumerate(layer["heads"]):
            gone = [[h] if j == i else [] for j in range(len(shapes))]
            assert score == pytest.approx(loss(_zeroed(case.hf, dims, gone)) - base, abs=2e-5), (i, h)
        groups = groups_of(shape)
        assert (layer["groups"] is None) == (groups is None)
        for g, score in zip(groups or [], layer["groups"] or []):
            gone = [g if j == i else [] for j in range(len(shapes))]
            assert score == pytest.approx(loss(_zeroed(case.hf, dims, gone)) - base, abs=2e-5), (i, g)


@pytest.mark.parametrize("scope", SCOPES)
def test_a_pruned_run_is_the_converted_model_with_those_heads_gated_off(case, scope):
    record = json.loads((case.pruned(scope) / "pruned.json").read_text())
    removed = record["removed"]
    original, _ = load_run_model(case.run)
    model, _ = load_run_model(case.pruned(scope))
    shapes = head_shapes(original)
    assert record["scope"] == scope and sum(model.spec.heads) <= BUDGET < sum(original.spec.heads)
    assert model.spec.heads == [s.heads - len(r) for s, r in zip(shapes, removed)]
    # a grouped layer keeps its key/value heads; a head of any other goes with its keys and values
    assert model.spec.kv_heads_per_layer == [s.kv_heads if groups_of(s) else h
                                             for s, h in zip(shapes, model.spec.heads)]
    if scope == "per-layer":  # the same number of units from every layer
        assert len({len(r) // (s.kv_heads if groups_of(s) else 1) for s, r in zip(shapes, removed)}) == 1
    else:  # heads compete across layers: the allocation is per layer
        assert len(set(model.spec.heads)) > 1
    gates = []
    for shape, gone in zip(shapes, removed):
        gate = torch.ones(shape.heads)
        gate[gone] = 0
        gates.append(gate)
    with torch.no_grad():
        with head_gates(original, gates):
            gated = original(IDS)
        ours, theirs = model(IDS), _zeroed(case.hf, [s.head_dim for s in shapes], removed)(IDS).logits
    _close(ours, gated, 1e-6)
    _close(ours, theirs, 1e-5)
    assert (ours - case.hf(IDS).logits).abs().max() > 1e-2  # the heads mattered


def test_a_pruned_run_heals_by_distillation_on_its_own_tokenizer_and_resumes(case, tmp_path, capsys):
    """Healing reads the converted model's tokenizer (``hf:N``, which no run can learn) from its
    ``init_from`` run, saves that very tokenizer, and reads its own when it resumes; a task naming
    another is one line."""
    from headwise.train.generate import run_tokenizer

    pruned, out = case.pruned("global"), tmp_path / "healed"
    heal = ["train", str(pruned / "config.toml"), "--out", str(out), "--set", f"train.init_from={pruned}",
            "--set", f"train.distill.teacher={case.run}", "--set", "train.micro_batch=2", "--set", "train.log_every=1"]
    spec = run_config(pruned).task.tokenizer
    assert main([*heal, "--set", f"task.tokenizer=hf:{int(spec[3:]) + 1}", "--set", "train.steps=2"]) == 2
    assert f"saved the tokenizer {spec}" in capsys.readouterr().err and not out.exists()
    assert main([*heal, "--set", "train.steps=2"]) == 0
    assert main([*heal, "--set", "train.steps=3", "--resume"]) == 0
    source = run_tokenizer(case.run, run_config(case.run))
    assert run_tokenizer(out, run_config(out)).sha256 == source.sha256 and source.spec == spec
    assert json.loads((out / "summary.json").read_text())["steps"] == 3


@pytest.mark.parametrize("scope", SCOPES)
def test_a_pruned_run_exports_as_the_native_class_that_holds_it(case, scope, tmp_path, capsys):
    out = tmp_path / "export"
    assert main(["export", str(case.pruned(scope)), "--hf", str(out)]) == 0
    capsys.readouterr()
    config = json.loads((out / "config.json").read_text())
    expected = EXPORTED.get((case.name, scope))
    # the tokenizer's own special tokens: Llama's bos <s> and eos </s>; Qwen's eos, and no bos (so the eos)
    auto = case.auto
    bos = auto.bos_token_id if auto.bos_token_id is not None else auto.eos_token_id
    assert (case.name == "llama") == (bos != auto.eos_token_id)
    if expected is None:  # per-layer query heads without Laguna's gate: headwise's own class, same tokens
        assert config["architectures"] == ["HeadwiseForCausalLM"]
        generation = json.loads((out / "generation_config.json").read_text())
        for settings in (config, generation):
            assert (settings["bos_token_id"], settings["eos_token_id"]) == (bos, auto.eos_token_id)
        return
    assert config["architectures"] == [expected]
    model, _ = load_run_model(case.pruned(scope))
    back = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    assert type(back).__name__ == expected
    if expected == "LagunaForCausalLM":
        assert back.config.num_attention_heads_per_layer == model.spec.heads
        assert back.config.num_key_value_heads == 2
    with torch.no_grad():
        _close(back(IDS).logits, model(IDS), 1e-5)
    for settings in (back.config, back.generation_config):
        assert (settings.bos_token_id, settings.eos_token_id) == (bos, auto.eos_token_id)
    exported = transformers.AutoTokenizer.from_pretrained(str(out))
    assert (exported.bos_token_id, exported.eos_token_id) == (bos, auto.eos_token_id)


def test_gpt2s_tokenizer_exports_its_end_of_text_as_bos_and_eos():
    tokenizer = gpt_neo_tokenizer()
    spec = ModelSpec(**{**LLAMA_STYLE, "vocab_size": tokenizer.vocab_size, "d_model": 16, "n_layers": 1,
                        "heads": [2], "mlp_hidden": 32})
    hf = to_native(Transformer(spec), architectures()["llama"], tokenizer.eot_id, tokenizer.bos_id)
    assert tokenizer.bos_id is None
    for settings in (hf.config, hf.generation_config):
        assert settings.bos_token_id == settings.eos_token_id == tokenizer.eot_id == 50256


def test_a_llama_whose_heads_do_not_divide_its_width_is_not_exported_as_llama():
    # per-layer pruning of 4 heads of 8 over d_model 32 to 3: LlamaConfig refuses it, Laguna needs a gate
    spec = ModelSpec(**{**LLAMA_STYLE, "heads": [3, 3, 3], "head_dim": 8})
    target, note = choose(spec, "auto")
    assert target is None and "LlamaConfig requires" in note
    with pytest.raises(Exception, match="not a multiple of the number of attention heads"):  # transformers' own rule
        transformers.LlamaConfig(hidden_size=32, num_attention_heads=3, head_dim=8)
