"""A sweep of bad inputs on what comes after training: ``headwise export``, ``eval``, ``generate``,
``analyze``, ``report`` and ``convert`` (each also given a folder or file of another kind than it
reads), and the experiment trackers a run names (``headwise train --set
log.trackers=...``), as a new user would drive them.

Each case checks what every sweep checks (:mod:`bad_input_harness`): the exit status (2 for bad
input), one line on stderr naming what is wrong, no traceback, nothing on disk changed or lost,
and for bad input no new file; here also no new folder (an export refused after it made the
folders above its output leaves them behind, which a snapshot of files does not see). A few
cases set environment variables (``WANDB_MODE``, ``MLFLOW_TRACKING_URI``) or hide a package, as
when it is not installed.

The module-scoped ``world`` holds one tiny language run (a 32-token context, so the local
evaluation tasks' longer endings do not fit it), a nearest-neighbour run, a ViT run, copies of
the language run with a part missing or damaged, model folders of other data (another
vocabulary, another vector width) or other heads to pass as ``--checkpoint`` (and a copy of the
language run holding the latter as a checkpoint), the ViT run's export, bad text files for
``eval --text``, a study directory whose ``report`` is a file, a sound one and a search folder.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from bad_input_harness import Case, c, run_case, snapshot
from conftest import REPO, shared_data_dir
from headwise.cli import main
from helpers import one_thread  # noqa: F401  (one torch thread for this module)

pytest.importorskip("transformers", reason="transformers (the hf extra) is not installed")

# A language model small enough to train two steps in a moment: a BPE of 300 tokens, heads
# [2, 1] (nothing GPT-Neo expresses) and a 32-token context.
LM = """\
[model]
preset = "tiny-lm"
d_model = 32
n_layers = 2
heads = [2, 1]
max_seq_len = 32
[task]
kind = "lm"
source = "tinystories-train-sample.txt"
validation = "tinystories-valid-sample.txt"
tokenizer = "bpe:300"
block_size = 32
subset = 200
[train]
steps = 2
micro_batch = 4
[eval]
every = 0
[checkpoint]
every = 1
"""
VIT = ('[model]\npreset = "vit-tiny-28"\nd_model = 16\nn_layers = 1\nheads = [2]\n'
       '[task]\nkind = "images"\nsource = "imgs"\n[train]\nsteps = 1\nmicro_batch = 4\n[eval]\nevery = 0\n')
# A study directory as `headwise study` leaves it (only study.toml matters to the report's checks)
STUDY = 'name = "mini"\nseeds = 1\nfingerprint = "0"\nvariants = []\n[definition.base.task]\nkind = "nearest"\n'
# A search folder as `headwise search` leaves it (its saved definition and trials)
SEARCH = 'name = "mini"\nfingerprint = "0"\n[base.task]\nkind = "lm"\n'

FILES = {
    "notes.txt": "not a folder\n",
    "empty.txt": "",
    "bad.jsonl": '{"text": "Once upon a time."}\n{bad\n',
    "fields.jsonl": '{"body": "Once upon a time."}\n',
    "fake.parquet": "PAR1 but not parquet\n",
    "few.txt": "One. Two. Three.\n",
    "study/study.toml": STUDY,
    "study/report": "a file where the report folder goes\n",
    "study-ok/study.toml": STUDY,
    "search/search.toml": SEARCH,
    "search/trials.json": '{"search": "mini", "trials": []}\n',
}


def _train(root: Path, *argv: str) -> None:
    assert main(["train", *argv]) == 0, argv


def _other_models(root: Path) -> None:
    """Saved model folders of other data than the runs': a language model of another vocabulary
    and a vector model of another width; and of the language run's data with other heads, as a
    folder of its own and copied into a copy of the run as a checkpoint (``lm-foreign``)."""
    import torch

    from headwise.model import Transformer, save_pretrained
    from headwise.model.pretrained import read_spec
    from headwise.spec import ModelSpec

    torch.manual_seed(0)
    save_pretrained(Transformer(ModelSpec(vocab_size=400, d_model=32, n_layers=1, heads=[2], max_seq_len=32)),
                    root / "other-vocab")
    save_pretrained(Transformer(ModelSpec(inputs="vectors", d_model=8, n_layers=1, heads=[1], max_seq_len=8,
                                          causal=False)), root / "other-width")
    other_heads = Transformer(ModelSpec(**{**read_spec(root / "lm" / "model" / "spec.json").model_dump(),
                                           "heads": [2, 2]}))
    save_pretrained(other_heads, root / "other-heads")
    shutil.copytree(root / "lm", root / "lm-foreign")
    save_pretrained(other_heads, root / "lm-foreign" / "checkpoints" / "step_00000009")


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    from test_image_data import write_idx_folder

    from headwise.hf.export import export_hf

    root = tmp_path_factory.mktemp("bad-inputs-export")
    for name, text in FILES.items():
        (root / name).parent.mkdir(exist_ok=True)
        (root / name).write_text(text)
    (root / "empty").mkdir()
    (root / "lm.toml").write_text(LM)
    (root / "vit.toml").write_text(VIT)
    shutil.copy(REPO / "configs" / "nearest-tiny.toml", root / "nn.toml")
    write_idx_folder(root / "imgs", gz=False, n_train=8, n_test=4, size=(8, 8), classes=4)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("HEADWISE_DATA", str(shared_data_dir()))
        mp.setenv("HEADWISE_CACHE", str(root / "cache"))
        _train(root, "lm.toml", "--out", "lm")
        _train(root, "nn.toml", "--out", "nn", "--set", "train.steps=2", "--set", "checkpoint.every=1",
               "--set", "eval.every=0")
        _train(root, "vit.toml", "--out", "vit")
    for name, damage in (("lm-noweights", lambda d: [shutil.rmtree(d / "model"), shutil.rmtree(d / "checkpoints")]),
                         ("lm-notokenizer", lambda d: (d / "tokenizer.json").unlink()),
                         ("lm-noconfig", lambda d: (d / "config.toml").unlink()),
                         ("lm-damaged", lambda d: [w.write_bytes(w.read_bytes()[:100])
                                                   for w in d.rglob("model.safetensors")])):
        shutil.copytree(root / "lm", root / name)
        damage(root / name)
    _other_models(root)
    export_hf(root / "vit", root / "vit-export")
    return root


def train(name: str, *sets: str, says: tuple[str, ...] | str = ()) -> Case:
    """``headwise train nn.toml --out new-run`` for one step with trackers set by ``sets``."""
    argv = ["train", "nn.toml", "--out", "new-run", "--set", "train.steps=1", "--set", "eval.every=0"]
    return c(name, *argv, *[a for s in sets for a in ("--set", s)], says=says)


#: every command given a folder (or a file) of another kind than it reads
FOLDER_CASES = [
    *[c(f"{cmd}-a-{kind}", cmd, path, *extra, says=said)
      for cmd, extra in (("export", ("--hf", "exports/x")), ("eval", ()), ("generate", ()))
      for kind, path, said in (("study", "study-ok", "not a headwise run"), ("search", "search", "not a headwise run"),
                               ("file", "notes.txt", "not a headwise run"))],
    c("generate-an-empty-folder", "generate", "empty", says="not a headwise run"),
    c("eval-an-export", "eval", "vit-export", says=("vit-export", "not a headwise run")),
    c("analyze-a-search", "analyze", "search", says=("search", "holds no run directories")),
    c("analyze-a-file", "analyze", "notes.txt", says=("notes.txt", "not a directory")),
    c("analyze-an-empty-folder", "analyze", "empty", says=("empty", "holds no run directories")),
    c("report-a-search", "report", "search", says="not a study directory"),
    c("report-an-image-run", "report", "vit", says="not a study directory"),
    c("report-an-empty-folder", "report", "empty", says="not a study directory"),
    c("report-a-file", "report", "notes.txt", says="not a study directory"),
    *[c(f"convert-a-{kind}", "convert", path, "--out", "runs/back", says=said)
      for kind, path, said in (("headwise-run", "lm", "not a transformers model folder"),
                               ("image-run", "vit", "not a transformers model folder"),
                               ("study", "study-ok", "not a transformers model folder"),
                               ("search", "search", "not a transformers model folder"),
                               ("empty-folder", "empty", "not a transformers model folder"),
                               ("file", "notes.txt", "is a file"))],
    c("convert-an-export-of-an-image-run", "convert", "vit-export", "--out", "runs/back",
      says=("HeadwiseForImageClassification", "LlamaForCausalLM")),
]

CASES = [
    # export: where it writes
    c("export-out-under-a-file", "export", "lm", "--hf", "notes.txt/model", says=("notes.txt", "is a file")),
    c("export-out-is-a-file", "export", "lm", "--hf", "notes.txt", says=("notes.txt", "is a file")),
    c("export-out-is-the-run", "export", "lm", "--hf", "lm", says=("lm", "not empty")),
    c("export-out-is-the-model-folder", "export", "lm", "--hf", "lm/model", says="not empty"),
    c("export-out-is-the-current-folder", "export", "lm", "--hf", ".", says=(".", "not empty")),
    # export: what it cannot write is refused before any folder is made
    c("export-gpt-neo-heterogeneous", "export", "lm", "--hf", "exports/neo/lm", "--gpt-neo",
      says=("different head counts", "without --gpt-neo")),
    c("export-gpt-neo-vit", "export", "vit", "--hf", "exports/neo/vit", "--gpt-neo",
      says=("reads images, not tokens", "without --gpt-neo")),
    c("export-vector-model", "export", "nn", "--hf", "exports/nn", says="no transformers class"),
    # export: the run
    c("export-not-a-run", "export", "empty", "--hf", "exports/x", says="not a headwise run"),
    c("export-no-config", "export", "lm-noconfig", "--hf", "exports/x", says="no config.toml"),
    c("export-no-weights", "export", "lm-noweights", "--hf", "exports/x", says=("no final weights", "--overwrite")),
    c("export-damaged-weights", "export", "lm-damaged", "--hf", "exports/x", says=("damaged", "--checkpoint")),
    # a saved tokenizer the summary records, gone: a damaged run (exit 1), never trained again
    c("export-no-tokenizer", "export", "lm-notokenizer", "--hf", "exports/x", code=1,
      says=("tokenizer.json is missing", "never rebuilt")),
    c("export-checkpoint-missing", "export", "lm", "--hf", "exports/x", "--checkpoint", "missing",
      says="not a saved headwise model"),
    # export: a checkpoint must be the run's own (the card describes the run's config, losses, command)
    c("export-checkpoint-other-vocabulary", "export", "lm", "--hf", "exports/x", "--checkpoint", "other-vocab",
      says=("vocab_size 400", "300")),
    c("export-checkpoint-other-heads", "export", "lm", "--hf", "exports/x", "--checkpoint", "other-heads",
      says=("--checkpoint other-heads", "not a checkpoint of lm", "lm/checkpoints")),
    c("export-checkpoint-of-another-run", "export", "lm", "--hf", "exports/x", "--checkpoint",
      "lm-notokenizer/checkpoints/step_00000002", says=("lm-notokenizer/checkpoints/step_00000002",
                                                         "not a checkpoint of lm")),
    c("export-checkpoint-copied-into-the-run", "export", "lm-foreign", "--hf", "exports/x", "--checkpoint",
      "lm-foreign/checkpoints/step_00000009", says=("step_00000009", "heads: [2, 2] vs [2, 1]")),
    # generate
    c("generate-empty-prompt", "generate", "lm", "--prompt", "", says="prompt is empty"),
    c("generate-max-new-tokens-negative", "generate", "lm", "--max-new-tokens", "-3", says="--max-new-tokens"),
    c("generate-temperature-nan", "generate", "lm", "--temperature", "nan", says="--temperature"),
    c("generate-top-k-0", "generate", "lm", "--top-k", "0", says="--top-k"),
    c("generate-top-p-nan", "generate", "lm", "--top-p", "nan", says="--top-p"),
    c("generate-image-run-prompt", "generate", "vit", "--prompt", "hi", says=("'images' run", "--prompt")),
    c("generate-no-weights", "generate", "lm-noweights", says=("no final weights", "--untrained")),
    c("generate-no-tokenizer", "generate", "lm-notokenizer", code=1, says=("tokenizer.json is missing", "never rebuilt")),
    c("generate-checkpoint-other-vocabulary", "generate", "lm", "--checkpoint", "other-vocab",
      "--max-new-tokens", "3", says=("vocab_size 400", "300")),
    c("generate-checkpoint-other-width", "generate", "nn", "--checkpoint", "other-width", says=("d_model 8", "16")),
    c("generate-checkpoint-language-model-on-vectors", "generate", "nn", "--checkpoint", "lm/model",
      says=("inputs 'tokens'", "'vectors'")),
    # eval: the arguments
    c("eval-limit-0", "eval", "lm", "--limit", "0", says="--limit 0"),
    c("eval-limit-negative", "eval", "lm", "--limit", "-2", says="--limit -2"),
    c("eval-examples-0", "eval", "lm", "--examples", "0", says="--examples 0"),
    c("eval-no-tasks", "eval", "lm", "--tasks", " , ", says="--tasks is empty"),
    c("eval-not-a-run", "eval", "empty", says="not a headwise run"),
    c("eval-vector-run", "eval", "nn", says="language models only"),
    c("eval-image-run", "eval", "vit", says="language models only"),
    c("eval-text-without-local-tasks", "eval", "lm", "--tasks", "hellaswag", "--text", "few.txt",
      says=("--text", "story_endings")),
    # eval: what is checked before the local tasks are written into the run
    c("eval-unknown-task-beside-a-local-one", "eval", "lm", "--tasks", "story_endings,no_such_task",
      says="unknown task 'no_such_task'", marks=(pytest.mark.slow,)),
    c("eval-checkpoint-missing", "eval", "lm", "--tasks", "story_continuation", "--checkpoint", "missing",
      says="not a saved headwise model"),
    c("eval-device-unknown", "eval", "lm", "--tasks", "story_continuation", "--device", "abacus",
      says="--device abacus"),
    c("eval-out-under-a-file", "eval", "lm", "--tasks", "story_continuation", "--limit", "1",
      "--out", "notes.txt/scores.json", says=("notes.txt", "is a file")),
    c("eval-out-exists", "eval", "lm", "--out", "notes.txt", says="exists"),
    # eval: local task text
    c("eval-text-missing", "eval", "lm", "--text", "nope.txt", says="no such file"),
    c("eval-text-empty", "eval", "lm", "--text", "empty.txt", says="empty"),
    c("eval-text-bad-jsonl-line", "eval", "lm", "--text", "bad.jsonl", says="line 2 is not valid JSON"),
    c("eval-text-jsonl-fields", "eval", "lm", "--text", "fields.jsonl", says=("'text'", "body")),
    c("eval-text-not-parquet", "eval", "lm", "--text", "fake.parquet", says="not a readable parquet file"),
    c("eval-text-too-short", "eval", "lm", "--text", "few.txt", says="too few"),
    # analyze, report
    c("analyze-out-under-a-file", "analyze", "nn", "--batches", "1", "--out", "notes.txt/analysis",
      says=("notes.txt", "is a file")),
    c("analyze-theory-out-under-a-file", "analyze", "--theory", "--seeds", "1", "--out", "notes.txt/theory",
      says=("notes.txt", "is a file")),
    c("analyze-no-checkpoints", "analyze", "lm-noweights", says="no checkpoints"),
    c("report-a-run", "report", "lm", says="not a study directory"),
    c("report-folder-is-a-file", "report", "study", says=("study/report", "is a file")),
    *FOLDER_CASES,
    # trackers
    train("tracker-unknown", 'log.trackers=["neptune"]', says=("unknown tracker 'neptune'", "mlflow")),
    train("tracker-wandb-mode", 'log.trackers=["wandb"]', "log.wandb_mode=sideways", says="wandb_mode"),
    train("tracker-mlflow-uri-scheme", 'log.trackers=["mlflow"]', "log.mlflow_uri=gopher://tracking",
          says=("log.mlflow_uri gopher://tracking", "http")),
    train("tracker-mlflow-uri-a-file", 'log.trackers=["mlflow"]', "log.mlflow_uri=notes.txt",
          says=("log.mlflow_uri notes.txt", "is a file")),
    train("tracker-mlflow-uri-under-a-file", 'log.trackers=["mlflow"]', "log.mlflow_uri=file:notes.txt/store",
          says=("notes.txt", "is a file")),
    train("tracker-mlflow-empty-project", 'log.trackers=["mlflow"]', 'log.project=""', says="log.project"),
]

#: cases run with environment variables set, or with a package hidden as when it is not installed
ENV_CASES = [
    (train("tracker-wandb-mode-env", 'log.trackers=["wandb"]', says=("WANDB_MODE", "offline")),
     {"WANDB_MODE": "sideways"}, ()),
    (train("tracker-mlflow-uri-env", 'log.trackers=["mlflow"]', says=("MLFLOW_TRACKING_URI", "gopher://x")),
     {"MLFLOW_TRACKING_URI": "gopher://x"}, ()),
    (train("tracker-not-installed", 'log.trackers=["wandb"]', says=("wandb", "pip install")), {}, ("wandb",)),
    (train("tracker-mlflow-not-installed", 'log.trackers=["mlflow"]', says=("mlflow", "pip install")), {},
     ("mlflow", "mlflow.tracking")),
]


def _folders(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_dir()}


def _remove_new(root: Path, files: dict[str, str], folders: set[str]) -> None:
    """Remove what a case added (files, then folders), so the next case starts from the same world."""
    for p in sorted(root.rglob("*"), reverse=True):
        rel = str(p.relative_to(root))
        if p.is_dir() and rel not in folders:
            shutil.rmtree(p, ignore_errors=True)
        elif p.is_file() and rel not in files:
            p.unlink()


@pytest.mark.parametrize("case, env, hidden", [pytest.param(k, {}, (), id=k.id, marks=k.marks) for k in CASES]
                         + [pytest.param(k, e, h, id=k.id, marks=k.marks) for k, e, h in ENV_CASES])
def test_bad_input(case: Case, env: dict[str, str], hidden: tuple[str, ...], world: Path, monkeypatch,
                   capsys) -> None:
    monkeypatch.setenv("HEADWISE_CACHE", str(world / "cache"))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for module in hidden:
        monkeypatch.setitem(sys.modules, module, None)  # `import module` now fails, as when not installed
    files, folders = snapshot(world), _folders(world)
    try:
        run_case(case, world, monkeypatch, capsys)
        if case.code == 2:
            assert _folders(world) == folders, f"new folders: {sorted(_folders(world) - folders)}"
    finally:
        _remove_new(world, files, folders)


def test_case_ids_are_distinct() -> None:
    ids = [k.id for k in CASES] + [k.id for k, _, _ in ENV_CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 25


def test_an_export_failing_midway_leaves_no_folder(world: Path, tmp_path: Path, monkeypatch) -> None:
    """A failure after the folders above OUT_DIR were made takes them away with the half-written export."""
    import headwise.hf.export as export

    def card(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(export, "model_card", card)
    with pytest.raises(RuntimeError, match="disk full"):
        export.export_hf(world / "lm", tmp_path / "a" / "b" / "model")
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_of_the_run_exports_even_where_its_folder_links_elsewhere(world: Path, tmp_path: Path) -> None:
    """The run's own checkpoint exports, also where ``checkpoints/`` is a link to another disk
    (the checkpoint resolves outside the run, but is inside it as written)."""
    from headwise.hf.export import export_hf

    run = tmp_path / "run"
    shutil.copytree(world / "lm", run)
    shutil.move(run / "checkpoints", tmp_path / "disk")
    (run / "checkpoints").symlink_to(tmp_path / "disk")
    checkpoint = run / "checkpoints" / "step_00000001"
    export_hf(run, tmp_path / "out", checkpoint=checkpoint)
    assert str(checkpoint) in (tmp_path / "out" / "README.md").read_text()


def _lm_eval_installed() -> bool:
    try:
        from headwise.hf.evaluation.harness import require_lm_eval

        require_lm_eval()
    except Exception:  # noqa: BLE001 - HeadwiseError naming the extra
        return False
    return True


NEEDS_LM_EVAL = pytest.mark.skipif(not _lm_eval_installed(), reason="lm-eval (the eval extra) is not installed")


@NEEDS_LM_EVAL
def test_eval_of_a_short_context_run_scores_the_endings_that_fit(world: Path, tmp_path: Path, capsys) -> None:
    """lm-eval cannot score an ending longer than the model's context (it asserted, a traceback):
    story_endings leaves those out, says so, and every ending it keeps fits the 32 tokens."""
    from headwise.hf.evaluation.local_tasks import STORY_ENDINGS, read_examples
    from headwise.train.generate import run_config, run_tokenizer

    run = tmp_path / "lm"
    shutil.copytree(world / "lm", run)
    assert main(["eval", str(run), "--tasks", STORY_ENDINGS, "--limit", "3", "--examples", "20"]) == 0
    out = capsys.readouterr().out
    assert "note: story_endings leaves out" in out and "longer than the model's context (32 tokens)" in out
    report = json.loads((run / "eval" / "lm-eval.json").read_text())
    assert report["n_samples"][STORY_ENDINGS]["effective"] == 3
    assert report["config"]["local_max_ending_tokens"] == 32
    # headwise's own tokenizer, not the transformers one the check used: lm-eval scores " " + ending
    tokenizer = run_tokenizer(run, run_config(run))
    examples = read_examples(run / "eval" / "tasks", STORY_ENDINGS)
    assert len(examples) == 20
    assert max(len(tokenizer.encode(" " + c)) for e in examples for c in e["choices"]) <= 32


@NEEDS_LM_EVAL
def test_an_answer_longer_than_the_context_is_one_line_exit_1(world: Path, tmp_path: Path) -> None:
    """An lm-eval task (not one headwise builds) whose answer does not fit the model: RunFailure, one line."""
    from headwise.errors import RunFailure
    from headwise.hf.evaluation.harness import run_harness
    from headwise.hf.models import from_run
    from headwise.hf.tokenizer import run_hf_tokenizer

    long = " ".join(["and then the little dog ran home"] * 10)  # far more than 32 tokens
    (tmp_path / "long.jsonl").write_text(json.dumps({"context": "Once.", "choices": [long, "No."], "label": 0}) + "\n")
    (tmp_path / "long_task.yaml").write_text(
        f"task: long_task\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {tmp_path / 'long.jsonl'}\n"
        f"  cache_dir: {tmp_path / 'cache'}\ntest_split: test\noutput_type: multiple_choice\n"
        "doc_to_text: context\ndoc_to_choice: choices\ndoc_to_target: label\n")
    with pytest.raises(RunFailure, match="longer than the model's context of 32 tokens") as info:
        run_harness(from_run(world / "lm")[0], run_hf_tokenizer(world / "lm"), ["long_task"], tmp_path,
                    tmp_path / "out.json")
    assert "\n" not in str(info.value) and not (tmp_path / "out.json").exists()
