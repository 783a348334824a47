"""GLUE fine-tuning: ``[train] init_from`` (encoder weights from a pretraining run, a fresh head,
refusals), the offline stand-in's construction, and GLUE parquet folders fine-tuned end to end
through the CLI, their metrics recomputed by encoder/metrics.py from the saved model's predictions."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from headwise.cli import main
from headwise.data.batch import Batch
from headwise.data.shuffled import ShuffledStream
from headwise.errors import HeadwiseError
from headwise.families.encoder.finetune import GlueTaskConfig
from headwise.families.encoder.metrics import task_metrics
from headwise.families.encoder.standin import GUARD, order_splits, standin_splits
from headwise.model.pretrained import load_pretrained
from headwise.model.transformer import Transformer
from headwise.presets import spec_from_preset
from headwise.train.config import RunConfig, resolve_spec
from headwise.train.init_from import check_init_source, load_encoder
from headwise.train.trainer import run_training
from tests.conftest import shared_data_dir

ROOT = Path(__file__).resolve().parents[1]
MLM_CONFIG, GLUE_CONFIG = ROOT / "configs" / "mlm-tiny.toml", ROOT / "configs" / "glue-tiny.toml"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """HEADWISE_DATA and a token cache of its own for the module's runs."""
    mp = pytest.MonkeyPatch()
    mp.setenv("HEADWISE_DATA", str(shared_data_dir()))
    mp.setenv("HEADWISE_CACHE", str(tmp_path_factory.mktemp("ft-cache")))
    yield
    mp.undo()


@pytest.fixture(scope="module")
def mlm_run(env, tmp_path_factory) -> Path:
    """A 3-step masked-LM pretraining run of configs/mlm-tiny.toml."""
    out = tmp_path_factory.mktemp("pre") / "mlm"
    assert main(["train", str(MLM_CONFIG), "--set", "train.steps=3", "--out", str(out)]) == 0
    return out


def glue_args(mlm: Path, out: Path, *extra: str) -> list[str]:
    return ["train", str(GLUE_CONFIG), "--set", f"task.tokenizer_from={mlm}", "--set", f"train.init_from={mlm}",
            "--set", "train.steps=2", "--set", "eval.every=0", "--set", "checkpoint.every=0", *extra, "--out", str(out)]


def test_init_from_loads_exactly_the_source_encoder_and_a_fresh_head(mlm_run):
    cfg = RunConfig.load(GLUE_CONFIG, [f"task.tokenizer_from={mlm_run}", f"train.init_from={mlm_run}"])
    task = cfg.task.build()
    spec, _ = resolve_spec(cfg.model, task)
    torch.manual_seed(0)
    fresh = Transformer(spec)
    torch.manual_seed(0)
    model = Transformer(spec)
    load_encoder(model, check_init_source(str(mlm_run), None, spec))
    source = load_pretrained(mlm_run / "model").state_dict()
    state, fresh_state = model.state_dict(), fresh.state_dict()
    head = [k for k in state if k.split(".")[0] in ("pooler", "classifier")]
    encoder = [k for k in state if k not in head]
    assert head and len(encoder) > 10
    for k in encoder:
        assert torch.equal(state[k], source[k]), k
    for k in head:  # the head is the seeded fresh one, untouched by the load
        assert torch.equal(state[k], fresh_state[k]), k
    # and the encoder really changed: the pretrained weights differ from a fresh initialisation
    assert not torch.equal(state["tok_emb.weight"], fresh_state["tok_emb.weight"])
    assert "lm_head.weight" not in state


