"""The ``timm-overhead`` section of ``headwise bench``: headwise's side is the trainer's own loop (a
sample is one log interval of real steps), both sides take the same first step (the same loss, the
same weights after it), the rates and the overhead follow from the timed seconds, and the report
and the refusal without timm."""

import math
import statistics

import pytest
import torch

from headwise.bench.core import QUIET_STALL
from headwise.bench.report import evaluate_targets
from headwise.bench.sections import SuiteRun, default_section_names, section_names
from headwise.bench.settings import BenchConfig
from headwise.errors import HeadwiseError
from headwise.families.vision import bench_timm_overhead as bo
from headwise.families.vision.formats import read_idx
from headwise.families.vision.timm_models import timm_unavailable
from headwise.run import read_metrics
from helpers import one_thread  # noqa: F401  (autouse: one torch thread)

pytestmark = pytest.mark.skipif(timm_unavailable() is not None, reason=f"the section needs timm: {timm_unavailable()}")

TINY_MODELS = {
    "deit": {"name": "deit_tiny_patch16_224", "depth": 1, "heads": 2, "embed_dim": 16, "patch_size": 4},
    "xcit": {"name": "xcit_nano_12_p16_224", "depth": 1, "heads": 2, "embed_dim": 16, "head_dim": 4,
             "patch_size": 8},
}
TINY = bo.OverheadSizes(image_size=16, batch=4, steps=3, train_images=24, rounds=2, warmup=1, idle_wait=0.0)


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(bo, "MODELS", TINY_MODELS)


def test_the_section_is_opt_in_among_the_families_and_quick_is_smaller():
    names = section_names()
    assert names.index("vision") < names.index("timm-overhead") < names.index("gpu")
    assert "timm-overhead" not in default_section_names()
    quick, full = bo.OverheadSizes.of(BenchConfig.quick_config()), bo.OverheadSizes.of(BenchConfig())
    assert (quick.rounds, full.rounds) == (3, 5) and quick.batch * quick.steps < full.batch * full.steps


def test_the_images_are_an_idx_folder(tmp_path):
    bo.write_images(tmp_path, TINY)
    images, labels = read_idx(tmp_path / "train-images-idx3-ubyte"), read_idx(tmp_path / "train-labels-idx1-ubyte")
    assert images.shape == (24, 16, 16) and labels.shape == (24,) and labels.max() < bo.CLASSES
    assert read_idx(tmp_path / "t10k-images-idx3-ubyte").shape == (bo.TEST_IMAGES, 16, 16)


def test_a_sample_is_one_log_interval_of_the_trainers_loop(tmp_path, tiny):
    bo.write_images(tmp_path, TINY)
    side = bo.TrainerSide(bo.run_config(TINY_MODELS["deit"], tmp_path, TINY, torch.device("cpu")), tmp_path / "run")
    try:
        first = side.first_loss()
        sample = side.interval()
        sample()
        sample()
        t = side.trainer
        assert t.step == 2 * TINY.steps and t.tokens == 2 * TINY.steps * TINY.batch
        # a constant learning rate: the plain loop has no schedule
        assert t.scheduler.get_last_lr() == [t.cfg.optim.lr] * 2  # both parameter groups
    finally:
        side.close()
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, TINY.steps, 2 * TINY.steps] and rows[0]["train_loss"] == first


def _used_rounds(a: dict, b: dict) -> list[int]:
    quiet = [i for i, (x, y) in enumerate(zip(a["cpu_stall"], b["cpu_stall"]))
             if (x is None or x < QUIET_STALL) and (y is None or y < QUIET_STALL)]
    return quiet if len(quiet) >= 2 else list(range(len(a["seconds"])))


