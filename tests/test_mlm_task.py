"""The masked-LM pretraining family (``[task] kind = "mlm"``): its vocabulary's specials, cramming's
exact-count 80/10/10 masking, seeded and resumable streams, the fixed eval masking, the loss
against torch's and masked_lm_loss, training and evaluation decoding only the masked positions,
and a short training run from configs/mlm-tiny.toml."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import headwise.model.outputs as heads_module
from headwise.cli import main
from headwise.errors import HeadwiseError
from headwise.families.encoder.masking import MaskedStream, batch_generator, mask_tokens
from headwise.families.encoder.task import MLMTaskConfig
from headwise.model import Transformer
from headwise.model.loss import masked_lm_loss
from headwise.presets import spec_from_preset
from headwise.tasks.family import family_of
from headwise.text.masked_vocab import CLS_ID, MASK_ID, NUM_SPECIAL, PAD_ID, SEP_ID
from tests.conftest import shared_data_dir

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "mlm-tiny.toml"
V = 30000


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("mlm-cache")


def task_fields(**changes):
    data = shared_data_dir()
    return dict(kind="mlm", source=str(data / "tinystories-train-sample.txt"),
                validation=str(data / "tinystories-valid-sample.txt"), tokenizer="bpe:1024",
                eval_batches=2, eval_batch_size=4, **changes)


@pytest.fixture(scope="module")
def task(cache_dir):
    return MLMTaskConfig(**task_fields()).build(cache_dir=cache_dir)


def _rows(n: int, seed: int = 0) -> torch.Tensor:
    """Rows of 128 like the task's: [CLS] ... [SEP], a document boundary [SEP] at a random place
    in half of them and a [PAD] in a few, the rest ordinary ids."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(NUM_SPECIAL, V, (n, 128), generator=g)
    rows[:, 0], rows[:, -1] = CLS_ID, SEP_ID
    inner = torch.randint(1, 127, (n,), generator=g)
    rows[torch.arange(0, n, 2), inner[::2]] = SEP_ID
    rows[torch.arange(0, n, 7), 5] = PAD_ID
    return rows


def test_special_ids_and_vocabulary(task):
    assert (PAD_ID, CLS_ID, SEP_ID, MASK_ID) == (0, 1, 2, 3)
    # bpe:1024 = 1023 BPE tokens + end-of-text; the end-of-text becomes [SEP]: 1023 + 4 ids
    assert task.vocab_size == 1027 == MLMTaskConfig(kind="mlm", tokenizer="bpe:1024").dims().vocab_size
    ids = task.vocab.encode("Once upon a time, there was a cat.")
    assert ids[0] == CLS_ID and ids[-1] == SEP_ID and min(ids[1:-1]) >= NUM_SPECIAL
    assert task.vocab.decode(ids) == "[CLS]Once upon a time, there was a cat.[SEP]"
    bpe = task.cache.tokenizer
    assert ids[1:-1] == [i + NUM_SPECIAL for i in bpe.encode("Once upon a time, there was a cat.")]
    assert task.vocab.from_cache(np.array([bpe.eot_id, 0, 5])).tolist() == [SEP_ID, 4, 9]
    # the task's rows: [CLS] first, [SEP] last, document boundaries as [SEP], ids within the vocabulary
    batch = task.eval_batches()[0]
    assert (batch.inputs[:, 0] == CLS_ID).all() and (batch.inputs[:, -1] == SEP_ID).all()
    assert batch.inputs.shape == (4, 128) and int(batch.inputs.max()) < task.vocab_size


def test_masking_counts_split_and_labels():
    rows = _rows(4000)
    inputs, labels = mask_tokens(rows, 0.25, V, torch.Generator().manual_seed(1))
    special = rows < NUM_SPECIAL
    chosen = labels != -100
    # labels: the original ids at the chosen positions, exactly -100 elsewhere
    assert torch.equal(labels[chosen], rows[chosen]) and (labels[~chosen] == -100).all()
    # specials are never chosen and never changed
    assert not (chosen & special).any() and torch.equal(inputs[special], rows[special])
    assert torch.equal(inputs[~chosen], rows[~chosen])
    # an exact count per row: 126 ordinary tokens -> round(31.5) = 32 (cramming's round(0.25 * 128));
    # 125 -> round(31.25) = 31; 124 -> 31
    maskable = (~special).sum(1)
    expected = {126: 32, 125: 31, 124: 31}
    assert set(maskable.tolist()) <= set(expected)
    for m, k in expected.items():
        assert (chosen[maskable == m].sum(1) == k).all()
    # 80/10/10 per row: of 32, round(25.6) = 26 [MASK], round(28.8) - 26 = 3 random, 3 kept;
    # of 31, round(24.8) = 25 [MASK], round(27.9) - 25 = 3 random, 3 kept
    n_mask = (inputs == MASK_ID).sum(1)
    assert (n_mask[maskable == 126] == 26).all() and (n_mask[maskable != 126] == 25).all()
    replaced = chosen & (inputs != MASK_ID) & (inputs != rows)
    # a random id equals the original with probability 1/(V - 4): about 12,000 * 3.3e-5 = 0.4 times
    assert 3 * len(rows) - 3 <= int(replaced.sum()) <= 3 * len(rows)
    random_ids = inputs[replaced]
    assert int(random_ids.min()) >= NUM_SPECIAL and int(random_ids.max()) < V
    # uniform over the ordinary ids: mean (4 + V - 1) / 2, standard error (V / sqrt(12)) / sqrt(12,000)
    assert abs(random_ids.double().mean().item() - (NUM_SPECIAL + V - 1) / 2) < 5 * V / math.sqrt(12 * 12000)
    # every ordinary position is equally likely: 25% +- 5 standard errors (sqrt(0.1875 / 4000) = 0.0068)
    column_rate = chosen[:, 10:120].double().mean(0)
    assert (column_rate - 0.25).abs().max() < 0.035
    assert abs(chosen.sum().item() / maskable.sum().item() - 0.25) < 0.001