def test_resume_of_a_fine_tuning_run_does_not_read_the_source_again(mlm_run, tmp_path, monkeypatch):
    source = tmp_path / "source"
    shutil.copytree(mlm_run, source)
    glue = _glue_folder(tmp_path / "glue")
    cfg = RunConfig.load(GLUE_CONFIG, [f"task.tokenizer_from={source}", f"train.init_from={source}", "train.steps=3",
                                       "task.task=cola", f"task.source={glue}", "eval.every=0", "checkpoint.every=0",
                                       "train.log_every=1"])
    original = ShuffledStream.__next__

    def stop_at_step_two(self):
        if self.position == self.micro_batch:  # while fetching step 2's batch: a checkpoint at step 2, then stop
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self)

    monkeypatch.setattr(ShuffledStream, "__next__", stop_at_step_two)
    out = tmp_path / "ft"
    assert run_training(cfg, out).status == "interrupted"
    monkeypatch.setattr(ShuffledStream, "__next__", original)
    shutil.rmtree(source / "model")  # a resume that read the source's weights would now be refused
    summary = run_training(cfg, out, resume=True)
    assert summary.status == "completed" and summary.steps == 3
    assert summary.init_from == {"run": str(source), "checkpoint": None}


def test_fine_tuning_batches_drop_each_epochs_last_partial_batch():
    """10 examples in batches of 2 x 2 ranks: every epoch is 2 whole global batches of 8 distinct
    examples, reshuffled, and a split smaller than one global batch is refused."""
    def make(index, generator):
        return Batch(inputs=torch.from_numpy(index), targets=torch.from_numpy(index))

    ranks = [ShuffledStream(10, make, 2, seed=1, rank=r, world_size=2, drop_last=True) for r in range(2)]
    epochs = []
    for _ in range(3):
        seen = [int(i) for _ in range(2) for stream in ranks for i in next(stream).inputs]
        assert len(seen) == len(set(seen)) == 8
        epochs.append(seen)
    assert ranks[0].epoch == 3.0 and epochs[0] != epochs[1]
    with pytest.raises(HeadwiseError, match="fewer than one batch of 8"):
        ShuffledStream(7, make, 4, seed=0, world_size=2, drop_last=True)


def _refused(args: list[str], out: Path, capsys, *words: str) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for word in words:
        assert word in err, err
    assert not out.exists()


def test_refuses_a_source_that_is_not_a_run(mlm_run, tmp_path, capsys):
    out = tmp_path / "ft"
    nothing = tmp_path / "nothing"
    args = glue_args(mlm_run, out, "--set", f"train.init_from={nothing}", "--set", f"task.tokenizer_from={nothing}")
    _refused(args, out, capsys, "is not a headwise run")


def test_refuses_another_width(mlm_run, tmp_path, capsys):
    out = tmp_path / "ft"
    _refused(glue_args(mlm_run, out, "--set", "model.d_model=64"), out, capsys, "d_model = 128", "64")


def test_refuses_a_run_of_another_family(mlm_run, tmp_path, capsys):
    # a run folder whose final model is a nearest-neighbour (vector) model: no token encoder
    other = tmp_path / "nearest"
    (other / "model").mkdir(parents=True)
    for name in ("config.toml", "summary.json", "tokenizer.json"):  # a run this headwise wrote: its tokenizer saved
        (other / name).write_text((mlm_run / name).read_text())
    (other / "model" / "spec.json").write_text(json.dumps(spec_from_preset("amsel-nn").to_dict()))
    out = tmp_path / "ft"
    _refused(glue_args(mlm_run, out, "--set", f"train.init_from={other}", "--set", f"task.tokenizer_from={other}"),
             out, capsys, "without a token encoder")


def test_refuses_weights_of_one_run_with_the_vocabulary_of_another(mlm_run, tmp_path, capsys):
    """Two pretraining runs with vocabularies of the same size: the check cannot rest on shapes."""
    twin = tmp_path / "twin"
    shutil.copytree(mlm_run, twin)
    out = tmp_path / "ft"
    _refused(glue_args(mlm_run, out, "--set", f"train.init_from={twin}"), out, capsys, "name the same run in both")


def test_refuses_a_tokenizer_run_that_is_not_a_masked_lm(mlm_run, tmp_path, capsys):
    out = tmp_path / "ft"
    _refused(glue_args(mlm_run, out, "--set", f"task.tokenizer_from={tmp_path}"), out, capsys, "tokenizer_from")


