"""``headwise convert``: a ``transformers`` causal LM folder as a headwise run directory.

Tiny random ``LlamaForCausalLM``, ``Qwen3ForCausalLM`` (q/k norms, a sliding-window layer),
``LagunaForCausalLM`` (per-layer query heads, dense MLPs) and ``GPTNeoForCausalLM`` (a local
layer, GPT-2's tokenizer) are saved with ``save_pretrained``, converted through the CLI, loaded as
``headwise generate`` and ``headwise eval`` load a run (logits within 1e-5 of the ``transformers``
model's in float32), and exported back with ``headwise export`` (the same class, the same logits).
The converted run takes ``headwise generate``, ``analyze`` and fine-tuning with ``train.init_from``;
bad input is one line, exit 2, nothing written.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers (the hf extra) is not installed")
if not hasattr(transformers, "LagunaForCausalLM"):
    pytest.skip("this transformers has no Laguna (transformers >= 5.x)", allow_module_level=True)

from headwise.cli import main  # noqa: E402
from headwise.hf.architectures import architectures  # noqa: E402
from headwise.hf.models import from_run, load_export  # noqa: E402
from headwise.hf.tokenizer import hf_tokenizer  # noqa: E402
from headwise.run import RunDir, RunStatus, read_summary  # noqa: E402
from headwise.spec import ModelSpec  # noqa: E402
from headwise.text.tokenizer import BPETokenizer, gpt_neo_tokenizer  # noqa: E402
from headwise.train.generate import load_run_model, run_config, run_tokenizer  # noqa: E402
from decoder_parity import perturbed  # noqa: E402
from helpers import one_thread  # noqa: E402,F401  (one torch thread for this module)

BPE_VOCAB = 300
LLAMA_STYLE = dict(vocab_size=BPE_VOCAB, d_model=32, n_layers=3, heads=[4] * 3, max_seq_len=64, mlp_hidden=96,
                   activation="swiglu", norm="rmsnorm_pre", layer_norm_eps=1e-6, positions="rope", rope_theta=500.0,
                   score_scale="inv_sqrt", qkv_bias=False, out_bias=False, mlp_bias=False)
#: name (in the registry of architectures) -> (the spec's fields, the tokenizer written beside it)
CASES = {
    "llama": (dict(kv_heads=2, tie_embeddings=False), "bpe"),
    "qwen3": (dict(kv_heads=2, qk_norm="rmsnorm", attention=["global", "local", "global"], window=6), "bpe"),
    "laguna": (dict(heads=[4, 6, 2], head_dim=8, kv_heads=2, qk_norm="rmsnorm", output_gate="softplus_head"), "bpe"),
    "gpt-neo": (dict(vocab_size=50257, d_model=32, n_layers=2, heads=[4, 4], max_seq_len=64, mlp_hidden=64,
                     attention=["global", "local"], window=8), "gpt-neo"),
}
CLASSES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "laguna": "LagunaForCausalLM",
           "gpt-neo": "GPTNeoForCausalLM"}
IDS = torch.randint(0, BPE_VOCAB, (3, 40), generator=torch.Generator().manual_seed(2))


def _bpe(vocab: int = BPE_VOCAB) -> BPETokenizer:
    """A byte-level BPE of ``vocab`` ids, learnt on the tiny TinyStories fixture."""
    from tests.conftest import shared_data_dir

    return BPETokenizer.train([(shared_data_dir() / "tinystories-tiny-fixture.txt").read_text()], vocab)


def save_hf(folder: Path, name: str, tokenizer: str | None = "case") -> torch.nn.Module:
    """Write a tiny random model of case ``name`` into ``folder`` (and, unless ``tokenizer`` is
    None, its tokenizer, as ``headwise export`` writes one); returns the model."""
    fields, kind = CASES[name]
    spec = ModelSpec(**{**LLAMA_STYLE, **fields}) if name != "gpt-neo" else ModelSpec(**fields)
    torch.manual_seed(0)
    hf = getattr(transformers, CLASSES[name])(architectures()[name].to_config(spec)).eval()
    if name == "gpt-neo":
        # GPT-Neo does not scale its scores, which grow with the square of the weights: a smaller move
        # keeps its float error (it computes attention in another order) well inside 1e-5
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in hf.parameters():
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    else:
        perturbed(hf, seed=1)  # norms and biases away from ones and zeros
    hf.save_pretrained(folder)
    if tokenizer is not None:
        hf_tokenizer(gpt_neo_tokenizer() if kind == "gpt-neo" else _bpe()).save_pretrained(str(folder))
    return hf


def _max_diff(ours: torch.nn.Module, theirs: torch.nn.Module) -> float:
    with torch.no_grad():
        return (ours(IDS) - theirs(IDS).logits).abs().max().item()


@pytest.mark.parametrize("name", list(CASES))
def test_a_converted_run_computes_the_checkpoints_logits_and_exports_back(name, tmp_path, capsys):
    hf = save_hf(tmp_path / "hf", name)
    run = tmp_path / "run"
    capsys.readouterr()  # transformers' progress bar of save_pretrained
    assert main(["convert", str(tmp_path / "hf"), "--out", str(run)]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and f"wrote {run}: {CLASSES[name]} as a headwise run" in captured.out

    ours, source = load_run_model(run)  # as headwise generate loads a run
    diff = _max_diff(ours, hf)
    with capsys.disabled():
        print(f"{name}: max |logits diff| {diff:.3g}")
    assert diff < 1e-5 and source == str(RunDir(run).model)
    wrapped, _ = from_run(run)  # as headwise eval loads it
    with torch.no_grad():
        assert (wrapped(IDS).logits - hf(IDS).logits).abs().max().item() < 1e-5

    summary = read_summary(run)
    assert summary.status is RunStatus.COMPLETED and summary.steps == 0
    facts = summary.task["converted_from"]
    assert facts["class"] == CLASSES[name] and facts["transformers"] == transformers.__version__
    assert facts["source"] == str(tmp_path / "hf") and not facts["hub"]
    tokenizer = run_tokenizer(run, run_config(run))
    expected = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    text = "Once upon a time, Lily saw a big dog. <|endoftext|> It was happy!"
    assert tokenizer.encode(text) == expected(text, add_special_tokens=False).input_ids
    assert tokenizer.eot_id == expected.eos_token_id

    # the way back: headwise export --native auto writes the class it came from (GPT-Neo: headwise's own,
    # as auto never picks GPT-Neo; --native gpt-neo writes GPT-Neo)
    out = tmp_path / "export"
    assert main(["export", str(run), "--hf", str(out), "--native", "auto"]) == 0
    capsys.readouterr()
    if name == "gpt-neo":
        assert _max_diff(load_export(out), hf) < 1e-5
        assert main(["export", str(run), "--hf", str(tmp_path / "neo"), "--native", "gpt-neo"]) == 0
        out = tmp_path / "neo"
    back = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
    assert type(back).__name__ == CLASSES[name]
    with torch.no_grad():
        assert (back(IDS).logits - hf(IDS).logits).abs().max().item() < 1e-5


def test_a_headwise_export_comes_back_with_its_tokenizer_and_config(tmp_path, capsys):
    """An exported folder's ``headwise_config.toml`` gives the run its data and settings, and its
    tokenizer comes back byte for byte as the run's ``tokenizer.json``."""
    save_hf(tmp_path / "hf", "llama")
    run, again, out = tmp_path / "run", tmp_path / "again", tmp_path / "export"
    assert main(["convert", str(tmp_path / "hf"), "--out", str(run), "--set", "task.block_size=32",
                 "--set", "train.seed=7"]) == 0
    assert main(["export", str(run), "--hf", str(out)]) == 0
    assert main(["convert", str(out), "--out", str(again)]) == 0
    capsys.readouterr()
    assert RunDir(again).tokenizer.read_bytes() == RunDir(run).tokenizer.read_bytes()
    assert read_summary(again).tokenizer == read_summary(run).tokenizer
    first, second = run_config(run).to_dict(), run_config(again).to_dict()
    assert second == first and second["task"]["block_size"] == 32 and second["train"]["seed"] == 7
    weights = "model.safetensors"
    assert (RunDir(again).model / weights).read_bytes() == (RunDir(run).model / weights).read_bytes()


