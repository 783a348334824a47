"""Subsets and validation sets: first/random K, seeded hold-outs by story, splits, files."""

import numpy as np
import pytest

from headwise.text.data_plan import DEFAULT_HOLDOUT, DataConfig, Holdout, parse_validation, plan_data
from headwise.errors import HeadwiseError
from test_data_sources import (  # noqa: F401
    STORIES,
    data_env,
    hf_datasets_cache,
    hub_layout_roneneldan,
    hub_layout_skeskinen,
    write_stories_txt,
)


def numbered(tmp_path, n=400, name="many.txt"):
    stories = [f"Story number {i}." for i in range(n)]
    return write_stories_txt(tmp_path / name, stories), stories


def roles(plan):
    out = {"train": [], "valid": []}
    for role, text in plan.documents():
        out[role].append(text)
    return out


def test_holdout_is_seeded_by_story_and_disjoint(tmp_path):
    path, stories = numbered(tmp_path)
    plan = plan_data(DataConfig(source=str(path), validation="fraction:0.1", seed=3))
    got = roles(plan)
    assert set(got["train"]).isdisjoint(got["valid"])
    assert sorted(got["train"] + got["valid"]) == sorted(stories)
    assert 20 <= len(got["valid"]) <= 60
    # The same flags from an independent reading of the documented rule.
    flags = np.random.default_rng([3, 1, 0]).random(1 << 16)[:400] < 0.1
    assert got["valid"] == [s for s, f in zip(stories, flags) if f]
    assert roles(plan) == got  # every pass is the same
    other = roles(plan_data(DataConfig(source=str(path), validation="fraction:0.1", seed=4)))
    assert other["valid"] != got["valid"]
    assert list(plan.train_documents()) == got["train"]


def test_auto_validation_of_a_local_file_is_a_holdout(tmp_path):
    path, _ = numbered(tmp_path)
    plan = plan_data(DataConfig(source=str(path)))
    assert plan.valid is None and plan.holdout == Holdout(DEFAULT_HOLDOUT)


def test_first_k_subset(tmp_path):
    path, stories = numbered(tmp_path)
    plan = plan_data(DataConfig(source=str(path), subset=50, validation="fraction:0.2"))
    got = roles(plan)
    assert len(got["train"]) == 50
    # The first 50 stories that are not held out, in order; held-out ones seen on the way.
    flags = np.random.default_rng([0, 1, 0]).random(1 << 16)[:400] < 0.2
    train_order = [s for s, f in zip(stories, flags) if not f]
    assert got["train"] == train_order[:50]
    last = stories.index(got["train"][-1])
    assert got["valid"] == [s for s, f in zip(stories[:last], flags[:last]) if f]


def test_random_k_subset_is_seeded(tmp_path):
    path, stories = numbered(tmp_path, name="r.txt")
    cfg = dict(source=str(path), subset=60, subset_order="random", validation="fraction:0.1")
    a = roles(plan_data(DataConfig(**cfg, seed=1)))
    b = roles(plan_data(DataConfig(**cfg, seed=1)))
    c = roles(plan_data(DataConfig(**cfg, seed=2)))
    assert a == b and a["train"] != c["train"]
    assert len(a["train"]) == 60 and len(set(a["train"])) == 60
    assert set(a["train"]).isdisjoint(a["valid"])
    assert a["train"] == sorted(a["train"], key=stories.index)  # source order kept
    assert a["train"] != stories[:60]  # not just the first ones
    # Every held-out story of the whole source is in validation.
    flags = np.random.default_rng([1, 1, 0]).random(1 << 16)[:400] < 0.1
    assert a["valid"] == [s for s, f in zip(stories, flags) if f]


@pytest.mark.parametrize("order", ["first", "random"])
def test_subset_larger_than_the_source(tmp_path, order):
    path = write_stories_txt(tmp_path / "s.txt", STORIES)
    plan = plan_data(DataConfig(source=str(path), subset=4, subset_order=order, validation="fraction:0.01"))
    with pytest.raises(HeadwiseError, match="subset 4 is larger than the source: .* has only 3 training stories"):
        roles(plan)


def test_separate_validation_file(data_env):
    plan = plan_data(DataConfig(source="tinystories-tiny-fixture.txt", validation="tinystories-valid-sample.txt"))
    assert plan.holdout is None and plan.valid.kind == "stream"
    got = roles(plan)
    assert len(got["train"]) == 5 and len(got["valid"]) == 1


def test_validation_that_is_the_training_data_is_refused(data_env):
    with pytest.raises(HeadwiseError, match="is the training data itself"):
        plan_data(DataConfig(source="tinystories-tiny-fixture.txt", validation="tinystories-tiny-fixture.txt"))


def test_a_stream_cannot_be_held_out(data_env):
    with pytest.raises(HeadwiseError, match="one text stream"):
        plan_data(DataConfig(source="tinystories-valid-sample.txt"))


