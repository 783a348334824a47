"""Packed batches: every token once per epoch, seeded order, exact resume, disjoint ranks; the
language task's evaluation set and loss."""

import math

import numpy as np
import pytest
import torch

from headwise.text.token_cache import prepare
from headwise.text.packing import PackedStream, num_blocks
from headwise.text.data_plan import DataConfig
from headwise.errors import HeadwiseError
from headwise.tasks.base import TaskShape
from headwise.families.lm.task import LMTaskConfig
from headwise.tasks.union import build_task
from headwise.families.lm.lm_task import LMTask
from test_data_sources import data_env  # noqa: F401

TOKENS = np.arange(1001, dtype=np.uint32)  # token value = its position: blocks are easy to read


def block_of(row_inputs, bs):
    """The block index of a row of inputs (its first token / block_size)."""
    assert row_inputs[0] % bs == 0
    return int(row_inputs[0]) // bs


def take(stream, steps):
    return [next(stream) for _ in range(steps)]


def test_blocks_are_contiguous_and_targets_are_shifted_inputs():
    stream = PackedStream(TOKENS, block_size=10, micro_batch=4, seed=0)
    batch = next(stream)
    assert batch.inputs.dtype == torch.int64 and batch.inputs.shape == (4, 10)
    for x, y in zip(batch.inputs, batch.targets):
        assert torch.equal(x, torch.arange(x[0], x[0] + 10))
        assert torch.equal(y, x + 1)


