"""``headwise convert`` and ``headwise export`` of checkpoints of other shapes: sharded safetensors
(``model.safetensors.index.json``), bfloat16 and float16 weights kept in their dtype or cast on
request (``--dtype``), and the tokenizer files carried through both ways.

Tiny random Llama and GPT-Neo models (with Llama's own tokenizer class around a small BPE,
``special_tokens_map.json`` included) are saved by ``save_pretrained`` in shards of 20 KB, in
bfloat16 or float16. Against ``transformers``' own model: the converted run holds the
checkpoint's weights in its dtype; its logits in that dtype are as close to the float32 logits as
``transformers``' own are; the export (``--max-shard-size``) holds the checkpoint's tensors bit
for bit, so ``transformers`` computes the same logits from it; a cast run's weights and logits are
``transformers``' model cast the same way. ``AutoTokenizer`` on the export gives the source's ids.
A damaged shard index, shard or tokenizer file is one line naming it, exit 2, nothing written.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers (the hf extra) is not installed")

from headwise.cli import main  # noqa: E402
from headwise.hf.architectures import architectures  # noqa: E402
from headwise.model.pretrained import weights_dtype  # noqa: E402
from headwise.run import RunDir, read_summary  # noqa: E402
from headwise.spec import ModelSpec  # noqa: E402
from headwise.train.generate import load_run_model  # noqa: E402
from helpers import one_thread  # noqa: E402,F401  (one torch thread for this module)
from test_convert import CASES, CLASSES, LLAMA_STYLE, save_hf  # noqa: E402
from test_convert_own_tokenizer import TEXTS, own_tokenizer  # noqa: E402

SHARD = "20KB"
INDEX = "model.safetensors.index.json"
IDS = torch.randint(0, 200, (3, 40), generator=torch.Generator().manual_seed(2))
#: the special tokens of the Llama tokenizer, also written as the older ``special_tokens_map.json``
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}


def _model(name: str, dtype: torch.dtype) -> torch.nn.Module:
    """A tiny random ``name`` model in ``dtype``, its weights moved a little (a larger move makes
    bfloat16's own error of the order of the logits)."""
    fields = {**LLAMA_STYLE, **CASES[name][0]} if name == "llama" else CASES[name][0]
    spec = ModelSpec(**{**fields, "vocab_size": 200})
    torch.manual_seed(0)
    hf = getattr(transformers, CLASSES[name])(architectures()[name].to_config(spec)).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return hf.to(dtype)


def _save_sharded(folder: Path, name: str, dtype: torch.dtype) -> torch.nn.Module:
    """``name`` in ``dtype`` saved in shards with a tokenizer (Llama's own class around a small BPE,
    and ``special_tokens_map.json``, as older ``transformers`` wrote it); returns the model."""
    hf = _model(name, dtype)
    hf.save_pretrained(folder, max_shard_size=SHARD)
    own_tokenizer("llama").save_pretrained(str(folder))
    (folder / "special_tokens_map.json").write_text(json.dumps(SPECIAL))
    return hf


def _run(capsys, *args: str) -> str:
    """Run a headwise command that must succeed; its stdout."""
    capsys.readouterr()
    assert main(list(args)) == 0
    return capsys.readouterr().out


def _dtypes(folder: Path) -> set[str]:
    """The safetensors dtypes of every tensor in ``folder``'s weights (one file or shards)."""
    from safetensors import safe_open

    found = set()
    for path in folder.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            found |= {f.get_slice(k).get_dtype() for k in f.keys()}
    return found


def _logits(model) -> torch.Tensor:
    """``model``'s logits on :data:`IDS`, in float32 (a headwise model's or a transformers one's)."""
    with torch.no_grad():
        out = model(IDS)
    return (out if isinstance(out, torch.Tensor) else out.logits).float()


def _same_tensors(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    """Whether two models hold the same tensors, bit for bit and in the same dtype."""
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("name, dtype", [("llama", torch.bfloat16), ("llama", torch.float16),
                                         ("gpt-neo", torch.bfloat16)])
def test_a_sharded_half_precision_checkpoint_keeps_its_dtype_both_ways(name, dtype, tmp_path, capsys):
    _save_sharded(tmp_path / "hf", name, dtype)
    # transformers' model as it loads the folder (a model cast with .to() has its RoPE frequencies rounded too)
    theirs = getattr(transformers, CLASSES[name]).from_pretrained(str(tmp_path / "hf"), dtype=dtype).eval()
    assert len(list((tmp_path / "hf").glob("*.safetensors"))) > 1 and (tmp_path / "hf" / INDEX).is_file()
    run, label = tmp_path / "run", str(dtype).removeprefix("torch.")
    assert f"{label} weights" in _run(capsys, "convert", str(tmp_path / "hf"), "--out", str(run))
    facts = read_summary(run).task["converted_from"]
    assert facts["dtype"] == facts["checkpoint_dtype"] == label
    assert weights_dtype(RunDir(run).model / "model.safetensors") == dtype

    ours, _ = load_run_model(run)
    exact = getattr(transformers, CLASSES[name]).from_pretrained(str(tmp_path / "hf"), dtype=torch.float32).eval()
    reference = _logits(exact)
    assert (_logits(ours) - reference).abs().max() < 1e-5  # float32 on the checkpoint's values: exact
    # in the checkpoint's dtype: as close to the float32 logits as transformers' own model in that dtype
    own_error = (_logits(theirs) - reference).abs().max()
    ours_low = _logits(ours.to(dtype))
    assert 0 < (ours_low - reference).abs().max() <= 2 * own_error
    assert (ours_low - _logits(theirs)).abs().max() <= 2 ** -5 * reference.abs().max()

    out = tmp_path / "export"
    native = "gpt-neo" if name == "gpt-neo" else "auto"
    _run(capsys, "export", str(run), "--hf", str(out), "--native", native, "--max-shard-size", SHARD)
    assert json.loads((out / "config.json").read_text())["dtype"] == label
    assert (out / INDEX).is_file() and len(list(out.glob("*.safetensors"))) > 1
    assert _dtypes(out) == _dtypes(tmp_path / "hf")
    back = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype="auto").eval()
    assert type(back) is type(theirs) and _same_tensors(back, theirs)
    assert torch.equal(_logits(back), _logits(theirs))


def test_a_cast_run_is_transformers_model_cast_the_same_way(tmp_path, capsys):
    _save_sharded(tmp_path / "bf16", "llama", torch.bfloat16)
    # bfloat16 -> float32 on request: the run's float32 logits are those of transformers' model cast to float32
    _run(capsys, "convert", str(tmp_path / "bf16"), "--out", str(tmp_path / "up"), "--dtype", "float32")
    facts = read_summary(tmp_path / "up").task["converted_from"]
    assert (facts["checkpoint_dtype"], facts["dtype"]) == ("bfloat16", "float32")
    assert _dtypes(RunDir(tmp_path / "up").model) == {"F32"}
    ours, _ = load_run_model(tmp_path / "up")
    cast = transformers.LlamaForCausalLM.from_pretrained(str(tmp_path / "bf16"), dtype=torch.bfloat16).float()
    assert (_logits(ours) - _logits(cast)).abs().max() < 1e-5
    _run(capsys, "export", str(tmp_path / "up"), "--hf", str(tmp_path / "up-hf"))
    assert _same_tensors(transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "up-hf")), cast)

    # float32 -> bfloat16 on request: the run's weights are transformers' model in bfloat16, and
    # export --dtype casts them back to float32 on request
    save_hf(tmp_path / "fp32", "llama")
    _run(capsys, "convert", str(tmp_path / "fp32"), "--out", str(tmp_path / "down"), "--dtype", "bfloat16")
    assert read_summary(tmp_path / "down").task["converted_from"]["checkpoint_dtype"] == "float32"
    expected = transformers.LlamaForCausalLM.from_pretrained(str(tmp_path / "fp32"), dtype=torch.float32).to(
        torch.bfloat16)
    _run(capsys, "export", str(tmp_path / "down"), "--hf", str(tmp_path / "down-hf"))
    assert _same_tensors(transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "down-hf")), expected)
    _run(capsys, "export", str(tmp_path / "down"), "--hf", str(tmp_path / "down-32"), "--dtype", "float32")
    assert _same_tensors(transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "down-32")),
                         expected.float())