def test_both_sides_take_the_same_first_step_and_the_overhead_follows_from_the_seconds(tiny):
    logged = []
    part = bo.bench_timm_overhead(TINY, torch.device("cpu"), logged.append)
    assert [m["model"] for m in part["models"]] == ["deit", "xcit"]
    for m in part["models"]:
        loss = m["first_loss"]
        # 10 random classes at a fresh head: about ln 10; the trainer's loss is the plain one's
        assert abs(loss["plain"] - math.log(10)) < 0.5 and abs(loss["headwise"] - loss["plain"]) <= 1e-6
        assert m["weight_difference"]["built"] == 0.0 and m["weight_difference"]["after_first_step"] <= 1e-6
        cases = m["cases"]
        assert set(cases) == {"plain", "headwise", "headwise fixed batch"}
        for case in cases.values():
            assert len(case["seconds"]) == TINY.rounds
            assert case["images_per_s"] == pytest.approx([TINY.batch * TINY.steps / s for s in case["seconds"]])
        for name, key in (("headwise", "overhead"), ("headwise fixed batch", "overhead_fixed_batch")):
            ours, plain = cases[name]["seconds"], cases["plain"]["seconds"]
            used = _used_rounds(cases[name], cases["plain"])
            assert m[key]["overhead"] == pytest.approx(statistics.median(ours[i] / plain[i] for i in used) - 1)
    assert any("round 2/2: headwise fixed batch" in line for line in logged)
    [deit, xcit] = evaluate_targets({"timm_overhead": part})
    assert deit["goal"] == "<= 3%" and deit["met"] == (part["models"][0]["overhead"]["overhead"] <= 0.03)
    table = "\n".join(bo.timm_overhead_table({"timm_overhead": part}))
    assert "| xcit (xcit_nano_12_p16_224) |" in table and f"{loss['plain']:.6f} / {loss['headwise']:.6f}" in table


def test_a_different_seed_is_a_different_model(tmp_path, tiny):
    # the weight check can fail: the plain side built from another seed differs from the trainer's
    bo.write_images(tmp_path, TINY)
    side = bo.TrainerSide(bo.run_config(TINY_MODELS["xcit"], tmp_path, TINY, torch.device("cpu")), tmp_path / "run")
    try:
        assert bo.max_difference(bo.plain_side(side, TINY.seed)[0], side.trainer.model) == 0.0
        assert bo.max_difference(bo.plain_side(side, TINY.seed + 1)[0], side.trainer.model) > 1e-3
    finally:
        side.close()


def test_without_timm_the_section_is_skipped_with_the_reason_or_refused_alone(monkeypatch):
    monkeypatch.setattr(bo, "timm_unavailable", lambda: "timm is not installed (pip install 'headwise[vision]')")

    def run(sections):
        run = SuiteRun(BenchConfig.quick_config(), frozenset(sections), {"load": {}}, lambda msg: None)
        bo.measure_timm_overhead(run)
        return run.result

    with pytest.raises(HeadwiseError, match="section 'timm-overhead' cannot run: timm is not installed"):
        run({"timm-overhead"})
    result = run({"timm-overhead", "vision"})
    assert result["timm_overhead"] == {"skipped": "timm is not installed (pip install 'headwise[vision]')"}
    assert evaluate_targets({"timm_overhead": result["timm_overhead"]}) == []
    assert "skipped: timm is not installed" in "\n".join(bo.timm_overhead_table(result))


def test_the_plain_step_is_cross_entropy_clipping_and_adamw():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 4)
    reference = torch.nn.Linear(3, 4)
    reference.load_state_dict(model.state_dict())
    x, y = torch.randn(5, 3), torch.tensor([0, 1, 2, 3, 0])
    step = bo.plain_step(model, torch.optim.AdamW(model.parameters(), lr=0.1), x, y, clip=0.5)
    loss = step()
    # by hand: the loss, the gradient clipped to norm 0.5, one AdamW step (its first moves each
    # weight by lr * sign(g) after decay, since m / sqrt(v) = g / |g|)
    logits = reference(x)
    expected = -torch.log_softmax(logits, -1)[torch.arange(5), y].mean()
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
    expected.backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        moved = q.detach() * (1 - 0.1 * 0.01) - 0.1 * torch.sign(q.grad)
        assert torch.allclose(p.detach(), moved, atol=1e-5)
        assert p.grad is None
