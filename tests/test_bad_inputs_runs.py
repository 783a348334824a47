"""Bad inputs ``headwise train`` used to find only once the run's folder was written (issue 32):
a fine-tuning batch larger than its training split, an ``init_from`` source whose weights are cut,
altered or missing (its final model or the checkpoint named), whose ``spec.json`` is garbled or
whose saved ``tokenizer.json`` is cut, and an experiment tracker that cannot start. The folder
they left (its ``config.toml``) made the corrected command "a different run" and left nothing to
``--resume``.

Each case runs in-process (:func:`bad_input_harness.run_case`): one line on stderr naming what is
wrong, exit status 2 (1 for a damaged file or a tracker that cannot start), no traceback, nothing
on disk changed and, whatever the status, no new file: the run folder (and any parent folder the
command would have made) is absent afterwards, or as empty as it was. Its corrected command (the
same with the mistake taken out) trains first into a folder of its own, so the refusal is the
mistake's alone, and then into the refused command's ``--out``, which it must accept. Beside
them: a resume that fails to start leaves its run resumable, and a run refused while training
is taken back only while it has no checkpoint (a diverged run keeps its folder).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import tomli_w

from bad_input_harness import Case, c, run_case, snapshot
from conftest import REPO, shared_data_dir
from headwise.cli import main
from headwise.run import RunStatus, read_summary
from helpers import one_thread  # noqa: F401  (one torch thread)

MODEL = {"preset": "crammed-bert-tiny", "n_layers": 1, "heads": [2], "max_seq_len": 32}
MLM = {"model": MODEL,
       "task": {"kind": "mlm", "source": "tinystories-train-sample.txt", "validation": "tinystories-valid-sample.txt",
                "tokenizer": "bpe:300", "block_size": 32, "eval_batches": 1, "eval_batch_size": 4},
       "train": {"steps": 1, "micro_batch": 4}, "eval": {"every": 0}}
GLUE = {"model": {**MODEL, "classifier_hidden": 32},
        "task": {"kind": "glue", "task": "standin", "tokenizer_from": "mlm", "max_length": 32, "eval_batch_size": 64},
        "train": {"steps": 1, "micro_batch": 4, "init_from": "mlm"}, "eval": {"every": 0}}
#: the stand-in's training split (examples): a micro-batch above it cannot make one batch
TOO_BIG = "train.micro_batch=100000"
MLFLOW_DOWN = ("log.trackers=[\"mlflow\"]", "log.mlflow_uri=http://127.0.0.1:9")


def source(name: str, *, checkpoint: str | None = None) -> tuple[str, ...]:
    """``--set``s fine-tuning from the pretraining run ``name`` (weights and vocabulary)."""
    sets = ("--set", f"train.init_from={name}", "--set", f"task.tokenizer_from={name}")
    return sets + (("--set", f"train.init_checkpoint={checkpoint}") if checkpoint else ())


def fine_tune(out: str, *extra: str) -> list[str]:
    return ["train", "glue.toml", "--out", out, *extra]


def sets(*pairs: str) -> tuple[str, ...]:
    return tuple(a for p in pairs for a in ("--set", p))


#: (refused case, its corrected command): the corrected command differs by the mistake alone
CASES: list[tuple[Case, list[str]]] = [
    # the fine-tuning split is smaller than one batch
    (c("glue-batch-above-split", *fine_tune("ft", "--set", TOO_BIG), says=("fewer than one batch of 100000",
                                                                            "lower train.micro_batch")),
     fine_tune("ft")),
    (c("glue-batch-above-split-new-parents", *fine_tune("new/deeper/ft", "--set", TOO_BIG),
       says="fewer than one batch"),
     fine_tune("new/deeper/ft")),
    (c("glue-batch-above-split-empty-out", *fine_tune("empty", "--set", TOO_BIG), says="fewer than one batch"),
     fine_tune("empty")),
    (c("glue-batch-above-split-overwrite", *fine_tune("ft-old", "--set", TOO_BIG, "--overwrite"),
       says="fewer than one batch"),
     fine_tune("ft-old", "--overwrite")),
    # an init_from source whose model files are damaged
    (c("init-from-cut-weights", *fine_tune("ft", *source("mlm-cut")), code=1,
       says=("mlm-cut/model/model.safetensors is damaged", "manifest.json says", "cannot be fine-tuned from",
             "restore the file")),
     fine_tune("ft")),
    (c("init-from-cut-weights-no-manifest", *fine_tune("ft", *source("mlm-cut-bare")), code=1,
       says=("model.safetensors is damaged", "truncated")),
     fine_tune("ft")),
    (c("init-from-altered-weights", *fine_tune("ft", *source("mlm-flipped")), code=1,
       says=("model.safetensors is damaged", "sha256")),
     fine_tune("ft")),
    (c("init-from-missing-weights", *fine_tune("ft", *source("mlm-noweights")), code=1,
       says=("mlm-noweights/model/model.safetensors is missing", "train.init_checkpoint")),
     fine_tune("ft")),
    (c("init-from-garbled-spec", *fine_tune("ft", *source("mlm-spec")), code=1,
       says=("mlm-spec/model/spec.json is damaged", "not JSON")),
     fine_tune("ft")),
    (c("init-from-damaged-checkpoint", *fine_tune("ft", *source("mlm-ckpt-cut", checkpoint="step_00000001")), code=1,
       says=("checkpoints/step_00000001/model.safetensors is damaged", "another of its checkpoints")),
     fine_tune("ft", *source("mlm", checkpoint="step_00000001"))),
    # a source whose saved tokenizer is cut: never rebuilt from its corpus
    (c("tokenizer-from-cut-tokenizer", *fine_tune("ft", *source("mlm-cut-tok")), code=1,
       says=("mlm-cut-tok/tokenizer.json is damaged", "not a tokenizer file")),
     fine_tune("ft")),
    (c("init-from-cut-tokenizer", *fine_tune("ft", *sets("train.init_from=mlm-cut-tok")), code=1,
       says="mlm-cut-tok/tokenizer.json is damaged"),
     fine_tune("ft")),
    (c("pretrain-from-cut-tokenizer", "train", "mlm.toml", "--out", "pre", *sets("train.init_from=mlm-cut-tok"),
       code=1, says="mlm-cut-tok/tokenizer.json is damaged"),
     ["train", "mlm.toml", "--out", "pre", *sets("train.init_from=mlm")]),
    # a tracker that cannot start once the run folder is there (its server is not listening)
    (c("tracker-cannot-start", "train", "nn.toml", "--out", "nn", *sets("train.steps=1", *MLFLOW_DOWN), code=1,
       says=("MLflow could not start a run", "127.0.0.1:9")),
     ["train", "nn.toml", "--out", "nn", *sets("train.steps=1")]),
]


def damage(root: Path) -> None:
    """Copies of the pretraining run ``mlm``, each with one file damaged."""
    def copy(name: str) -> Path:
        return Path(shutil.copytree(root / "mlm", root / name))

    weights = "model/model.safetensors"
    size = (root / "mlm" / weights).stat().st_size
    with open(copy("mlm-cut") / weights, "r+b") as f:
        f.truncate(size // 2)
    bare = copy("mlm-cut-bare")
    (bare / "model" / "manifest.json").unlink()
    with open(bare / weights, "r+b") as f:
        f.truncate(size - 100)
    data = bytearray((root / "mlm" / weights).read_bytes())
    data[-5] ^= 0xFF  # a weight's byte: the header still parses, the sha256 differs
    (copy("mlm-flipped") / weights).write_bytes(bytes(data))
    (copy("mlm-noweights") / weights).unlink()
    (copy("mlm-spec") / "model" / "spec.json").write_text('{"d_model": 12')
    checkpoint = copy("mlm-ckpt-cut") / "checkpoints" / "step_00000001" / "model.safetensors"
    checkpoint.write_bytes(checkpoint.read_bytes()[:1000])
    tokenizer = copy("mlm-cut-tok") / "tokenizer.json"
    tokenizer.write_text(tokenizer.read_text()[:500])


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """The configs, a 1-step masked-LM pretraining run ``mlm``, its damaged copies, a fine-tuning
    run ``ft-old`` for --overwrite, and an empty folder ``empty``; the token cache lies outside."""
    root = tmp_path_factory.mktemp("bad-inputs-runs")
    mp = pytest.MonkeyPatch()
    mp.setenv("HEADWISE_DATA", str(shared_data_dir()))
    mp.setenv("HEADWISE_CACHE", str(tmp_path_factory.mktemp("cache")))
    mp.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # refused at once, not after minutes of retries
    mp.chdir(root)
    (root / "mlm.toml").write_text(tomli_w.dumps(MLM))
    (root / "glue.toml").write_text(tomli_w.dumps(GLUE))
    shutil.copy(REPO / "configs" / "nearest-tiny.toml", root / "nn.toml")
    assert main(["train", "mlm.toml", "--out", "mlm"]) == 0
    damage(root)
    assert main(fine_tune("ft-old")) == 0
    (root / "empty").mkdir()
    yield root
    mp.undo()


def out_of(argv: list[str]) -> str:
    return argv[argv.index("--out") + 1]


@pytest.mark.parametrize("case, fixed", [pytest.param(k, f, id=k.id, marks=k.marks) for k, f in CASES])
def test_a_refused_run_leaves_no_folder_and_the_fix_trains_there(case: Case, fixed: list[str], world: Path,
                                                                 monkeypatch, capsys) -> None:
    if "mlflow" in " ".join(case.argv):
        pytest.importorskip("mlflow", reason="mlflow (the mlflow extra) is not installed")
    out = out_of(case.argv)
    kept = {p: (world / p).read_bytes() for p in ("ft-old/config.toml", "ft-old/summary.json")}
    # the corrected command trains: what is refused below is the mistake alone
    good = "good-" + case.id
    monkeypatch.chdir(world)
    assert main([*fixed[:fixed.index("--out") + 1], good, *fixed[fixed.index("--out") + 2:]]) == 0
    shutil.rmtree(world / good)
    capsys.readouterr()
    before = snapshot(world)
    run_case(case, world, monkeypatch, capsys)
    assert snapshot(world) == before, "a refusal wrote files"  # whatever its exit status
    assert not (world / "new").exists()
    if out == "empty":
        assert not any((world / "empty").iterdir())
    elif out != "ft-old":
        assert not (world / out).exists()
    assert {p: (world / p).read_bytes() for p in kept} == kept
    # the corrected command is not refused as "a different run", and trains there
    try:
        assert main(fixed) == 0, capsys.readouterr().err
        assert read_summary(world / out).status is RunStatus.COMPLETED
    finally:
        target = world / ("new" if out.startswith("new/") else out)
        shutil.rmtree(target, ignore_errors=True)
        if out == "empty":
            target.mkdir()
        elif out == "ft-old":
            assert main(fine_tune("ft-old", "--overwrite")) == 0  # as it was, for the next case


def test_a_resume_that_fails_to_start_takes_nothing_away(world: Path, monkeypatch, capsys) -> None:
    """A resumed run's folder was there before the command: a failure once it is open removes
    none of it and puts its config back (not the tracker the failed resume asked for), so the
    run resumes as it was."""
    pytest.importorskip("mlflow", reason="mlflow (the mlflow extra) is not installed")
    run = Path(shutil.copytree(world / "ft-old", world / "ft-resume"))
    monkeypatch.chdir(world)
    try:
        config = (run / "config.toml").read_text()
        assert main(["train", "--resume", "--out", "ft-resume", *sets("train.steps=2", *MLFLOW_DOWN)]) == 1
        assert "MLflow could not start a run" in capsys.readouterr().err
        assert (run / "config.toml").read_text() == config
        assert (run / "config.toml").is_file() and (run / "checkpoints" / "step_00000001").is_dir()
        assert main(["train", "--resume", "--out", "ft-resume", "--set", "train.steps=2"]) == 0
        assert read_summary(run).steps == 2
    finally:
        shutil.rmtree(run, ignore_errors=True)


def test_a_failure_after_training_began_keeps_the_run(world: Path, monkeypatch, capsys) -> None:
    """Only refusals are taken back: a run whose loss became non-finite keeps its folder, whose
    summary says so."""
    monkeypatch.chdir(world)
    try:
        assert main(["train", "nn.toml", "--out", "nan", *sets("optim.lr=1e30", "train.grad_clip=0",
                                                               "train.steps=3", "checkpoint.every=0")]) == 1
        assert read_summary(world / "nan").status is RunStatus.DIVERGED
    finally:
        shutil.rmtree(world / "nan", ignore_errors=True)
    assert "non-finite" in capsys.readouterr().err


@pytest.mark.parametrize("at, kept", [(2, False), (4, True)])
def test_bad_input_found_while_training_takes_the_run_back_unless_it_checkpointed(at, kept, tmp_path):
    """Bad input the first batches show (a HeadwiseError from the data) takes back a new run that
    has no checkpoint yet; one after a checkpoint keeps the run, to be resumed once fixed."""
    from test_train_synthetic import SyntheticLM, tiny_config

    from headwise.errors import HeadwiseError
    from headwise.train import run_training

    def bad(position: int) -> None:
        if position == at:
            raise HeadwiseError("a batch the data cannot give")

    out = tmp_path / "made" / "run"
    with pytest.raises(HeadwiseError, match="cannot give"):
        run_training(tiny_config(steps=6, ckpt_every=3), out, task=SyntheticLM(on_batch=bad))
    assert out.exists() is kept and (tmp_path / "made").exists() is kept
    if kept:
        assert read_summary(out).status is RunStatus.FAILED and (out / "checkpoints" / "step_00000003").is_dir()


def test_case_ids_are_distinct() -> None:
    ids = [k.id for k, _ in CASES]
    assert len(ids) == len(set(ids)) >= 14
    assert all(out_of(k.argv) == out_of(fixed) for k, fixed in CASES)
