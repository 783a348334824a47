"""``headwise eval``: lm-evaluation-harness on a trained tiny run, offline, over the local story
tasks (log-likelihood and generation requests both run); the multiple-choice accuracy checked
against the model's own log-likelihoods; the local tasks' data; bad input."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import shared_data_dir
from headwise.cli import main
from headwise.errors import HeadwiseError
from headwise.hf.evaluation.harness import INSTALL, require_lm_eval
from headwise.hf.evaluation.local_tasks import (LOCAL_TASKS, STORY_CONTINUATION, STORY_ENDINGS, LocalTaskSizes,
                                             file_texts, held_out_texts, local_task_examples, read_examples,
                                             write_local_tasks)
from helpers import one_line_error, one_thread  # noqa: F401  (one_thread applies to this module)

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
DATA = shared_data_dir()


def _lm_eval_missing() -> str | None:
    try:
        require_lm_eval()
    except HeadwiseError as exc:
        return str(exc)
    return None


MISSING = _lm_eval_missing()
NEEDS_LM_EVAL = pytest.mark.skipif(MISSING is not None, reason=f"lm-eval is not installed: {MISSING}")

#: lm-tiny made quicker: 400 stories, 40 steps. Heads 4,2 of widths 16 and 32 (d_model 64).
TRAIN = ["--set", "train.steps=40", "--set", "eval.every=40", "--set", "checkpoint.every=40",
         "--set", "train.log_every=20", "--set", "task.subset=400"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny language run trained on the TinyStories sample (about 15 s)."""
    root = tmp_path_factory.mktemp("lm-eval")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HEADWISE_DATA", str(DATA))
        mp.setenv("HEADWISE_CACHE", str(root / "cache"))
        out = root / "run"
        assert main(["train", str(CONFIGS / "lm-tiny.toml"), "--out", str(out), *TRAIN]) == 0
        yield out


@pytest.fixture
def data_env(monkeypatch):
    monkeypatch.setenv("HEADWISE_DATA", str(DATA))


def _own_choice_loglikelihoods(model, tokenizer, example: dict) -> np.ndarray:
    """Summed log-probabilities of each choice after the context (lm-eval joins them with a
    space), computed with headwise's own model and tokenizer."""
    context = tokenizer.encode(example["context"])
    lls = []
    for choice in example["choices"]:
        continuation = tokenizer.encode(" " + choice)
        # the context ends a sentence, so the space starts a new token: encoding the two apart
        # is encoding them together
        assert tokenizer.encode(example["context"] + " " + choice) == context + continuation
        ids = torch.tensor([context + continuation])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(ids[:, :-1]).double(), dim=-1)[0]
        targets = ids[0, len(context):]
        lls.append(float(logprobs[len(context) - 1:].gather(-1, targets[:, None]).sum()))
    return np.array(lls)


@NEEDS_LM_EVAL
@pytest.mark.slow
def test_eval_writes_scores_and_matches_own_log_likelihoods(run, data_env, capsys):
    from headwise.run import read_summary
    from headwise.train.generate import load_run_model, run_config, run_tokenizer

    assert read_summary(run).heads == (4, 2) and read_summary(run).plan.head_dims == (16, 32)
    limit = 12
    assert main(["eval", str(run), "--limit", str(limit), "--batch-size", "4"]) == 0
    out = capsys.readouterr().out
    path = run / "eval" / "lm-eval.json"
    assert f"scores written to {path}" in out and "story_endings" in out
    report = json.loads(path.read_text())
    endings, continuation = report["scores"][STORY_ENDINGS], report["scores"][STORY_CONTINUATION]
    assert 0 <= endings["acc"] <= 1 and 0 <= endings["acc_norm"] <= 1
    assert 0 <= continuation["exact_match,first_word"] <= 1
    assert report["n_samples"][STORY_ENDINGS]["effective"] == limit
    assert report["config"]["run_dir"] == str(run) and report["config"]["limit"] == limit

    # the independent reference: lm-eval's accuracy over the first `limit` examples is the
    # argmax of the summed log-likelihoods headwise's own model gives each choice
    model, _ = load_run_model(run)
    tokenizer = run_tokenizer(run, run_config(run))
    examples = read_examples(run / "eval" / "tasks", STORY_ENDINGS)[:limit]
    lls = [_own_choice_loglikelihoods(model.eval(), tokenizer, e) for e in examples]
    acc = np.mean([np.argmax(ll) == e["label"] for ll, e in zip(lls, examples)])
    lengths = [np.array([len(c) for c in e["choices"]], dtype=float) for e in examples]
    acc_norm = np.mean([np.argmax(ll / n) == e["label"] for ll, n, e in zip(lls, lengths, examples)])
    assert endings["acc"] == pytest.approx(acc) and endings["acc_norm"] == pytest.approx(acc_norm)

    # a second evaluation never overwrites the first
    assert main(["eval", str(run), "--tasks", STORY_ENDINGS, "--limit", "4"]) == 0
    assert (run / "eval" / "lm-eval-2.json").is_file() and json.loads(path.read_text()) == report


