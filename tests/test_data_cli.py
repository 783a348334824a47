"""``headwise data prepare | info | list`` from the command line."""

import json
import subprocess
import sys

import pytest

from headwise.cli import main
from test_data_sources import data_env  # noqa: F401


@pytest.fixture
def env(data_env, tmp_path, monkeypatch):
    monkeypatch.setenv("HEADWISE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def run_json(capsys, *argv):
    assert main(list(argv) + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_prepare_reuse_info_and_list(env, capsys):
    args = ["data", "prepare", "tinystories-tiny-fixture.txt", "--validation", "tinystories-valid-sample.txt",
            "--tokenizer", "bpe:300"]
    built = run_json(capsys, *args)
    assert built["train_documents"] == 5 and built["vocab_size"] == 300
    assert built["cache"].startswith(str(env))
    assert run_json(capsys, *args) == built  # reused
    info = run_json(capsys, "data", "info", built["cache"])
    assert info == built
    plan = run_json(capsys, "data", "info", "tinystories-tiny-fixture.txt", "--validation",
                    "tinystories-valid-sample.txt", "--tokenizer", "bpe:300")
    assert plan["ready"] is True and plan["cache"] == built["cache"]
    other = run_json(capsys, "data", "info", "tinystories-tiny-fixture.txt", "--validation", "fraction:0.5")
    assert other["ready"] is False
    listed = run_json(capsys, "data", "list")
    assert [row["cache"] for row in listed] == [built["cache"]] and listed[0]["ok"]
    assert main(["data", "list"]) == 0
    assert capsys.readouterr().out.startswith(f"{built['cache']}  ")


def test_prepare_from_a_run_config(env, tmp_path, capsys):
    run = tmp_path / "run.toml"
    run.write_text('[task]\nsource = "tinystories-tiny-fixture.txt"\nvalidation = "fraction:0.4"\nblock_size = 16\n')
    built = run_json(capsys, "data", "prepare", "--config", str(run))
    assert built["tokenizer"] == "gpt-neo" and built["train_documents"] + built["valid_documents"] == 5
    # Options override the config.
    bpe = run_json(capsys, "data", "prepare", "--config", str(run), "--tokenizer", "bpe:260")
    assert bpe["vocab_size"] == 260
    nearest = tmp_path / "nn.toml"
    nearest.write_text('[task]\nkind = "nearest"\n')
    assert main(["data", "prepare", "--config", str(nearest)]) == 2
    assert "no text to prepare" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["absent.txt"], "not found"),
        (["tinystories-tiny-fixture.txt", "--tokenizer", "bpe:12"], "too small"),
        (["tinystories-tiny-fixture.txt", "--subset", "50"], "larger than the source"),
        (["tinystories-tiny-fixture.txt", "--validation", "split:validation"], "needs a hub dataset"),
        (["roneneldan/TinyStories"], "HEADWISE_DATA"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(env, capsys, argv, message):
    assert main(["data", "prepare", "--quiet", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("headwise: error: ") and message in err and err.count("\n") == 1
    assert not env.exists() or not any(p for p in env.iterdir() if not p.name.startswith("."))


def test_a_corrupt_cache_exits_2_until_rebuilt(env, capsys):
    source = ["tinystories-tiny-fixture.txt", "--validation", "tinystories-valid-sample.txt"]
    built = run_json(capsys, "data", "prepare", *source)
    train = f"{built['cache']}/train.bin"
    with open(train, "r+b") as f:
        f.truncate(10)
    assert main(["data", "info", built["cache"]]) == 2
    assert "truncated" in capsys.readouterr().err
    argv = ["data", "prepare", *source, "--quiet"]
    assert main(argv) == 2
    assert "--rebuild" in capsys.readouterr().err
    assert main(argv + ["--rebuild"]) == 0


def test_module_entry_point_exit_code(env):
    proc = subprocess.run(
        [sys.executable, "-m", "headwise", "data", "prepare", "missing-file.txt"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("headwise: error: data source 'missing-file.txt' not found")
    assert len(proc.stderr.strip().splitlines()) == 1