# ------------------------------------------------------------------------- the stand-in


def _numbered_stream(path: Path, passages: int = 60, sentences: int = 5) -> Path:
    """A text stream of paragraphs whose sentences name their passage and place."""
    paras = [" ".join(f"Passage {p} says thing {s}." for s in range(sentences)) for p in range(passages)]
    path.write_text("\n\n".join(paras) + "\n")
    return path


def _where(sentence: str) -> tuple[int, int]:
    words = sentence.rstrip(".").split()
    return int(words[1]), int(words[-1])


def test_standin_is_split_by_passage_balanced_and_position_matched(tmp_path):
    source = str(_numbered_stream(tmp_path / "stream.txt"))
    (train_texts, train_labels), (eval_texts, eval_labels) = standin_splits(source, seed=3, eval_frac=0.2)
    passages = {}
    for name, (a, b), labels in (("train", train_texts, train_labels), ("eval", eval_texts, eval_labels)):
        assert labels.sum() * 2 == len(labels) > 0  # exactly balanced
        seen = set()
        for x, y, label in zip(a, b, labels):
            (pa_, ia), (pb, ib) = _where(x), _where(y)
            assert ib == ia + 1  # B is always the sentence after A's position
            assert (pa_ == pb) == (label == 1)  # positives from the same passage, negatives from another
            seen |= {pa_, pb}
        passages[name] = seen
    assert not passages["train"] & passages["eval"]
    # the 12 evaluation passages are the last, GUARD paragraphs after the last training one
    assert passages["eval"] == set(range(48, 60)) and max(passages["train"]) == 48 - GUARD - 1


def test_standin_is_deterministic_and_seeded(tmp_path):
    source = str(_numbered_stream(tmp_path / "stream.txt"))
    first, again, other = (standin_splits(source, seed=s) for s in (1, 1, 2))
    assert first[0][0] == again[0][0] and np.array_equal(first[0][1], again[0][1])
    assert first[1][0] == again[1][0]
    assert first[0][0] != other[0][0]


def test_standin_of_the_validation_sample(env):
    (a, b), labels = standin_splits("tinystories-valid-sample.txt")[1]
    assert len(labels) > 1000 and labels.sum() * 2 == len(labels)
    assert all(x and y for x, y in zip(a, b))


# ------------------------------------------------------------------------- GLUE folders end to end


def _glue_folder(root: Path) -> Path:
    rng = np.random.default_rng(0)
    words = ["the", "cat", "dog", "sat", "ran", "on", "a", "mat", "big", "small", "happy", "sad"]

    def sentence() -> str:
        return " ".join(rng.choice(words, size=int(rng.integers(3, 9)))) + "."

    for task, columns, split, n in (("cola", ("sentence",), "train", 40), ("cola", ("sentence",), "validation", 13),
                                    ("mrpc", ("sentence1", "sentence2"), "train", 40),
                                    ("mrpc", ("sentence1", "sentence2"), "validation", 11),
                                    ("stsb", ("sentence1", "sentence2"), "train", 40),
                                    ("stsb", ("sentence1", "sentence2"), "validation", 19),
                                    ("mnli", ("premise", "hypothesis"), "train", 40),
                                    ("mnli", ("premise", "hypothesis"), "validation_matched", 14),
                                    ("mnli", ("premise", "hypothesis"), "validation_mismatched", 9)):
        table = {c: [sentence() for _ in range(n)] for c in columns}
        if task == "stsb":
            table["label"] = rng.uniform(0, 5, size=n).astype(np.float32)
        else:
            table["label"] = rng.integers(0, 3 if task == "mnli" else 2, size=n).astype(np.int64)
        table["idx"] = np.arange(n, dtype=np.int32)
        (root / task).mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table(table), root / task / f"{split}-00000-of-00001.parquet")
    return root