def test_local_tasks_are_built_from_held_out_text_deterministically(tmp_path):
    texts = list(file_texts(DATA / "tinystories-valid-sample.txt"))
    sizes = LocalTaskSizes(examples=30)
    a = write_local_tasks(local_task_examples(texts, sizes, seed=1), tmp_path / "a")
    b = write_local_tasks(local_task_examples(texts, sizes, seed=1), tmp_path / "b")
    c = write_local_tasks(local_task_examples(texts, sizes, seed=2), tmp_path / "c")
    stream = " ".join(" ".join(t.split()) for t in texts)
    for name in LOCAL_TASKS:
        assert read_examples(a, name) == read_examples(b, name) != read_examples(c, name)
        assert len(read_examples(a, name)) == 30
    for e in read_examples(a, STORY_ENDINGS):
        assert len(e["choices"]) == 4 and len(set(e["choices"])) == 4
        # the true ending follows its context in the text; the others do not
        assert e["context"] + " " + e["choices"][e["label"]] in stream
        assert len(e["context"]) <= sizes.max_context_chars
    for e in read_examples(a, STORY_CONTINUATION):
        assert (e["context"] + " " + e["target"]) in stream and e["target"].isalpha()
    spec = (a / f"{STORY_ENDINGS}.yaml").read_text()
    assert "output_type: multiple_choice" in spec and str((a / f"{STORY_ENDINGS}.jsonl").resolve()) in spec
    assert "output_type: generate_until" in (a / f"{STORY_CONTINUATION}.yaml").read_text()


def test_endings_that_do_not_fit_are_left_out_and_the_rest_is_unchanged():
    texts = list(file_texts(DATA / "tinystories-valid-sample.txt"))
    sizes = LocalTaskSizes(examples=30)
    plain = local_task_examples(texts, sizes, seed=1)
    # a predicate that takes every ending changes nothing: the examples are those built without one
    assert local_task_examples(texts, sizes, seed=1, fits=lambda ending: True) == plain
    short = local_task_examples(texts, sizes, seed=1, fits=lambda ending: len(ending) <= 40)
    lengths = [len(c) for e in plain[STORY_ENDINGS] for c in e["choices"]]
    assert max(lengths) > 40  # the text has longer endings, which the predicate leaves out
    assert len(short[STORY_ENDINGS]) == 30
    assert all(len(c) <= 40 for e in short[STORY_ENDINGS] for c in e["choices"])
    # only the endings task is filtered
    assert short[STORY_CONTINUATION] == plain[STORY_CONTINUATION]


def test_held_out_text_is_the_runs_validation_data(run):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HEADWISE_DATA", str(DATA))
        first = next(iter(held_out_texts(run)))
    assert first == (DATA / "tinystories-valid-sample.txt").read_text(encoding="utf-8")


def test_without_lm_eval_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # makes `import lm_eval` fail
    message = one_line_error(require_lm_eval)
    assert INSTALL in message and INSTALL == 'pip install -c requirements.lock -e ".[eval]"'


@NEEDS_LM_EVAL
def test_bad_input_is_one_line_exit_2(run, data_env, tmp_path, capsys):
    nearest = tmp_path / "nearest"
    assert main(["train", str(CONFIGS / "nearest-tiny.toml"), "--out", str(nearest), "--set", "train.steps=2",
                 "--set", "eval.every=2", "--set", "checkpoint.every=2", "--set", "train.log_every=1"]) == 0
    taken = tmp_path / "taken.json"
    taken.write_text("{}")
    capsys.readouterr()
    cases = [
        ([str(tmp_path / "missing")], "not a headwise run"),
        ([str(nearest)], "'nearest' run"),
        ([str(run), "--tasks", "story_endings,no_such_task"], "unknown task 'no_such_task'"),
        ([str(run), "--tasks", ","], "--tasks is empty"),
        ([str(run), "--limit", "0"], "--limit 0"),
        ([str(run), "--out", str(taken)], "exists"),
        ([str(run), "--text", str(tmp_path / "nothing.txt")], "no such file"),
    ]
    for args, says in cases:
        assert main(["eval", *args]) == 2, args
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err and "Traceback" not in err, (args, err)
    assert taken.read_text() == "{}"


@NEEDS_LM_EVAL
def test_a_task_whose_data_cannot_be_reached_fails_in_one_line(run, tmp_path):
    from headwise.errors import RunFailure
    from headwise.hf.evaluation.harness import run_harness
    from headwise.hf.models import from_run
    from headwise.hf.tokenizer import run_hf_tokenizer

    # a task on a hub dataset, as lm-eval's standard tasks are: offline, its data cannot be downloaded
    (tmp_path / "hub_task.yaml").write_text(
        "task: hub_task\ndataset_path: nobody/no-such-dataset\ntest_split: test\noutput_type: multiple_choice\n"
        "doc_to_text: context\ndoc_to_choice: choices\ndoc_to_target: label\n"
    )
    with pytest.raises(RunFailure, match="network access") as info:
        run_harness(from_run(run)[0], run_hf_tokenizer(run), ["hub_task"], tmp_path, tmp_path / "out.json")
    assert "\n" not in str(info.value) and not (tmp_path / "out.json").exists()
