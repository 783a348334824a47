"""A run keeps its tokenizer (issue 32): a tiny masked LM and a tiny causal LM are trained on a
small corpus file, which is then EDITED so that a BPE trained on it again gives other ids. Fine-
tuning (``tokenizer_from``, ``init_from``), ``headwise export`` and ``headwise generate`` must still
use the ids training used: the reference is the token cache's tokenizer the runs trained with,
read before the edit (not the run folder's copy). A fine-tuning whose vocabulary is not its
source's, a damaged saved tokenizer and a resume on the edited text are refused in one line."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import tomli_w
import torch

pytest.importorskip("transformers", reason="transformers (the hf extra) is not installed")

from transformers import PreTrainedTokenizerFast  # noqa: E402

from headwise.analysis.conditioning import analyze_model  # noqa: E402
from headwise.analysis.runs import eval_inputs  # noqa: E402
from headwise.cli import main  # noqa: E402
from headwise.errors import RunFailure  # noqa: E402
from headwise.data.sources import open_source  # noqa: E402
from headwise.families.encoder.glue_task import encode_pair  # noqa: E402
from headwise.families.encoder.task import MLMTaskConfig  # noqa: E402
from headwise.families.lm.task import LMTaskConfig  # noqa: E402
from headwise.text.masked_vocab import CLS_ID, NUM_SPECIAL, SEP_ID, MaskedVocab  # noqa: E402
from headwise.text.token_cache import prepare  # noqa: E402
from headwise.text.tokenizer import GPT_NEO_FILES, gpt_neo_tokenizer  # noqa: E402
from headwise.run import RunSummary, read_summary  # noqa: E402
from headwise.run.tokenizer import read_run_tokenizer  # noqa: E402
from headwise.train.generate import generate, held_out_predictions, load_run_model, run_config, run_task  # noqa: E402
from headwise.model import load_pretrained  # noqa: E402
from headwise.train.generate import run_tokenizer  # noqa: E402
from tests.conftest import shared_data_dir  # noqa: E402
from tests.helpers import one_thread, read_csv  # noqa: E402, F401 (a fixture)

SPEC = "bpe:300"
TEXTS = ["Once upon a time, there was a little dog named Max.", "Lily and Tom played in the park all day!",
         "The big red ball rolled under the tree, and the cat jumped."]
PAIRS = [("Tom had a ball.", "He liked to play with it every day."), ("Lily saw a dog.", "It was big.")]
MODEL = {"d_model": 32, "n_layers": 1, "heads": [2], "mlp_hidden": 64}
RUN = {"optim": {"lr": 1e-3}, "train": {"micro_batch": 4, "steps": 2, "device": "cpu", "log_every": 1},
       "eval": {"every": 0}, "checkpoint": {"every": 0}}


def _stories(name: str, start: int, stop: int) -> str:
    docs = list(open_source(str(shared_data_dir() / name), "stories", None, None).documents())[start:stop]
    return "\n<|endoftext|>\n".join(docs) + "\n"


def _train(root: Path, name: str, model: dict, task: dict, *sets: str, **train) -> Path:
    """``headwise train`` of a config written from ``model`` and ``task`` into ``root/name``."""
    config = root / f"{name}.toml"
    config.write_text(tomli_w.dumps({"model": model, "task": task, **RUN, "train": {**RUN["train"], **train}}))
    out = root / name
    assert main(["train", str(config), "--out", str(out), *sets]) == 0
    return out


def _glue(mlm: Path, **fields) -> dict:
    return {"kind": "glue", "task": "standin", "tokenizer_from": str(mlm), "max_length": 32, "eval_batch_size": 8,
            **fields}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The runs, the tokenizers they trained with (read from the token caches before the edit),
    and the corpus file, edited after they trained."""
    root = tmp_path_factory.mktemp("runs")
    mp = pytest.MonkeyPatch()
    mp.setenv("HEADWISE_DATA", str(shared_data_dir()))  # the glue stand-in's default source
    mp.setenv("HEADWISE_CACHE", str(root / "cache"))
    corpus, valid = root / "corpus.txt", root / "valid.txt"
    corpus.write_text(_stories("tinystories-train-sample.txt", 0, 150))
    valid.write_text(_stories("tinystories-valid-sample.txt", 0, 40))
    data = {"source": str(corpus), "validation": str(valid), "tokenizer": SPEC, "block_size": 32,
            "eval_batches": 1, "eval_batch_size": 4}
    mlm_model = {"preset": "crammed-bert-tiny", **MODEL, "pad_id": 0}
    mlm_task = MLMTaskConfig(kind="mlm", **data)
    mlm = _train(root, "mlm", mlm_model, {"kind": "mlm", **data})
    lm_task = LMTaskConfig(kind="lm", **data)
    lm = _train(root, "lm", {"preset": "tiny-lm", **MODEL, "max_seq_len": 64}, {"kind": "lm", **data})
    before = mlm_task.build()  # the task the masked LM trained on: its cache, its tokenizer
    trained = before.tokenizer
    lm_before = lm_task.build()
    assert lm_before.tokenizer.sha256 == trained.sha256  # one cache, one tokenizer for both runs

    corpus.write_text(_stories("tinystories-train-sample.txt", 150, 300))  # the edit
    rebuilt = prepare(mlm_task).tokenizer
    assert rebuilt.spec == trained.spec and rebuilt.sha256 != trained.sha256
    differ = [t for t in TEXTS if rebuilt.encode(t) != trained.encode(t)]
    assert len(differ) == len(TEXTS), "a BPE trained on the edited corpus must give other ids for every sample"
    yield SimpleNamespace(root=root, mlm=mlm, lm=lm, trained=trained, rebuilt=rebuilt, before=before,
                          lm_before=lm_before, mlm_model=mlm_model, data=data)
    mp.undo()