@pytest.mark.parametrize("task", ["cola", "mrpc"])
def test_glue_folder_fine_tunes_end_to_end(task, mlm_run, tmp_path):
    glue = _glue_folder(tmp_path / "glue")
    out = tmp_path / "ft"
    extra = ["--set", f"task.task={task}", "--set", f"task.source={glue}", "--set", "task.eval_batch_size=4"]
    assert main(glue_args(mlm_run, out, *extra)) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["init_from"] == {"run": str(mlm_run), "checkpoint": None}
    saved = RunConfig.load(out / "config.toml")
    assert saved.train.init_from == str(mlm_run) and saved.task.task == task
    # the metrics recomputed over the whole validation split from the saved model's predictions
    glue_task = GlueTaskConfig.parse(saved.task.to_dict()).build()
    model = load_pretrained(out / "model").eval()
    with torch.no_grad():
        batches = glue_task.eval_batches()
        predictions = torch.cat([model(b.inputs).argmax(-1) for b in batches]).numpy()
        labels = torch.cat([b.targets for b in batches]).numpy()
    assert len(labels) == (13 if task == "cola" else 11)
    expected = task_metrics(task, predictions, labels)
    assert set(summary["eval_metrics"]) == set(expected)
    for name, value in expected.items():
        assert math.isfinite(summary["eval_metrics"][name])
        assert summary["eval_metrics"][name] == pytest.approx(value, abs=1e-9), name


def _saved_model_outputs(out: Path) -> tuple[list, list]:
    """The fine-tuned model's outputs and the targets on every evaluation batch of its own task."""
    saved = RunConfig.load(out / "config.toml")
    task = GlueTaskConfig.parse(saved.task.to_dict()).build()
    model = load_pretrained(out / "model").eval()
    with torch.no_grad():
        return [model(b.inputs) for b in task.eval_batches()], [b.targets for b in task.eval_batches()]


def test_stsb_fine_tunes_a_regressor_scored_by_pearson_and_spearman(mlm_run, tmp_path):
    glue = _glue_folder(tmp_path / "glue")
    out = tmp_path / "ft"
    extra = ["--set", "task.task=stsb", "--set", f"task.source={glue}", "--set", "task.eval_batch_size=4"]
    assert main(glue_args(mlm_run, out, *extra)) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert load_pretrained(out / "model").spec.num_classes == 1  # one output: the score
    outputs, targets = _saved_model_outputs(out)
    scores = torch.cat([o[:, 0] for o in outputs]).double().numpy()
    labels = torch.cat([t[:, 0] for t in targets]).double().numpy()
    # the labels in file order: the task's row numbering keeps the split's order
    assert labels == pytest.approx(pq.read_table(glue / "stsb" / "validation-00000-of-00001.parquet")
                                   .column("label").to_numpy().astype(np.float64))
    from scipy.stats import pearsonr, spearmanr

    assert set(summary["eval_metrics"]) == {"pearson", "spearmanr"}
    assert summary["eval_metrics"]["pearson"] == pytest.approx(pearsonr(scores, labels)[0], abs=1e-6)
    assert summary["eval_metrics"]["spearmanr"] == pytest.approx(spearmanr(scores, labels)[0], abs=1e-6)
    # trained with the squared error of the one output
    assert summary["task"]["baseline_loss"] == pytest.approx(float(np.var(
        pq.read_table(glue / "stsb" / "train-00000-of-00001.parquet").column("label").to_numpy())), rel=1e-5)


