"""The trainer -> study contract: a typed RunSummary that round-trips through summary.json, reads
the older layout, refuses renamed fields, and exists before a run has trained a step."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from headwise.plans import Plan, Scheme, plan_heads
from headwise.run import RunDir, RunStatus, RunSummary, read_summary, write_summary
from headwise.train.distributed import DistContext
from headwise.train.trainer import Trainer
from test_train_synthetic import SyntheticLM, tiny_config


def _summary(**over) -> RunSummary:
    fields = dict(status=RunStatus.COMPLETED, final_eval_loss=1.25, last_eval_loss=1.25, params=26816, d_model=32,
                  plan=plan_heads("descending", 2, 32, 6), steps=12, tokens=768, task={"tokenizer": "bpe:1024"})
    return RunSummary(**{**fields, **over})


def test_summary_round_trips_through_its_file(tmp_path):
    summary = _summary(mfu=0.31, peak_memory_bytes=123456789, error=None)
    write_summary(tmp_path, summary)
    assert RunDir(tmp_path).summary.is_file()
    back = read_summary(tmp_path)
    assert back == summary
    assert back.status is RunStatus.COMPLETED and back.plan.scheme is Scheme.DESCENDING
    assert back.heads == (4, 2) and back.head_dims == (8, 16) and back.total_heads == 6 and back.n_layers == 2


def test_init_from_is_written_only_by_fine_tuning_runs():
    """Other runs' summary.json keeps its keys (no "init_from": null); a fine-tuning run's round-trips."""
    assert "init_from" not in json.loads(_summary().to_json())
    tuned = _summary(init_from={"run": "runs/mlm", "checkpoint": None})
    assert RunSummary.from_json(tuned.to_json()) == tuned


def test_summary_json_keeps_the_plan_typed_and_named():
    data = json.loads(_summary().to_json())
    assert data["status"] == "completed"
    assert data["plan"] == {"scheme": "descending", "heads": [4, 2], "head_dims": [8, 16], "total": 6,
                            "requested_total": 6, "ratio": 2.0, "notes": []}


def test_a_renamed_or_unknown_field_is_refused():
    data = json.loads(_summary().to_json())
    data["eval_loss"] = data.pop("final_eval_loss")
    with pytest.raises(ValidationError, match="eval_loss"):
        RunSummary.model_validate(data)
    with pytest.raises(ValidationError, match="status"):
        RunSummary.model_validate({**json.loads(_summary().to_json()), "status": "finished"})


def test_summaries_of_the_older_layout_still_read(tmp_path):
    old = {"status": "completed", "final_eval_loss": 2.0, "params": 10, "heads": [4, 2], "head_dims": [8, 16],
           "total_heads": 6, "plan": {"scheme": "descending", "requested_total": 6, "total": 6, "notes": []}}
    RunDir(tmp_path).summary.write_text(json.dumps(old))
    s = read_summary(tmp_path)
    assert s.plan == Plan.of(Scheme.DESCENDING, (4, 2), (8, 16), requested_total=6)
    no_plan = {**old, "plan": None}
    assert RunSummary.model_validate(no_plan).plan == Plan.explicit((4, 2), (8, 16))


def test_unreadable_summary_reads_as_none(tmp_path):
    assert read_summary(tmp_path) is None
    RunDir(tmp_path).summary.write_text('{"status": "compl')  # torn mid-write
    assert read_summary(tmp_path) is None


def test_trainer_has_a_summary_before_it_runs(tmp_path):
    cfg = tiny_config(steps=3)
    trainer = Trainer(cfg, tmp_path / "run", DistContext(), resume=False, overwrite=False, task=SyntheticLM())
    s = trainer.summary()
    assert s.status is RunStatus.PENDING and s.steps == 0 and s.tokens == 0 and s.tokens_per_s is None
    assert s.total_steps == 3 and s.plan.heads == (4, 2) and s.final_eval_loss is None