def test_split_validation_needs_a_hub_dataset(tmp_path):
    path, _ = numbered(tmp_path)
    with pytest.raises(HeadwiseError, match="needs a hub dataset"):
        plan_data(DataConfig(source=str(path), validation="split:validation"))


def test_hub_validation_split_is_used_automatically(tmp_path):
    root = hub_layout_roneneldan(tmp_path / "TinyStories")
    plan = plan_data(DataConfig(source=str(root), format="hub"))
    assert plan.valid is not None and plan.valid.split == "validation" and plan.holdout is None
    assert roles(plan) == {"train": STORIES, "valid": ["A held-out story."]}
    same = plan_data(DataConfig(source=str(root), format="hub", validation="split:validation"))
    assert same.request() == plan.request()
    with pytest.raises(HeadwiseError, match="is the training split"):
        plan_data(DataConfig(source=str(root), format="hub", validation="split:train"))


def test_train_only_hub_dataset_gets_a_holdout(tmp_path):
    root = hub_layout_skeskinen(tmp_path / "TinyStories-GPT4")
    plan = plan_data(DataConfig(source=str(root), format="hub", validation="fraction:0.5", seed=1))
    assert plan.valid is None and plan.holdout == Holdout(0.5)
    got = roles(plan)
    assert sorted(got["train"] + got["valid"]) == sorted(STORIES)
    with pytest.raises(HeadwiseError, match="has no split 'test'"):
        plan_data(DataConfig(source=str(root), format="hub", validation="split:test"))


def test_parts_of_a_holdout_are_disjoint_bands_and_train_on_the_same_stories(tmp_path):
    path, stories = numbered(tmp_path, n=600)
    whole = roles(plan_data(DataConfig(source=str(path), validation="fraction:0.2", seed=5)))
    first = roles(plan_data(DataConfig(source=str(path), validation="fraction:0.2:1/2", seed=5)))
    second = roles(plan_data(DataConfig(source=str(path), validation="fraction:0.2:2/2", seed=5)))
    # both parts train on exactly what the whole hold-out trains on
    assert first["train"] == second["train"] == whole["train"]
    assert set(first["valid"]).isdisjoint(second["valid"])
    assert sorted(first["valid"] + second["valid"]) == sorted(whole["valid"])
    # the documented bands of the draws: [0, 0.1) and [0.1, 0.2)
    draws = np.random.default_rng([5, 1, 0]).random(1 << 16)[:600]
    assert first["valid"] == [s for s, d in zip(stories, draws) if d < 0.1]
    assert second["valid"] == [s for s, d in zip(stories, draws) if 0.1 <= d < 0.2]
    assert 30 <= len(first["valid"]) <= 90 and 30 <= len(second["valid"]) <= 90
    # a random subset never takes a story of the other part
    sub = roles(plan_data(DataConfig(source=str(path), validation="fraction:0.2:2/2", seed=5, subset=100,
                                     subset_order="random")))
    assert set(sub["train"]).isdisjoint(first["valid"]) and sub["valid"] == second["valid"]


def test_a_part_names_its_cache_and_a_whole_holdout_keeps_its_key(tmp_path):
    path, _ = numbered(tmp_path)
    whole = plan_data(DataConfig(source=str(path), validation="fraction:0.1", seed=2))
    part = plan_data(DataConfig(source=str(path), validation="fraction:0.1:1/2", seed=2))
    assert whole.request()["validation"] == {"holdout": 0.1, "seed": 2}
    assert part.request()["validation"] == {"holdout": 0.1, "part": [1, 2], "seed": 2}
    assert "part 1 of 2 of a seeded 0.1 hold-out" in part.describe()


@pytest.mark.parametrize("value", ["fraction:0", "fraction:1", "fraction:x", "split:", "", "fraction:0.1:3/2",
                                   "fraction:0.1:0/2", "fraction:0.1:1", "fraction:0.1:a/b"])
def test_bad_validation_values(value):
    with pytest.raises(HeadwiseError):
        parse_validation(value)
    with pytest.raises(HeadwiseError, match="validation"):
        DataConfig.parse({"validation": value})


def test_a_number_for_validation_names_the_fraction_spec():
    with pytest.raises(HeadwiseError, match="validation: a number is not a validation spec: .* written 'fraction:0.1'"):
        DataConfig.parse({"validation": 0.1})


def test_config_errors_are_one_line():
    with pytest.raises(HeadwiseError, match="did you mean 'subset'"):
        DataConfig.parse({"subsett": 3})
    with pytest.raises(HeadwiseError, match="subset"):
        DataConfig.parse({"subset": 0})
    with pytest.raises(HeadwiseError, match="too small"):
        DataConfig.parse({"tokenizer": "bpe:200"})
