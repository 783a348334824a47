"""Generation: KV-cache decoding equals recomputing from scratch, and the sampling filters."""

from __future__ import annotations

import pytest
import torch

from headwise.errors import HeadwiseError
from headwise.model import Transformer
from headwise.spec import ModelSpec
from headwise.families.nearest.nearest_task import NearestNeighbourTask
from headwise.train.generate import filter_logits, generate, held_out_predictions, next_token

INF = float("-inf")


def _model(**overrides) -> Transformer:
    torch.manual_seed(0)
    # a large init makes logits far apart, so argmax is decided well above float noise
    fields = dict(vocab_size=50, d_model=32, n_layers=2, heads=[4, 2], max_seq_len=12, init_std=0.3)
    return Transformer(ModelSpec(**{**fields, **overrides})).eval()


def _greedy_reference(model: Transformer, prompt: list[int], n: int) -> list[int]:
    """Greedy decoding the plain way: the whole (last max_seq_len) context every step."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids[-model.spec.max_seq_len:]]))
            ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt):]


@pytest.mark.parametrize("overrides", [
    {},
    {"attention": ["local", "global"], "window": 4, "max_seq_len": 16},
    {"score_scale": "inv_sqrt", "positions": "none", "max_seq_len": 10},
    # Llama-style: per-layer KV heads (the cache holds those alone), RoPE (half the channels), q/k norms
    {"kv_heads": [2, 1], "positions": "rope", "partial_rotary_factor": 0.5, "norm": "rmsnorm_pre",
     "activation": "swiglu", "qk_norm": "rmsnorm", "attention": ["local", "global"], "window": 4, "max_seq_len": 16},
])
def test_greedy_with_and_without_cache_is_identical(overrides):
    model = _model(**overrides)
    prompt = [3, 14, 15, 9]
    # 30 new tokens run well past max_seq_len, where the cached path falls back to recomputing
    expected = _greedy_reference(model, prompt, 30)
    cached = generate(model, prompt, 30, temperature=0)
    uncached = generate(model, prompt, 30, temperature=0, use_cache=False)
    assert cached == uncached == expected
    assert len(set(expected)) > 3  # not a degenerate repetition


def test_a_prompt_longer_than_the_context_keeps_its_end():
    model = _model()
    prompt = list(range(20))
    assert generate(model, prompt, 5, temperature=0) == _greedy_reference(model, prompt[-12:], 5)


def test_filters_by_hand():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    assert filter_logits(logits, top_k=2).tolist() == [2.0, 1.0, INF, INF]
    # probabilities 0.644, 0.237, 0.087, 0.032: the nucleus of 0.5 is the first token, of 0.85
    # the first two, of 0.9 the first three
    assert filter_logits(logits, top_p=0.5).tolist() == [2.0, INF, INF, INF]
    assert filter_logits(logits, top_p=0.85).tolist() == [2.0, 1.0, INF, INF]
    assert filter_logits(logits, top_p=0.9).tolist() == [2.0, 1.0, 0.0, INF]
    # the order of the vocabulary does not matter
    assert filter_logits(logits.flip(0), top_p=0.85).tolist() == [INF, INF, 1.0, 2.0]
    assert filter_logits(logits, top_k=10, top_p=1.0).tolist() == logits.tolist()


@pytest.mark.parametrize("temperature, expected", [(1.0, [0.5, 0.3, 0.2]), (0.5, [0.25 / 0.38, 0.09 / 0.38, 0.04 / 0.38])])
def test_sampling_follows_the_tempered_distribution(temperature, expected):
    logits = torch.tensor([0.5, 0.3, 0.2]).log()
    g = torch.Generator().manual_seed(0)
    draws = torch.tensor([next_token(logits, temperature, None, None, g) for _ in range(4000)])
    freq = torch.bincount(draws, minlength=3).float() / len(draws)
    assert freq.tolist() == pytest.approx(expected, abs=0.03)


def test_seeded_sampling_is_reproducible():
    model = _model()
    a = generate(model, [1, 2], 20, temperature=0.9, top_k=20, top_p=0.95, seed=7)
    assert a == generate(model, [1, 2], 20, temperature=0.9, top_k=20, top_p=0.95, seed=7)
    assert a == generate(model, [1, 2], 20, temperature=0.9, top_k=20, top_p=0.95, seed=7, use_cache=False)
    assert a != generate(model, [1, 2], 20, temperature=0.9, top_k=20, top_p=0.95, seed=8)


def test_stops_at_the_stop_token_and_refuses_bad_input():
    model = _model()
    first = generate(model, [1, 2], 1, temperature=0)[0]
    assert generate(model, [1, 2], 10, temperature=0, stop_id=first) == [first]
    with pytest.raises(HeadwiseError, match="prompt is empty"):
        generate(model, [], 3)
    with pytest.raises(HeadwiseError, match="top_p"):
        generate(model, [1], 3, top_p=1.5)
    vectors = Transformer(ModelSpec(vocab_size=None, d_model=8, n_layers=1, heads=[1], max_seq_len=4))
    with pytest.raises(HeadwiseError, match="takes vectors"):
        generate(vectors, [1], 3)
    # a vector model shorter than the task's samples: one clear line, not the model's own error
    task = NearestNeighbourTask(dim=8, n_points=6, eval_batches=1, eval_batch_size=2)
    with pytest.raises(HeadwiseError, match="cannot read the task's samples: sequence of 6 positions"):
        held_out_predictions(vectors, task, task.eval_batches()[0])