def test_the_tokenizer_files_come_back_with_the_same_ids(tmp_path, capsys):
    _save_sharded(tmp_path / "hf", "llama", torch.bfloat16)
    source = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    _run(capsys, "convert", str(tmp_path / "hf"), "--out", str(tmp_path / "run"))
    _run(capsys, "export", str(tmp_path / "run"), "--hf", str(tmp_path / "export"))
    back = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "export"))
    assert (back.bos_token, back.eos_token) == (SPECIAL["bos_token"], SPECIAL["eos_token"])
    assert (back.bos_token_id, back.eos_token_id) == (source.bos_token_id, source.eos_token_id)
    for text in TEXTS:
        assert back(text).input_ids == source(text).input_ids, text
        assert back.decode(source(text).input_ids) == source.decode(source(text).input_ids)


def _rewrite_index(folder: Path, change) -> None:
    index = json.loads((folder / INDEX).read_text())
    change(index["weight_map"])
    (folder / INDEX).write_text(json.dumps(index))


def _first_shard(folder: Path) -> str:
    return sorted(set(json.loads((folder / INDEX).read_text())["weight_map"].values()))[0]


def _move_a_tensor(weight_map: dict) -> None:
    """Put the first shard's first tensor in the last shard, which does not hold it."""
    shards = sorted(set(weight_map.values()))
    tensor = next(t for t, s in weight_map.items() if s == shards[0])
    weight_map[tensor] = shards[-1]