@pytest.mark.parametrize("rate", [0.15, 0.5])
def test_other_rates_count_exactly(rate):
    rows = _rows(50)
    _, labels = mask_tokens(rows, rate, V, torch.Generator().manual_seed(0))
    maskable = (rows >= NUM_SPECIAL).sum(1)
    assert torch.equal((labels != -100).sum(1), torch.round(rate * maskable.double()).long())


def test_masking_is_the_generators():
    rows = _rows(8)
    a = mask_tokens(rows, 0.25, V, batch_generator(3, 16, 0))
    b = mask_tokens(rows, 0.25, V, batch_generator(3, 16, 0))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    for other in (batch_generator(4, 16, 0), batch_generator(3, 32, 0), batch_generator(3, 16, 1)):
        assert not torch.equal(mask_tokens(rows, 0.25, V, other)[1], a[1])


def test_stream_resumes_exactly(task):
    tokens = task.cache.tokens("train")
    whole = MaskedStream(tokens, task.vocab, 128, 0.25, 4, seed=5)
    expected = [next(whole) for _ in range(5)]
    first = MaskedStream(tokens, task.vocab, 128, 0.25, 4, seed=5)
    for _ in range(2):
        next(first)
    state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint keeps it
    resumed = MaskedStream(tokens, task.vocab, 128, 0.25, 4, seed=0)
    resumed.load_state_dict(state)
    for want in expected[2:]:
        got = next(resumed)
        assert torch.equal(got.inputs, want.inputs) and torch.equal(got.targets, want.targets)
    # another seed orders and masks differently
    assert not torch.equal(next(MaskedStream(tokens, task.vocab, 128, 0.25, 4, seed=6)).targets, expected[0].targets)
    with pytest.raises(HeadwiseError, match="same mask_rate"):
        MaskedStream(tokens, task.vocab, 128, 0.15, 4, seed=5).load_state_dict(state)


def test_stream_rows_do_not_overlap(task):
    """Each row holds 126 consecutive cache tokens; the rows of an epoch cover disjoint chunks."""
    tokens = task.cache.tokens("train")
    stream = MaskedStream(tokens, task.vocab, 128, 0.25, 3, seed=1)
    blocks = stream.order.indices(0)
    batch = next(stream)
    original = torch.where(batch.targets != -100, batch.targets, batch.inputs)
    for row, block in zip(original, blocks, strict=True):
        assert row[1:-1].tolist() == task.vocab.from_cache(tokens[block * 126:block * 126 + 126]).tolist()


def test_eval_masking_is_fixed(task, cache_dir):
    """The same every call and every build: the held-out masking has a fixed seed of its own."""
    first = task.eval_batches()
    again = MLMTaskConfig(**task_fields()).build(cache_dir=cache_dir)
    for a, b, c in zip(first, task.eval_batches(), again.eval_batches(), strict=True):
        assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
        assert torch.equal(a.inputs, c.inputs) and torch.equal(a.targets, c.targets)
    assert len(first) == 2 and all(int((b.targets != -100).sum(1).min()) >= 31 for b in first)


def test_loss_is_masked_lm_loss(task):
    torch.manual_seed(0)
    model = Transformer(spec_from_preset("crammed-bert-tiny", vocab_size=task.vocab_size)).eval()
    batch = task.eval_batches()[0]
    with torch.no_grad():
        logits = model(batch.inputs)
        ours = task.loss(logits, batch.targets)
        reference = F.cross_entropy(logits.flatten(0, 1), batch.targets.flatten(), ignore_index=-100)
        sparse = masked_lm_loss(model, batch.inputs, batch.targets)
        accuracy = task.metrics(logits, batch)["masked_accuracy"]
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sparse, reference, rtol=1e-5, atol=1e-5)
    masked = batch.targets != -100
    hits = sum(int(logits[i, t].argmax()) == int(batch.targets[i, t]) for i, t in masked.nonzero().tolist())
    assert accuracy.item() == pytest.approx(hits / int(masked.sum()))