@pytest.fixture(scope="module")
def glue_run(runs):
    """A fine-tuning of the masked LM, started after the corpus was edited."""
    model = {"preset": "crammed-bert-tiny", **MODEL, "classifier_hidden": 32}
    return _train(runs.root, "glue", model, _glue(runs.mlm), init_from=str(runs.mlm))


def _masked(tokenizer, text: str) -> list[int]:
    """[CLS] text [SEP] in a masked LM's ids, built by hand from the lm tokenizer's."""
    return [CLS_ID, *(i + NUM_SPECIAL for i in tokenizer.encode(text)), SEP_ID]


def _one_line(capsys, *words: str) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err
    return err


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        h.update(str(p.relative_to(folder)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


# ------------------------------------------------------------------ what a run saves


def test_a_text_run_saves_its_tokenizer_and_its_summary_records_the_hash(runs, glue_run):
    for run in (runs.mlm, runs.lm, glue_run):
        text = (run / "tokenizer.json").read_text(encoding="utf-8")
        assert text == runs.trained.json  # the very file the cache trained
        record = read_summary(run).tokenizer
        assert record == {"spec": SPEC, "vocab_size": 300, "eot_id": 299,
                          "sha256": hashlib.sha256(f"{SPEC}\n{text}".encode()).hexdigest()}
    # older summaries read without it, and summaries of runs without text do not grow the key
    data = json.loads((runs.mlm / "summary.json").read_text())
    del data["tokenizer"]
    old = RunSummary.from_json(json.dumps(data))
    assert old.tokenizer is None and "tokenizer" not in json.loads(old.to_json())


# ------------------------------------------------------------------ (a) fine-tuning


def test_fine_tuning_encodes_in_the_pretraining_runs_own_vocabulary(runs, glue_run):
    cfg = run_config(glue_run)
    task = cfg.task.build()  # tokenizer_from: the masked LM's saved tokenizer, not the edited corpus's BPE
    assert task.tokenizer.sha256 == runs.trained.sha256
    for text in TEXTS:
        assert task.vocab.encode(text) == _masked(runs.trained, text) != _masked(runs.rebuilt, text)
    # the rows it fine-tuned on: [CLS] a [SEP] b [SEP] in the pretraining ids
    a, b = PAIRS[0]
    row = [CLS_ID, *(i + NUM_SPECIAL for i in runs.trained.encode(a)), SEP_ID,
           *(i + NUM_SPECIAL for i in runs.trained.encode(b)), SEP_ID]
    assert encode_pair(task.vocab, a, b, 64) == row  # long enough not to be trimmed


# ------------------------------------------------------------------ (b) export


def test_export_writes_the_tokenizer_the_runs_trained_with(runs, glue_run, tmp_path, capsys):
    hf = {}
    for name, run in (("mlm", runs.mlm), ("lm", runs.lm), ("glue", glue_run)):
        assert main(["export", str(run), "--hf", str(tmp_path / name)]) == 0
        hf[name] = PreTrainedTokenizerFast.from_pretrained(str(tmp_path / name))
    capsys.readouterr()
    for text in TEXTS:
        assert hf["mlm"](text).input_ids == _masked(runs.trained, text)
        assert hf["lm"](text).input_ids == runs.trained.encode(text) != runs.rebuilt.encode(text)
    # the fine-tuned classifier's tokenizer frames and truncates pairs as fine-tuning did
    vocab = MaskedVocab(runs.trained)
    for a, b in PAIRS + [(" ".join(TEXTS), " ".join(TEXTS[::-1]))]:
        assert hf["glue"](a, b, truncation=True).input_ids == encode_pair(vocab, a, b, 32)


# ------------------------------------------------------------------ (c) generate


def test_generate_uses_the_runs_vocabulary(runs, capsys):
    # a causal LM continues the prompt in its own ids
    prompt = "Once upon a time, there was"
    assert main(["generate", str(runs.lm), "--prompt", prompt, "--temperature", "0", "--max-new-tokens", "12",
                 "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    model, _ = load_run_model(runs.lm)
    tok = runs.trained
    assert got["text"] == tok.decode(generate(model, tok.encode(prompt), 12, temperature=0, stop_id=tok.eot_id))
    # a masked LM's held-out batch: the unchanged validation file in the run's own ids, masked as in training
    task = run_task(runs.mlm, run_config(runs.mlm))
    assert task.tokenizer.sha256 == runs.trained.sha256
    expected, again = runs.before.eval_batches()[0], task.eval_batches()[0]
    assert torch.equal(again.inputs, expected.inputs) and torch.equal(again.targets, expected.targets)
    assert main(["generate", str(runs.mlm), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    model, source = load_run_model(runs.mlm)
    assert got == {"model": source, **held_out_predictions(model, runs.before, expected)}


def test_analyze_and_the_report_probes_measure_in_the_runs_vocabulary(runs, tmp_path, capsys):
    """``headwise analyze`` and a report's conditioning probe (both :func:`eval_inputs`) feed the
    model the held-out text in the ids it trained with, not a BPE trained again on the edited corpus."""
    for run, before in ((runs.lm, runs.lm_before), (runs.mlm, runs.before)):
        assert torch.equal(eval_inputs(run, 1)[0], before.eval_batches()[0].inputs)
    # what building the task from its config alone now gives: other ids for the same validation text
    edited = LMTaskConfig(kind="lm", **runs.data).build()
    assert edited.tokenizer.sha256 == runs.rebuilt.sha256
    assert not torch.equal(edited.eval_batches()[0].inputs, runs.lm_before.eval_batches()[0].inputs)
    run = Path(shutil.copytree(runs.lm, tmp_path / "lm"))
    assert main(["analyze", str(run), "--checkpoints", "last", "--batches", "1"]) == 0
    capsys.readouterr()
    (row,) = [r for r in read_csv(run / "analysis" / "conditioning.csv") if r["layer"] == "all"]
    (checkpoint,) = (run / "checkpoints").glob("step_*")
    expected = analyze_model(load_pretrained(checkpoint), [runs.lm_before.eval_batches()[0].inputs])
    assert float(row["cond_mean"]) == pytest.approx(expected.cond_mean)


# ------------------------------------------------------------------ (d) another vocabulary


def test_a_source_with_another_vocabulary_of_the_same_size_is_refused(runs, tmp_path, capsys):
    other = _train(tmp_path, "other", runs.mlm_model, {"kind": "mlm", **runs.data})  # BPE of the edited corpus
    mine, theirs = read_summary(runs.mlm).tokenizer, read_summary(other).tokenizer
    assert mine["vocab_size"] == theirs["vocab_size"] and mine["sha256"] != theirs["sha256"]
    assert theirs["sha256"] == runs.rebuilt.sha256
    model = {"preset": "crammed-bert-tiny", **MODEL, "classifier_hidden": 32}
    config = tmp_path / "ft.toml"
    config.write_text(tomli_w.dumps({"model": model, "task": _glue(other), **RUN,
                                     "train": {**RUN["train"], "init_from": str(runs.mlm)}}))
    out = tmp_path / "ft"
    assert main(["train", str(config), "--out", str(out)]) == 2
    _one_line(capsys, "is not the same vocabulary", str(runs.mlm), mine["sha256"][:12], theirs["sha256"][:12])
    assert not out.exists()
    # pretraining again from the masked LM on the edited text learns another BPE: refused as well
    config.write_text(tomli_w.dumps({"model": runs.mlm_model, "task": {"kind": "mlm", **runs.data}, **RUN,
                                     "train": {**RUN["train"], "init_from": str(runs.mlm)}}))
    assert main(["train", str(config), "--out", str(out)]) == 2
    _one_line(capsys, "is not the same vocabulary", "learnt on this run's text")
    assert not out.exists()


def test_resuming_on_the_edited_text_is_refused_and_changes_nothing(runs, tmp_path, capsys):
    run = Path(shutil.copytree(runs.lm, tmp_path / "lm"))
    before = _digest(run)
    assert main(["train", "--resume", "--out", str(run), "--set", "train.steps=4"]) == 2
    _one_line(capsys, "trained with tokenizer bpe:300", "--overwrite")
    assert _digest(run) == before


# ------------------------------------------------------------------ (e) a damaged saved tokenizer


def _damaged(tmp_path: Path, run: Path, how: str) -> Path:
    copy = Path(shutil.copytree(run, tmp_path / f"{run.name}-{how}"))
    path = copy / "tokenizer.json"
    if how == "missing":
        path.unlink()
    elif how == "a folder":
        path.unlink()
        path.mkdir()
    elif how == "truncated":
        path.write_text(path.read_text()[:500])
    else:  # valid JSON, another vocabulary: two ids swapped
        state = json.loads(path.read_text())
        vocab = state["model"]["vocab"]
        (a, i), (b, j) = list(vocab.items())[260:262]
        vocab[a], vocab[b] = j, i
        path.write_text(json.dumps(state))
    return copy


@pytest.mark.parametrize("how, words", [("missing", ("is missing", "never rebuilt")),
                                        ("a folder", ("is not a file", "never rebuilt")),
                                        ("truncated", ("is damaged", "not a tokenizer file")),
                                        ("swapped", ("is damaged", "sha256"))])
def test_a_damaged_saved_tokenizer_is_named_in_one_line_exit_1(runs, tmp_path, capsys, how, words):
    mlm, lm = _damaged(tmp_path, runs.mlm, how), _damaged(tmp_path, runs.lm, how)
    for args in (["export", str(mlm), "--hf", str(tmp_path / "export")], ["generate", str(mlm)],
                 ["export", str(lm), "--hf", str(tmp_path / "export")], ["generate", str(lm)]):
        assert main(args) == 1, args
        _one_line(capsys, str(Path(args[1]) / "tokenizer.json"), *words)
        assert not (tmp_path / "export").exists()
    # a fine-tuning reading it as its tokenizer_from: nothing written
    config = tmp_path / "ft.toml"
    config.write_text(tomli_w.dumps({"model": {"preset": "crammed-bert-tiny", **MODEL, "classifier_hidden": 32},
                                     "task": _glue(mlm), **RUN, "train": {**RUN["train"], "init_from": str(mlm)}}))
    assert main(["train", str(config), "--out", str(tmp_path / "ft")]) == 1
    _one_line(capsys, str(mlm / "tokenizer.json"))
    assert not (tmp_path / "ft").exists()


def test_a_run_an_older_headwise_made_rebuilds_with_one_warning(runs, tmp_path, capsys):
    old = Path(shutil.copytree(runs.mlm, tmp_path / "old"))
    (old / "tokenizer.json").unlink()
    summary = json.loads((old / "summary.json").read_text())
    del summary["tokenizer"]
    (old / "summary.json").write_text(json.dumps(summary))
    tokenizer = run_tokenizer(old, run_config(old))
    assert tokenizer.sha256 == runs.rebuilt.sha256  # the only thing left to go by: the (edited) corpus
    _one_line(capsys, "warning:", "no saved tokenizer", "training its bpe:300 again")
    # an older causal LM saved its BPE without recording it: the file is used, never rebuilt
    lm = Path(shutil.copytree(runs.lm, tmp_path / "old-lm"))
    summary = json.loads((lm / "summary.json").read_text())
    del summary["tokenizer"]
    (lm / "summary.json").write_text(json.dumps(summary))
    assert run_tokenizer(lm, run_config(lm)).sha256 == runs.trained.sha256
    assert capsys.readouterr().err == ""


def test_gpt_neo_is_recorded_by_name_and_hash_and_checked(runs, tmp_path):
    """GPT-Neo's files are not copied into a run: its summary records the hash of the two pinned
    file hashes, and a record of another gpt-neo is refused."""
    run = Path(shutil.copytree(runs.lm, tmp_path / "neo"))
    (run / "tokenizer.json").unlink()
    summary = json.loads((run / "summary.json").read_text())
    pinned = "".join(f"{name}:{digest};" for name, digest in sorted(GPT_NEO_FILES.items()))
    summary["tokenizer"] = {"spec": "gpt-neo", "vocab_size": 50257, "eot_id": 50256,
                            "sha256": hashlib.sha256(pinned.encode()).hexdigest()}
    (run / "summary.json").write_text(json.dumps(summary))

    def never():
        raise AssertionError("a recorded tokenizer is never rebuilt")

    assert read_run_tokenizer(run, "gpt-neo", never, "") is gpt_neo_tokenizer()
    summary["tokenizer"]["sha256"] = "0" * 64
    (run / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(RunFailure, match="gpt-neo tokenizer of sha256 000000000000"):
        read_run_tokenizer(run, "gpt-neo", never, "")
