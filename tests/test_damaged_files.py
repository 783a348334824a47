"""Damaged files in a run directory: each is named in one line (no traceback), a refused command
changes nothing on disk, and ``--resume`` falls back to the newest checkpoint that verifies,
with the same per-step losses as an uninterrupted run (a real SIGKILL test)."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from headwise.cli import main
from headwise.model.pretrained import DamagedFile, load_pretrained
from headwise.run import read_metrics, read_summary
from headwise.train import RunConfig, run_training
from headwise.train.checkpoint import checkpoint_dirs, latest_checkpoint, load_checkpoint
from test_resume_kill import RUN, _curve, _start, _wait, uninterrupted  # noqa: F401 (a fixture)
from test_train_synthetic import SyntheticLM, tiny_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
# nearest-tiny, short: checkpoints at steps 4 and 6 (keep 2), a final model
OVERRIDES = ["train.steps=6", "checkpoint.every=2", "checkpoint.keep=2", "eval.every=3", "train.log_every=1"]
CKPTS = ("step_00000004", "step_00000006")


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("trained") / "run"
    run_training(RunConfig.load(CONFIGS / "nearest-tiny.toml", OVERRIDES), out)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["latest", *CKPTS]
    return out


@pytest.fixture
def run(trained, tmp_path) -> Path:
    """A fresh copy of the trained run, to damage."""
    return Path(shutil.copytree(trained, tmp_path / "run"))


def damage(path: Path, how: str) -> None:
    if how == "truncate":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif how == "zero":
        path.write_bytes(bytes(path.stat().st_size))
    else:
        path.unlink()


def digest(directory: Path) -> str:
    """A checksum of every name and byte under ``directory``."""
    h = hashlib.sha256()
    for p in sorted(directory.rglob("*")):
        h.update(str(p.relative_to(directory)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def one_line(err: str) -> str:
    assert "Traceback" not in err and err.count("\n") == 1, err
    return err


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "headwise", *args], capture_output=True, text=True, timeout=120)


# ------------------------------------------------------------------------- --resume


@pytest.mark.parametrize("manifest", [True, False], ids=["manifest", "no-manifest"])
@pytest.mark.parametrize("how", ["truncate", "zero", "delete"])
@pytest.mark.parametrize("name", ["model.safetensors", "trainer.pt", "spec.json"])
def test_resume_with_every_checkpoint_damaged_stops_in_one_line_and_changes_nothing(run, capsys, name, how,
                                                                                    manifest):
    for ckpt in CKPTS:
        if not manifest:  # a checkpoint from before manifests: checked as far as it can be
            (run / "checkpoints" / ckpt / "manifest.json").unlink()
        damage(run / "checkpoints" / ckpt / name, how)
    before = digest(run)
    assert main(["train", "--resume", "--out", str(run), "--set", "train.steps=8"]) == 1
    err = one_line(capsys.readouterr().err)
    assert "no checkpoint of" in err and "nothing was changed" in err
    for ckpt in CKPTS:
        assert str(run / "checkpoints" / ckpt / name) in err
    assert digest(run) == before  # config.toml (train.steps) included


def test_resume_refusal_on_the_command_line(run):
    for ckpt in CKPTS:
        damage(run / "checkpoints" / ckpt / "model.safetensors", "truncate")
    before = digest(run)
    done = cli("train", "--resume", "--out", str(run), "--set", "train.steps=8")
    assert done.returncode == 1
    assert one_line(done.stderr).startswith("headwise: failed: no checkpoint of")
    assert "model.safetensors is damaged: it is" in done.stderr
    assert digest(run) == before


@pytest.mark.parametrize("name", ["model.safetensors", "trainer.pt", "spec.json", "manifest.json"])
def test_resume_skips_a_damaged_checkpoint_and_says_so(run, capsys, name):
    damage(run / "checkpoints" / CKPTS[1] / name, "truncate")
    assert main(["train", "--resume", "--out", str(run), "--set", "train.steps=8"]) == 0
    out = capsys.readouterr().out
    warnings = [line for line in out.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and f"skipped checkpoint {CKPTS[1]}" in warnings[0]
    assert f"{name} is damaged" in warnings[0] and "resuming from step_00000004" in warnings[0]
    assert "resuming at step 4" in out
    # the damaged checkpoint is kept aside; the new ones (6, 8) are intact and `latest` names the newest
    ckpts = run / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["damaged_step_00000006", "latest", "step_00000006",
                                                        "step_00000008"]
    assert latest_checkpoint(run).name == "step_00000008"
    for _, path in checkpoint_dirs(run):
        load_checkpoint(path)
    assert [r["step"] for r in read_metrics(run)] == list(range(1, 9))


def test_checkpoints_without_a_manifest_still_resume(run):
    for ckpt in CKPTS:
        (run / "checkpoints" / ckpt / "manifest.json").unlink()
    assert main(["train", "--resume", "--out", str(run), "--set", "train.steps=8"]) == 0
    assert read_summary(run).steps == 8


@pytest.mark.parametrize("content", [b"", b"\x00" * 13, b"step_00000099", b"\xff\xfe garbage"])
def test_a_damaged_latest_pointer_falls_back_to_the_checkpoints(run, capsys, content):
    (run / "checkpoints" / "latest").write_bytes(content)
    assert main(["train", "--resume", "--out", str(run), "--set", "train.steps=8"]) == 0
    out = capsys.readouterr().out
    assert "warning:" in out and "checkpoints/latest" in out and "resuming at step 6" in out
    assert latest_checkpoint(run).name == "step_00000008"


def test_damaged_metrics_and_summary_do_not_stop_a_resume(run, capsys):
    lines = (run / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    garbage = [b"\x00\x00\x00\n", b"\xff\xfe\xfd\n", b"[1, 2]\n", b'{"step": "x"}\n', b"null\n"]
    (run / "metrics.jsonl").write_bytes(b"".join(lines[:3] + garbage + lines[3:]) + b'{"step": 7, "tr')
    (run / "summary.json").write_bytes(os.urandom(200))
    assert read_summary(run) is None
    assert main(["train", "--resume", "--out", str(run), "--set", "train.steps=8"]) == 0
    assert "metrics.jsonl had 5 damaged line(s)" in capsys.readouterr().out
    assert [r["step"] for r in read_metrics(run)] == list(range(1, 9))
    assert read_summary(run).status == "completed"


# ------------------------------------------------------------------------- generate, analyze


@pytest.mark.parametrize("how", ["truncate", "zero", "delete"])
@pytest.mark.parametrize("name", ["model.safetensors", "spec.json"])
def test_generate_from_a_damaged_final_model(run, capsys, name, how):
    damage(run / "model" / name, how)
    before = digest(run)
    assert main(["generate", str(run)]) == 2
    err = one_line(capsys.readouterr().err)
    assert str(run / "model" / name) in err and f"--checkpoint {run / 'checkpoints' / CKPTS[1]}" in err
    assert digest(run) == before


def test_generate_and_analyze_on_the_command_line(run):
    damage(run / "model" / "model.safetensors", "truncate")
    before = digest(run)
    done = cli("generate", str(run))
    assert done.returncode == 2 and "model.safetensors is damaged" in one_line(done.stderr)
    assert "train --resume" in done.stderr
    assert digest(run) == before
    for ckpt in CKPTS:
        damage(run / "checkpoints" / ckpt / "model.safetensors", "truncate")
    before = digest(run)
    done = cli("analyze", str(run))
    assert done.returncode == 2 and one_line(done.stderr).startswith("headwise: error: no checkpoint of")
    assert digest(run) == before


def test_analyze_skips_a_damaged_checkpoint(run, capsys):
    damage(run / "checkpoints" / CKPTS[1] / "model.safetensors", "zero")
    assert main(["analyze", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"warning: skipped checkpoint {CKPTS[1]}" in out
    rows = (run / "analysis" / "conditioning.csv").read_text().splitlines()[1:]
    assert rows and all(r.startswith("4,") for r in rows)
    assert main(["analyze", str(run), "--checkpoints", "last", "--out", str(run / "last")]) == 0
    assert (run / "last" / "conditioning.csv").read_text().splitlines()[1].startswith("4,")


def test_analyze_of_a_study_skips_a_run_whose_final_model_is_damaged(trained, tmp_path, capsys):
    study = tmp_path / "study"
    for name in ("a", "b"):
        shutil.copytree(trained, study / name)
    damage(study / "b" / "model" / "model.safetensors", "truncate")
    assert main(["analyze", str(study)]) == 0
    out = capsys.readouterr().out
    assert "b: skipped (" in out and str(study / "b" / "model" / "model.safetensors") + " is damaged" in out
    rows = (study / "analysis" / "condition_vs_heads.csv").read_text().splitlines()[1:]
    assert [r.split(",")[0] for r in rows] == ["a"]


def test_resume_writes_a_damaged_final_model_again(run):
    good = (run / "model" / "model.safetensors").read_bytes()
    damage(run / "model" / "model.safetensors", "truncate")
    assert main(["train", "--resume", "--out", str(run)]) == 0  # what generate's refusal advises
    assert (run / "model" / "model.safetensors").read_bytes() == good
    assert (run / "model" / "manifest.json").is_file()
    load_pretrained(run / "model")


def test_load_pretrained_names_the_damage(run):
    (run / "model" / "manifest.json").unlink()
    damage(run / "model" / "model.safetensors", "truncate")
    with pytest.raises(DamagedFile, match=r"model\.safetensors is damaged: it is [\d,]+ bytes, its header says"):
        load_pretrained(run / "model")


# ------------------------------------------------------------------------- keep, and a real kill


def test_fallback_never_leaves_keep_without_an_intact_checkpoint(tmp_path):
    """keep=2 and a damaged newest checkpoint: after the fallback, at every moment of the resumed
    run, `latest` names an intact checkpoint and every step_ folder is intact."""
    out = tmp_path / "run"
    run_training(tiny_config(steps=8, ckpt_every=4, keep=2), out, task=SyntheticLM())
    damage(out / "checkpoints" / "step_00000008" / "model.safetensors", "truncate")
    seen = []

    def check(position: int) -> None:
        dirs = checkpoint_dirs(out)
        assert dirs and latest_checkpoint(out) == dirs[-1][1]
        for _, path in dirs:
            load_checkpoint(path)
        seen.append([p.name for _, p in dirs])

    cfg = tiny_config(steps=10, ckpt_every=3, keep=2)
    assert run_training(cfg, out, resume=True, task=SyntheticLM(on_batch=check)).steps == 10
    assert seen[0] == ["step_00000004"] and ["step_00000004", "step_00000006"] in seen
    assert [p.name for _, p in checkpoint_dirs(out)] == ["step_00000009", "step_00000010"]
    assert (out / "checkpoints" / "damaged_step_00000008").is_dir()


def test_sigkill_then_a_truncated_checkpoint_resumes_exactly_from_the_one_before(tmp_path, uninterrupted):
    child, out, _ = _start(tmp_path, "slow")
    _wait(lambda: any(r["step"] >= 10 for r in read_metrics(out)), child)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert child.returncode == -signal.SIGKILL and latest_checkpoint(out).name == "step_00000008"
    weights = out / "checkpoints" / "step_00000008" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])

    summary = run_training(tiny_config(**RUN), out, resume=True, task=SyntheticLM())
    assert summary.status == "completed" and summary.steps == 14
    assert _curve(out) == uninterrupted  # bit-identical losses, each step once
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == \
           ["damaged_step_00000008", "latest", "step_00000008", "step_00000012", "step_00000014"]