def test_mnli_is_scored_on_matched_and_mismatched_at_once(mlm_run, tmp_path, capsys):
    glue = _glue_folder(tmp_path / "glue")
    out = tmp_path / "ft"
    extra = ["--set", "task.task=mnli", "--set", f"task.source={glue}", "--set", "task.eval_batch_size=4"]
    assert main(glue_args(mlm_run, out, *extra)) == 0
    summary = json.loads((out / "summary.json").read_text())
    outputs, targets = _saved_model_outputs(out)
    predicted = torch.cat([o.argmax(-1) for o in outputs]).numpy()
    encoded = torch.cat(targets).numpy()
    matched, mismatched = encoded < 3, encoded >= 3
    assert matched.sum() == 14 and mismatched.sum() == 9
    assert summary["eval_metrics"] == pytest.approx({
        "accuracy": task_metrics("mnli", predicted[matched], encoded[matched])["accuracy"],
        "accuracy_mismatched": task_metrics("mnli", predicted[mismatched], encoded[mismatched] - 3)["accuracy"]})
    assert summary["task"]["eval_examples"] == {"": 14, "mismatched": 9}
    # `headwise generate` scores a held-out batch by its accuracy, not by a cell of the confusion matrix
    capsys.readouterr()
    assert main(["generate", str(out)]) == 0
    batch_accuracy = float((outputs[0].argmax(-1).numpy() == encoded[:4] % 3).mean())
    assert f"held-out batch: accuracy {batch_accuracy:.3f}," in capsys.readouterr().out


def test_refuses_a_classifier_for_a_regression(mlm_run, tmp_path, capsys):
    glue = _glue_folder(tmp_path / "glue")
    out = tmp_path / "ft"
    _refused(glue_args(mlm_run, out, "--set", "task.task=stsb", "--set", f"task.source={glue}",
                       "--set", "model.num_classes=2"), out, capsys, "num_classes = 2", "remove num_classes")


def test_refuses_a_glue_task_that_does_not_exist(mlm_run, tmp_path, capsys):
    out = tmp_path / "ft"
    _refused(glue_args(mlm_run, out, "--set", "task.task=wnli"), out, capsys, "task.task", "standin_order")


def test_refuses_a_split_without_its_label_column(mlm_run, tmp_path, capsys):
    glue = _glue_folder(tmp_path / "glue")
    path = glue / "cola" / "train-00000-of-00001.parquet"
    pq.write_table(pq.read_table(path).drop(["label"]), path)
    out = tmp_path / "ft"
    _refused(glue_args(mlm_run, out, "--set", "task.task=cola", "--set", f"task.source={glue}"), out, capsys,
             "lacks column(s) label")


def test_word_order_standin_keeps_the_words_and_splits_by_passage(tmp_path):
    """Each example holds a sentence's own words: as written (label 1) or with its inner words in
    another order (label 0), first and last in place; balanced; no passage in both splits."""
    paras = [" ".join(f"Story {p} has a line number {s} here." for s in range(4)) for p in range(60)]
    source = tmp_path / "stream.txt"
    source.write_text("\n\n".join(paras) + "\n")
    (train_texts,), train_labels = order_splits(str(source), seed=2)[0]
    (eval_texts,), eval_labels = order_splits(str(source), seed=2)[1]
    originals = {f"Story {p} has a line number {s} here." for p in range(60) for s in range(4)}

    for texts, labels in ((train_texts, train_labels), (eval_texts, eval_labels)):
        assert abs(int(labels.sum()) * 2 - len(labels)) <= 1  # balanced within one sentence
        for text, label in zip(texts, labels):
            words = text.split()
            assert words[0] == "Story" and words[-1] == "here."
            if label == 1:
                assert text in originals
            else:
                assert text not in originals
                assert any(sorted(words) == sorted(o.split()) for o in originals if o.split()[1] in words)
    train_stories = {int(t.split()[1]) for t, y in zip(train_texts, train_labels) if y == 1}
    eval_stories = {int(t.split()[1]) for t, y in zip(eval_texts, eval_labels) if y == 1}
    assert train_stories and eval_stories and not train_stories & eval_stories
    assert max(train_stories) + GUARD < min(eval_stories)
    # the same seed gives the same examples; another seed others
    assert order_splits(str(source), seed=2)[1][0][0] == eval_texts
    assert order_splits(str(source), seed=3)[1][0][0] != eval_texts