def test_a_converted_run_generates_is_analysed_and_fine_tuned(tmp_path, capsys, monkeypatch):
    from tests.conftest import shared_data_dir

    monkeypatch.setenv("HEADWISE_DATA", str(shared_data_dir()))
    monkeypatch.setenv("HEADWISE_CACHE", str(tmp_path / "cache"))
    hf = save_hf(tmp_path / "hf", "gpt-neo")
    run = tmp_path / "run"
    data = ["--set", "task.source=tinystories-train-sample.txt",
            "--set", "task.validation=tinystories-valid-sample.txt", "--set", "task.block_size=32",
            "--set", "task.eval_batches=1", "--set", "task.eval_batch_size=2"]
    assert main(["convert", str(tmp_path / "hf"), "--out", str(run), *data]) == 0
    capsys.readouterr()

    prompt = "Once upon a time"
    assert main(["generate", str(run), "--prompt", prompt, "--temperature", "0", "--max-new-tokens", "8",
                 "--json"]) == 0
    text = json.loads(capsys.readouterr().out)["text"]
    ids = gpt_neo_tokenizer().encode(prompt)
    hf.generation_config.eos_token_id = None  # greedy to the end, as headwise does here (no end-of-text drawn)
    expected = hf.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)[0, len(ids):].tolist()
    assert text == gpt_neo_tokenizer().decode(expected)

    assert main(["analyze", str(run), "--batches", "1"]) == 0
    assert "step 0: condition number" in capsys.readouterr().out
    assert (run / "analysis" / "conditioning.csv").is_file()

    # training on: a new run whose weights start from the converted ones (train.init_from)
    tuned = tmp_path / "tuned"
    assert main(["train", str(RunDir(run).config), "--out", str(tuned), "--set", f"train.init_from={run}",
                 "--set", "train.steps=2", "--set", "train.micro_batch=2", "--set", "eval.every=0",
                 "--set", "checkpoint.every=0", "--set", "log.trackers=[]"]) == 0
    assert read_summary(tuned).init_from["run"] == str(run) and read_summary(tuned).steps == 2


