"""The nearest-neighbour task: labels against brute force, the baseline against Monte Carlo and
the note's values, the loss, seeded streams, and the exact one-head construction in a headwise
encoder reaching near-zero loss."""

import math

import numpy as np
import pytest
import torch

from headwise.errors import HeadwiseError
from headwise.families.nearest.task import NearestTaskConfig
from headwise.tasks.union import build_task, parse_task_config
from headwise.tasks.base import Batch
from headwise.families.nearest.nearest_task import NearestNeighbourTask, pick
from headwise.families.nearest.baseline import baseline_loss, expected_max_inner


def brute_farthest(points):
    """For each point, the other point with the smallest inner product, by plain loops."""
    out = []
    for sample in points.tolist():
        row = []
        for x in sample:
            dots = [sum(a * b for a, b in zip(x, y)) for y in sample]
            row.append(sample[min(range(len(sample)), key=lambda j: dots[j])])
        out.append(row)
    return torch.tensor(out)


def brute_nearest(queries, points):
    out = []
    for qs, ps in zip(queries.tolist(), points.tolist()):
        out.append([ps[max(range(len(ps)), key=lambda j: sum(a * b for a, b in zip(q, ps[j])))] for q in qs])
    return torch.tensor(out)


@pytest.mark.parametrize("dim, n", [(2, 2), (3, 5), (16, 8), (64, 16)])
def test_farthest_labels_match_brute_force(dim, n):
    task = NearestNeighbourTask(dim=dim, n_points=n, eval_batches=1, eval_batch_size=4)
    batch = next(task.train_stream(micro_batch=16, seed=7))
    assert batch.inputs.shape == (16, n, dim) and batch.inputs.dtype == torch.float32
    assert torch.allclose(batch.inputs.norm(dim=-1), torch.ones(16, n), atol=1e-5)
    assert torch.equal(batch.targets, brute_farthest(batch.inputs))
    # Never the point itself.
    assert not (batch.targets == batch.inputs).all(dim=-1).any()


def test_query_variant_layout_and_labels():
    task = NearestNeighbourTask(dim=6, n_points=5, variant="query-nearest", n_queries=3, eval_batch_size=2)
    assert task.seq_len == 8 and task.input_dim == 7
    batch = next(task.train_stream(micro_batch=10, seed=1))
    assert batch.inputs.shape == (10, 8, 7) and batch.targets.shape == (10, 3, 6)
    points, queries = batch.inputs[:, :5, :6], batch.inputs[:, 5:, :6]
    assert torch.equal(batch.inputs[:, :5, 6], torch.zeros(10, 5))
    assert torch.equal(batch.inputs[:, 5:, 6], torch.ones(10, 3))
    assert torch.equal(batch.targets, brute_nearest(queries, points))
    # The loss reads the first d coordinates of the query tokens only.
    outputs = torch.zeros(10, 8, 7)
    outputs[:, 5:, :6] = batch.targets
    outputs[:, :5] = 100.0
    outputs[:, 5:, 6] = 100.0
    assert task.loss(outputs, batch.targets).item() == 0.0


