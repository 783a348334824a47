"""benchmarks/gpu_check.py at a tiny size on the CPU: every family's model trains, the references
are built, and the JSON and markdown are written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_runs_tiny_on_cpu(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--tiny",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    names = [m["model"] for m in result["models"]]
    for family in ("GPT-Neo", "llama", "OpenELM", "crammed-bert", "ViT-B", "ListOps", "Text", "Pathfinder"):
        assert any(family in n for n in names), family
    for m in result["models"]:
        rate = m["headwise"][f"{m['unit']}_per_s"]
        assert rate > 0 and m["headwise"]["mfu"] is None  # no datasheet peak on a CPU
        if "OpenELM" in m["model"] or "LRA" in m["model"]:
            assert "skipped" in m["hf"]
        else:  # a transformers reference at the same shape
            assert "skipped" not in m["hf"], m["hf"]
            assert m["headwise_over_hf"] > 0
    assert result["logits"]["max_abs_diff"] == 0.0 and result["logits"]["ok"]
    md = (tmp_path / "gpu_check.md").read_text()
    assert "| ViT-B/16 |" in md and "llama-tiny" in md


def test_gpu_check_refuses_without_cuda(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "CUDA is not available" in proc.stderr
    assert not (tmp_path / "gpu_check.json").exists()