def test_a_folder_without_a_usable_tokenizer_converts_the_model_alone(tmp_path, capsys):
    hf = save_hf(tmp_path / "hf", "llama", tokenizer=None)
    run = tmp_path / "run"
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "hf"), "--out", str(run)]) == 0
    captured = capsys.readouterr()
    assert len(captured.err.strip().splitlines()) == 1 and "has no tokenizer" in captured.err
    assert "tokenizer none" in captured.out and not RunDir(run).tokenizer.exists()
    assert _max_diff(load_run_model(run)[0], hf) < 1e-5
    # what needs the tokenizer stops on the reason rather than taking GPT-2's for the model's ids
    assert main(["generate", str(run)]) == 2
    err = capsys.readouterr().err
    assert "has no tokenizer headwise can use" in err and "damaged" not in err

    # a tokenizer without an eos has no end-of-text for headwise to end documents with
    from tokenizers import AddedToken, Tokenizer

    other = tmp_path / "other"
    save_hf(other, "llama", tokenizer=None)
    foreign = transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(_bpe(BPE_VOCAB - 2).json))
    foreign.add_special_tokens({"bos_token": AddedToken("<s>", special=True)})
    foreign.save_pretrained(str(other))
    capsys.readouterr()
    assert main(["convert", str(other), "--out", str(tmp_path / "run2")]) == 0
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "no eos token" in err


def test_gpt2s_tokenizer_files_as_gpt_neo_checkpoints_ship_them_are_gpt_neo(tmp_path):
    """``vocab.json`` and ``merges.txt`` with a ``GPT2Tokenizer`` config (EleutherAI's GPT-Neo and
    the TinyStories models ship no ``tokenizer.json``) are headwise's ``gpt-neo``."""
    import shutil

    from headwise.hf.tokenizer import from_hf_tokenizer
    from headwise.text.tokenizer import gpt_neo_files

    files = gpt_neo_files()
    shutil.copyfile(files["encoder.json"], tmp_path / "vocab.json")
    shutil.copyfile(files["vocab.bpe"], tmp_path / "merges.txt")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": False, "bos_token": "<|endoftext|>",
         "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>", "model_max_length": 2048}))
    auto = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert from_hf_tokenizer(auto, 50257)[0] is gpt_neo_tokenizer()
    # a model that pads its embeddings past GPT-2's ids reads them as its own tokenizer
    assert from_hf_tokenizer(auto, 50304)[0].spec == "hf:50304"
    tokenizer, why = from_hf_tokenizer(auto, 50000)
    assert tokenizer is None and "more than the model's 50,000 embeddings" in why