def _shards_elsewhere(folder: Path) -> None:
    """Copy every shard into the folder's parent and point the index there (the files exist)."""
    for shard in set(json.loads((folder / INDEX).read_text())["weight_map"].values()):
        shutil.copyfile(folder / shard, folder.parent / shard)
    _rewrite_index(folder, lambda m: m.update({t: f"../{s}" for t, s in m.items()}))


#: (what is damaged, the file the message names, how)
DAMAGES = {
    "index not JSON": (INDEX, lambda d: (d / INDEX).write_text("{")),
    "index without a weight map": (INDEX, lambda d: (d / INDEX).write_text(json.dumps({"metadata": {}}))),
    "index names a missing shard": (INDEX, lambda d: (d / _first_shard(d)).unlink()),
    "index puts a tensor in a shard without it": (INDEX, lambda d: _rewrite_index(d, _move_a_tensor)),
    "index names a tensor no shard holds": (INDEX, lambda d: _rewrite_index(
        d, lambda m: m.update({"model.layers.9.mlp.up_proj.weight": sorted(set(m.values()))[0]}))),
    "index names shards outside the folder": (INDEX, _shards_elsewhere),
    "shard truncated": ("first shard", lambda d: (d / _first_shard(d)).write_bytes(
        (d / _first_shard(d)).read_bytes()[:300])),
    "tokenizer.json truncated": ("tokenizer.json", lambda d: (d / "tokenizer.json").write_bytes(
        (d / "tokenizer.json").read_bytes()[:200])),
    "tokenizer.json a list": ("tokenizer.json", lambda d: (d / "tokenizer.json").write_text("[1]")),
    "tokenizer.json not a tokenizer": ("tokenizer.json", lambda d: (d / "tokenizer.json").write_text('{"a": 1}')),
    "tokenizer_config.json not JSON": ("tokenizer_config.json", lambda d: (d / "tokenizer_config.json").write_text(
        "{")),
    "special_tokens_map.json not JSON": ("special_tokens_map.json", lambda d: (d / "special_tokens_map.json")
                                         .write_bytes(b"\xff\xfe")),
}


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("sharded") / "hf"
    _save_sharded(folder, "llama", torch.bfloat16)
    return folder


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_shard_index_shard_or_tokenizer_file_is_one_line_naming_it(damage, sharded, tmp_path, capsys):
    folder = tmp_path / "hf"
    shutil.copytree(sharded, folder)
    named, change = DAMAGES[damage]
    path = folder / (_first_shard(folder) if named == "first shard" else named)
    change(folder)
    out = tmp_path / "out" / "run"
    capsys.readouterr()
    assert main(["convert", str(folder), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and captured.out == "", captured.err
    assert f"{path} is damaged: " in lines[0] and "nothing was written" in lines[0], lines[0]
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".*"))


def test_export_options_out_of_range_are_one_line_and_write_nothing(sharded, tmp_path, capsys):
    run = tmp_path / "run"
    _run(capsys, "convert", str(sharded), "--out", str(run))
    for args, says in ((["--hf", str(tmp_path / "x" / "hf"), "--max-shard-size", "lots"], "--max-shard-size lots"),
                       (["--timm", str(tmp_path / "x" / "timm"), "--dtype", "bfloat16"], "options of --hf")):
        assert main(["export", str(run), *args]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and says in err and "nothing was written" in err, err
    assert not (tmp_path / "x").exists()