def test_one_epoch_sees_every_training_token_once():
    bs, n = 10, num_blocks(len(TOKENS), 10)
    assert n == 100
    stream = PackedStream(TOKENS, block_size=bs, micro_batch=5, seed=1)
    targets = torch.cat([b.targets.reshape(-1) for b in take(stream, n // 5)])
    assert sorted(targets.tolist()) == list(range(1, 1001))  # each token predicted exactly once
    assert stream.epoch == 1.0


def test_order_is_seeded_and_changes_each_epoch():
    a = [block_of(r, 10) for b in take(PackedStream(TOKENS, 10, 10, seed=5), 20) for r in b.inputs]
    b = [block_of(r, 10) for b in take(PackedStream(TOKENS, 10, 10, seed=5), 20) for r in b.inputs]
    c = [block_of(r, 10) for b in take(PackedStream(TOKENS, 10, 10, seed=6), 20) for r in b.inputs]
    assert a == b and a != c
    assert a[:100] != a[100:] and sorted(a[:100]) == sorted(a[100:]) == list(range(100))
    # The documented rule: epoch e visits default_rng([seed, e]).permutation(n).
    assert a[100:] == np.random.default_rng([5, 1]).permutation(100).tolist()


@pytest.mark.parametrize("steps_before", [0, 3, 7, 33])
def test_resume_is_exact_even_across_epochs(steps_before):
    # 100 blocks, 3 per step: batches straddle epoch boundaries.
    stream = PackedStream(TOKENS, block_size=10, micro_batch=3, seed=2)
    take(stream, steps_before)
    state = stream.state_dict()
    expected = take(stream, 40)
    resumed = PackedStream(TOKENS, block_size=10, micro_batch=3, seed=999)
    resumed.load_state_dict(state)
    got = take(resumed, 40)
    assert all(torch.equal(x.inputs, y.inputs) for x, y in zip(expected, got))
    assert math.isclose(resumed.epoch, stream.epoch)


def test_ranks_are_disjoint_and_cover_the_epoch():
    world = 4
    streams = [PackedStream(TOKENS, 10, micro_batch=5, seed=3, rank=r, world_size=world) for r in range(world)]
    seen = []
    for _ in range(5):  # 5 steps x 4 ranks x 5 blocks = one epoch of 100 blocks
        for s in streams:
            seen.extend(block_of(row, 10) for row in next(s).inputs)
    assert sorted(seen) == list(range(100))
    assert all(s.epoch == 1.0 for s in streams)


def test_resume_with_another_world_size_continues_the_global_order():
    single = PackedStream(TOKENS, 10, micro_batch=4, seed=4)
    order = [block_of(r, 10) for b in take(single, 10) for r in b.inputs]
    first = PackedStream(TOKENS, 10, micro_batch=4, seed=4)
    take(first, 3)  # 12 blocks
    state = first.state_dict()
    pair = [PackedStream(TOKENS, 10, micro_batch=2, seed=0, rank=r, world_size=2) for r in range(2)]
    for s in pair:
        s.load_state_dict(state)
    got = []
    for _ in range(3):
        for s in pair:
            got.extend(block_of(r, 10) for r in next(s).inputs)
    assert got == order[12:24]


def test_bad_stream_arguments_and_states():
    with pytest.raises(HeadwiseError, match="fewer than one block"):
        PackedStream(np.arange(5), block_size=10, micro_batch=1, seed=0)
    with pytest.raises(HeadwiseError, match="rank 2 is outside"):
        PackedStream(TOKENS, 10, 1, 0, rank=2, world_size=2)
    stream = PackedStream(TOKENS, 10, 2, 0)
    other = PackedStream(TOKENS, 20, 2, 0).state_dict()
    with pytest.raises(HeadwiseError, match="resume with the same data"):
        stream.load_state_dict(other)
    with pytest.raises(HeadwiseError, match="not a packed one"):
        stream.load_state_dict({"kind": "nearest", "seed": 0, "step": 3})


@pytest.fixture
def fixture_cache(data_env, tmp_path):
    cfg = DataConfig(source="tinystories-tiny-fixture.txt", validation="tinystories-valid-sample.txt")
    return prepare(cfg, cache_dir=tmp_path)


def test_lm_task_interface(fixture_cache):
    task = LMTask(fixture_cache, block_size=32, eval_batches=3, eval_batch_size=4)
    assert task.shape() == TaskShape("tokens", "lm", 50257, 32)
    assert task.vocab_size == 50257 and task.seq_len == 32
    n = num_blocks(fixture_cache.num_tokens("train"), 32)
    assert task.tokens_per_epoch() == n * 32
    evals = task.eval_batches()
    assert len(evals) == 3 and all(b.inputs.shape == (4, 32) for b in evals)
    again = task.eval_batches()
    assert all(torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets) for a, b in zip(evals, again))
    # Evaluation blocks are spread over the whole validation set.
    valid = np.asarray(fixture_cache.tokens("valid"))
    last_block = num_blocks(len(valid), 32) - 1
    assert evals[-1].inputs[-1].tolist() == valid[last_block * 32:last_block * 32 + 32].tolist()
    info = task.describe()
    assert info["train_tokens"] == fixture_cache.num_tokens("train") and info["eval_tokens"] == 3 * 4 * 32
    assert task.tokenizer.decode(evals[0].inputs[0][:3].tolist())


def test_lm_loss_is_mean_cross_entropy(fixture_cache):
    task = LMTask(fixture_cache, block_size=8, eval_batches=1, eval_batch_size=2)
    batch = next(task.train_stream(2, seed=0))
    logits = torch.randn(2, 8, 50257)
    log_probs = torch.log_softmax(logits.double(), dim=-1)
    manual = -log_probs.gather(2, batch.targets[..., None]).mean()
    assert torch.allclose(task.loss(logits, batch.targets).double(), manual, atol=1e-5)
    uniform = task.loss(torch.zeros(2, 8, 50257), batch.targets)
    assert math.isclose(uniform.item(), math.log(50257), rel_tol=1e-5)


def test_lm_task_all_eval_blocks_and_too_small_data(fixture_cache):
    task = LMTask(fixture_cache, block_size=64, eval_batches=0, eval_batch_size=100)
    blocks = num_blocks(fixture_cache.num_tokens("valid"), 64)
    assert sum(len(b.inputs) for b in task.eval_batches()) == blocks
    with pytest.raises(HeadwiseError, match="training data .* fewer than one block"):
        LMTask(fixture_cache, block_size=5000)


def test_build_task_from_a_task_table(data_env, tmp_path):
    cfg = LMTaskConfig.parse(
        {"source": "tinystories-tiny-fixture.txt", "validation": "fraction:0.4", "block_size": 16,
         "tokenizer": "bpe:300", "cache_dir": str(tmp_path)}
    )
    task = build_task(cfg)
    assert isinstance(task, LMTask) and task.vocab_size == 300 and task.seq_len == 16
    assert task.cache.path.parent == tmp_path
    batch = next(task.train_stream(micro_batch=2, seed=0))
    assert int(batch.inputs.max()) < 300