def _refused(capsys, args: list[str], *expected: str) -> str:
    """Run ``headwise convert args``: exit 2 with one line holding each of ``expected``."""
    assert main(["convert", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for part in expected:
        assert part in err, err
    return err


def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out" / "run"
    _refused(capsys, [str(tmp_path / "missing"), "--out", str(out)], "does not exist")
    (tmp_path / "empty").mkdir()
    _refused(capsys, [str(tmp_path / "empty"), "--out", str(out)], "not a transformers model folder")

    mistral = tmp_path / "mistral"
    transformers.MistralConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                               num_attention_heads=2, architectures=["MistralForCausalLM"]).save_pretrained(mistral)
    _refused(capsys, [str(mistral), "--out", str(out)], "MistralForCausalLM", "LlamaForCausalLM, Qwen3ForCausalLM, "
             "LagunaForCausalLM, GPTNeoForCausalLM")

    moe = tmp_path / "moe"
    config = architectures()["laguna"].to_config(ModelSpec(**{**LLAMA_STYLE, **CASES["laguna"][0]}))
    config.mlp_layer_types = ["dense", "sparse", "dense"]
    config.save_pretrained(moe)
    _refused(capsys, [str(moe), "--out", str(out)], "mixture-of-experts")

    save_hf(tmp_path / "hf", "llama")
    capsys.readouterr()
    _refused(capsys, [str(tmp_path / "hf"), "--out", str(out), "--class", "qwen3"], "model_type 'llama'")
    _refused(capsys, [str(tmp_path / "hf"), "--out", str(out), "--set", "model.heads=[2,2,2]"], "model.heads")
    assert not (tmp_path / "out").exists()

    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    _refused(capsys, [str(tmp_path / "hf"), "--out", str(taken)], "not empty")
    assert [p.name for p in taken.iterdir()] == ["keep.txt"] and (taken / "keep.txt").read_text() == "mine"

    # a hub name that the cache does not hold, offline: one line, no download tried
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _refused(capsys, ["headwise-tests/no-such-model", "--out", str(out)], "HF_HUB_OFFLINE")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".run.*"))


def test_data_named_by_set_must_exist(tmp_path, capsys, monkeypatch):
    """``--set task.source=`` (or ``task.validation=``) naming missing data: refused as ``headwise
    train`` refuses it, before anything is written; data that exists is written into the run."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HEADWISE_DATA", raising=False)
    save_hf(tmp_path / "hf", "llama")
    capsys.readouterr()
    _refused(capsys, ["hf", "--out", "out/run", "--set", "task.source=missing.txt"],
             "--set task.source=missing.txt", "data source 'missing.txt' not found", "nothing was written")
    sample = "task.source=tinystories-train-sample.txt"  # the sample that ships with headwise
    _refused(capsys, ["hf", "--out", "out/run", "--set", sample, "--set", "task.validation=gone.txt"],
             "data source 'gone.txt' not found")
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]
    assert main(["convert", "hf", "--out", "out/run", "--set", sample]) == 0
    assert run_config(tmp_path / "out" / "run").task.source == "tinystories-train-sample.txt"


def test_weights_of_another_shape_name_the_tensor_and_both_shapes(tmp_path, capsys):
    """transformers refuses a size mismatch with "For details look at the above report!" (a
    report it logs, hidden here): the one line names the tensor and its two shapes instead."""
    save_hf(tmp_path / "hf", "llama")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "intermediate_size": 80}))
    capsys.readouterr()
    err = _refused(capsys, [str(tmp_path / "hf"), "--out", str(tmp_path / "run")], "do not fit its config.json",
                   "model.layers.0.mlp.down_proj.weight is [32, 48] in the weights file, [32, 80] by config.json")
    assert "above report" not in err and not (tmp_path / "run").exists()


def test_a_config_out_of_headwise_range_says_the_field_and_why(tmp_path, capsys):
    """A config whose converted spec pydantic refuses: the field and the reason, not the bare
    "validation error for ModelSpec" header."""
    save_hf(tmp_path / "hf", "llama")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 0}))
    capsys.readouterr()
    err = _refused(capsys, [str(tmp_path / "hf"), "--out", str(tmp_path / "run")],
                   "max_seq_len: Input should be greater than 0 (got 0)")
    assert "validation error" not in err and not (tmp_path / "run").exists()