def _count_decoded(monkeypatch) -> list[int]:
    """The rows of every call of the decoder's padded-vocabulary matmul from now on."""
    decoded: list[int] = []
    real = heads_module.padded_logits
    monkeypatch.setattr(heads_module, "padded_logits", lambda h, w: decoded.append(h.shape[0]) or real(h, w))
    return decoded


def test_training_and_evaluation_decode_only_the_masked_rows(task, monkeypatch):
    """The trainer's hooks gather the masked positions before the decoder; loss, gradients and
    masked accuracy are those of the full logits."""
    torch.manual_seed(0)
    model = Transformer(spec_from_preset("crammed-bert-tiny", vocab_size=task.vocab_size)).train()
    batch = next(task.train_stream(4, seed=0))
    full = task.loss(model(batch.inputs, pad_vocab=True), batch.targets)
    full.backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    decoded = _count_decoded(monkeypatch)
    sparse = task.train_loss(model, batch)
    sparse.backward()
    rows = batch.targets != -100
    # at most 32 of each row's 126 tokens (fewer where a document boundary takes a place), not 4 x 128
    assert decoded == [int(rows.sum())] and decoded[0] <= 4 * 32
    torch.testing.assert_close(sparse, full, rtol=0, atol=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=0, atol=1e-6, msg=name)
    model.eval()
    for b in task.eval_batches():
        with torch.no_grad():
            logits = model(b.inputs, pad_vocab=True)
            loss, metrics = task.evaluate(model, b)
            picked = model(b.inputs, pad_vocab=True, select=b.targets != -100)
        torch.testing.assert_close(loss, task.loss(logits, b.targets), rtol=0, atol=1e-6)
        assert torch.equal(picked.argmax(-1), logits[b.targets != -100].argmax(-1))
        assert metrics["masked_accuracy"].item() == task.metrics(logits, b)["masked_accuracy"].item()


def test_select_is_for_heads_that_decode_positions():
    spec = spec_from_preset("crammed-bert-tiny", vocab_size=50, outputs="cls_pooler", num_classes=2)
    with pytest.raises(ValueError, match="decodes none"):
        Transformer(spec)(torch.ones(1, 8, dtype=torch.long), select=torch.ones(1, 8, dtype=torch.bool))


def test_family_shape():
    family = family_of("mlm")
    assert family.generates_text is False and family.outputs == "mlm" and family.inputs == "tokens"
    shape = MLMTaskConfig(kind="mlm", tokenizer="bpe:1024", block_size=64).shape()
    assert (shape.outputs, shape.vocab_size, shape.seq_len, shape.spec_fields) == ("mlm", 1027, 64, {"causal": False})


@pytest.mark.parametrize("rate", ["0", "1", "1.5", "-0.1"])
def test_bad_mask_rate_is_one_line(rate, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", str(CONFIG), "--set", f"task.mask_rate={rate}", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "mask_rate" in err and "outside (0, 1)" in err
    assert not out.exists()


def test_a_row_too_short_to_mask_anything_is_one_line(tmp_path, capsys):
    """block_size 4 at 25%: round(0.25 * 2) = 0 masked tokens a row, so the loss would be over
    nothing (nan); refused before the run starts."""
    out = tmp_path / "run"
    assert main(["train", str(CONFIG), "--set", "task.block_size=4", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "masks no token" in err and "block_size" in err
    assert not out.exists()


def test_train_mlm_tiny(tmp_path, cache_dir, monkeypatch, capsys):
    monkeypatch.setenv("HEADWISE_DATA", str(shared_data_dir()))
    monkeypatch.setenv("HEADWISE_CACHE", str(cache_dir))  # the token cache the fixture built
    out = tmp_path / "run"
    decoded = _count_decoded(monkeypatch)
    assert main(["train", str(CONFIG), "--set", "train.steps=3", "--out", str(out)]) == 0
    # training (16 rows a step) and evaluation (16 a batch) decoded 32 masked positions a row, not 128
    assert decoded and max(decoded) <= 16 * 32
    summary = json.loads((out / "summary.json").read_text())
    loss = summary["final_eval_loss"]
    assert summary["task"]["vocab_size"] == 1027
    assert math.isfinite(loss) and loss < math.log(1027)
    # headwise generate on a masked LM shows its guesses at held-out masked tokens
    assert main(["generate", str(out)]) == 0
    assert "masked" in capsys.readouterr().out