def monte_carlo_baseline(dim, n, samples=200_000, seed=0):
    """min over c of E||x_far + c x_i||^2, estimated from samples (independent of the closed form)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((samples // n, n, dim))
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    gram = x @ x.transpose(0, 2, 1)
    far = np.take_along_axis(x, gram.argmin(axis=2)[..., None], axis=1)
    m = -(far * x).sum(-1).mean()  # E<x_far, -x_i>
    # E||x_far + c x||^2 = 1 - 2 c m + c^2 is minimal at c = m.
    return float(((far + m * x) ** 2).sum(-1).mean())


@pytest.mark.parametrize("dim, n, note", [(16, 8, 0.89), (32, 16, 0.91), (64, 16, 0.95)])
def test_baseline_matches_the_note_and_monte_carlo(dim, n, note):
    value = baseline_loss(dim, n)
    assert abs(value - note) < 0.006
    assert abs(value - monte_carlo_baseline(dim, n)) < 0.005


def test_baseline_closed_forms():
    # d=3: <u, x> is uniform on [-1, 1]; the max of k uniforms has mean (k-1)/(k+1).
    for k in (1, 2, 3, 7):
        assert math.isclose(expected_max_inner(3, k), (k - 1) / (k + 1), abs_tol=1e-9)
    assert math.isclose(baseline_loss(5, 2), 1.0, abs_tol=1e-9)  # one other point: nothing to learn
    assert baseline_loss(8, 5, "query-nearest") < baseline_loss(8, 5)


def test_predicting_minus_c_x_scores_the_baseline():
    task = NearestNeighbourTask(dim=16, n_points=8, eval_batches=8, eval_batch_size=512)
    c = expected_max_inner(16, 7)
    losses = [task.loss(-c * b.inputs, b.targets).item() for b in task.eval_batches()]
    assert abs(np.mean(losses) - task.describe()["baseline_loss"]) < 0.01
    zeros = [task.loss(torch.zeros_like(b.inputs), b.targets).item() for b in task.eval_batches()]
    assert np.allclose(zeros, 1.0, atol=1e-5)


def test_loss_is_mean_over_tokens_of_summed_squares():
    task = NearestNeighbourTask(dim=4, n_points=3, eval_batch_size=2)
    out, tgt = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    manual = sum(((out[b, i] - tgt[b, i]) ** 2).sum() for b in range(2) for i in range(3)) / 6
    assert torch.allclose(task.loss(out, tgt), manual)


def test_streams_are_seeded_resumable_and_differ_by_rank():
    task = NearestNeighbourTask(dim=8, n_points=4, eval_batch_size=2)
    a = task.train_stream(4, seed=3)
    first = [next(a) for _ in range(5)]
    state = a.state_dict()
    rest = [next(a) for _ in range(3)]
    b = task.train_stream(4, seed=0)
    b.load_state_dict(state)
    assert all(torch.equal(x.inputs, y.inputs) for x, y in zip(rest, [next(b) for _ in range(3)]))
    again = task.train_stream(4, seed=3)
    assert torch.equal(next(again).inputs, first[0].inputs)
    assert not torch.equal(first[0].inputs, first[1].inputs)  # fresh every step
    other_rank = task.train_stream(4, seed=3, rank=1, world_size=2)
    assert not torch.equal(next(other_rank).inputs, first[0].inputs)
    assert a.epoch == 0.0 and task.tokens_per_epoch() is None and task.vocab_size is None
    with pytest.raises(HeadwiseError, match="not a nearest-neighbour one"):
        b.load_state_dict({"kind": "packed"})


def test_eval_batches_are_fixed_and_apart_from_training():
    task = NearestNeighbourTask(dim=8, n_points=4, eval_batches=2, eval_batch_size=3)
    same = NearestNeighbourTask(dim=8, n_points=4, eval_batches=2, eval_batch_size=3)
    assert all(torch.equal(x.inputs, y.inputs) for x, y in zip(task.eval_batches(), same.eval_batches()))
    assert len(task.eval_batches()) == 2
    train = next(task.train_stream(3, seed=1234))
    assert not torch.equal(train.inputs, task.eval_batches()[0].inputs)


def test_config_and_bad_input():
    task = build_task(parse_task_config({"kind": "nearest", "dim": 32, "n_points": 16}))
    assert isinstance(task, NearestNeighbourTask)
    assert task.describe()["baseline_loss"] == pytest.approx(0.907, abs=0.001)
    assert NearestTaskConfig().dim == 16
    with pytest.raises(HeadwiseError, match="did you mean 'n_points'"):
        parse_task_config({"kind": "nearest", "npoints": 3})
    with pytest.raises(HeadwiseError, match="n_queries applies only"):
        parse_task_config({"kind": "nearest", "n_queries": 3})
    with pytest.raises(HeadwiseError, match="variant"):
        NearestNeighbourTask(variant="closest")
    with pytest.raises(HeadwiseError, match="dim >= 2"):
        NearestNeighbourTask(dim=1)


# --- the exact construction in a headwise encoder ---------------------------------------------


def construction_model(d_model, seq_len, w_q, w_k, w_v):
    """A one-layer, one full-rank-head headwise encoder (post unit-norm, no positions, MLP off)
    with the given query, key and value maps and an identity output map."""
    from headwise.model import Transformer
    from headwise.spec import ModelSpec

    spec = ModelSpec(
        vocab_size=None, d_model=d_model, n_layers=1, max_seq_len=seq_len, heads=[1], head_dim=d_model,
        causal=False, positions="none", norm="unitnorm_post", activation="relu", score_scale="none",
        mlp_hidden=8,
    )
    model = Transformer(spec)
    block = model.blocks[0]
    with torch.no_grad():
        block.attn.qkv.weight.copy_(torch.cat([w_q, w_k, w_v]))
        block.attn.out.weight.copy_(torch.eye(d_model))
        block.attn.out.bias.zero_()
        for p in block.mlp.parameters():
            p.zero_()
    return model.eval()


def test_one_head_construction_reaches_near_zero_loss():
    """W_Q W_K^T = -c I makes the softmax pick the farthest point; W_V W_O = k I with k large
    makes the post-norm residual normalize(x_i + k x_far) ~ x_far (unit norm, scale 1)."""
    d, n, c, k = 16, 8, 1e4, 1000.0
    task = NearestNeighbourTask(dim=d, n_points=n, eval_batches=2, eval_batch_size=256)
    eye = torch.eye(d)
    model = construction_model(d, n, math.sqrt(c) * eye, -math.sqrt(c) * eye, k * eye)
    with torch.no_grad():
        losses = [task.loss(model(b.inputs), b.targets).item() for b in task.eval_batches()]
    assert max(losses) < 1e-3 < task.describe()["baseline_loss"]
    # The same head with a small c only averages: far from the target.
    soft = construction_model(d, n, eye, -eye, k * eye)
    with torch.no_grad():
        assert task.loss(soft(task.eval_batches()[0].inputs), task.eval_batches()[0].targets).item() > 0.1


def test_one_head_construction_for_the_query_variant():
    """Scores c<y, x_j> - a f_i f_j (f: the query flag) keep queries on the points; the value map
    copies x, and the loss reads the query tokens' first d coordinates."""
    d, n, q, c, a, k = 12, 8, 5, 1e4, 3e4, 1000.0
    task = NearestNeighbourTask(
        dim=d, n_points=n, variant="query-nearest", n_queries=q, eval_batches=2, eval_batch_size=128
    )
    w_q = torch.diag(torch.tensor([math.sqrt(c)] * d + [math.sqrt(a)]))
    w_k = torch.diag(torch.tensor([math.sqrt(c)] * d + [-math.sqrt(a)]))
    w_v = torch.diag(torch.tensor([k] * d + [0.0]))
    model = construction_model(d + 1, n + q, w_q, w_k, w_v)
    with torch.no_grad():
        losses = [task.loss(model(b.inputs), b.targets).item() for b in task.eval_batches()]
    assert max(losses) < 1e-3 < task.describe()["baseline_loss"]


def test_pick_by_hand():
    # two points on the axes; outputs pointing at e1 and e0 pick points 1 and 0
    inputs = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    targets = torch.tensor([[[0.0, 1.0], [0.0, 1.0]]])  # both tokens' target is point 1
    outputs = torch.tensor([[[0.1, 0.9], [0.8, 0.2]]])
    chosen, truth = pick(outputs, inputs, targets)
    assert chosen.tolist() == [[1, 0]] and truth.tolist() == [[1, 1]]
    task = NearestNeighbourTask(dim=2, n_points=2, eval_batches=1, eval_batch_size=1)
    assert task.metrics(outputs, Batch(inputs, targets))["pick_accuracy"].item() == 0.5
    # query-nearest: the candidates are the tokens before the queries, the last coordinate dropped
    q_inputs = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.9, 0.1, 1.0]]])
    q_targets = torch.tensor([[[1.0, 0.0]]])
    chosen, truth = pick(torch.tensor([[[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.2, 0.7, 5.0]]]), q_inputs, q_targets)
    assert chosen.tolist() == [[1]] and truth.tolist() == [[0]]
