"""The ``timm-tables`` report layout (Leaner Transformers' Tables 4-5 on timm) from fake run folders
of the ``leaner-timm`` study: each pair's accuracies, parameter ratio and paired difference against
hand-computed values, the paper's rows beside them, the declared claims' verdicts, a variant
without a paper row, and the refusal of a pair that names no variant."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import tomli_w

from headwise.cli import main
from headwise.config import read_toml
from headwise.families.vision.timm_presets import timm_preset
from headwise.plans import plan_heads
from headwise.report import write_report
from headwise.run import RunStatus, RunSummary
from headwise.study import load_study
from headwise.study.definition import load_study_file
from headwise.study.layout import STUDY_TOML, run_dir, save_study

from helpers import read_csv, write_run_dir

# top-1 (%) per seed and parameters, by variant
TOP1 = {"deit-b": [85.0, 86.0, 84.0], "deit-b-reduced": [85.5, 86.7, 84.3],
        "xcit-m": [80.0, 81.0, 82.0], "xcit-m-reduced": [79.0, 80.5, 81.0]}
PARAMS = {"deit-b": 1_000_000, "deit-b-reduced": 460_000, "xcit-m": 800_000, "xcit-m-reduced": 560_000}
T_975_2 = 4.302653  # Student's t, 97.5% quantile, 2 degrees of freedom (printed tables)


def fill(out: Path, study, seeds: int, params: dict[str, int] = PARAMS) -> None:
    """Completed runs of ``study`` whose top-1 at seed s is TOP1[variant][s] (by the variant's
    architecture and role where it is renamed), with ``params`` parameters."""
    save_study(study, out, seeds)
    for v in study.variants:
        timm = v.config["model"]["timm"]
        d_model = timm["embed_dim"]
        key = next(k for k in sorted(TOP1, key=len, reverse=True) if v.name.replace("tiny", "b").startswith(k))
        plan = plan_heads("explicit", timm["depth"], d_model, heads=[timm["heads"]] * timm["depth"], head_dim=8)
        for seed in range(seeds):
            acc = TOP1[key][seed] / 100
            summary = RunSummary(
                status=RunStatus.COMPLETED, final_eval_loss=1 - acc, last_eval_loss=1 - acc,
                eval_metrics={"accuracy": acc}, params=params[key], d_model=d_model, plan=plan, unit="images",
                steps=469, tokens=60_032, tokens_per_step=128, device="cpu", train_time_s=30.0, wall_time_s=35.0,
                tokens_per_s=2000.0, peak_memory_bytes=300 * 2**20,
                task={"task": "images", "data": "fashion-mnist (IDX)", "classes": 10, "image_size": 32,
                      "train_images": 60000, "eval_images": 5000})
            rows = [{"step": s, "tokens": s * 128, "epoch": s / 469, "eval_loss": 1 - acc, "eval_accuracy": acc}
                    for s in (117, 234, 352, 469)]
            write_run_dir(run_dir(out, v.name, seed), v.config, summary, rows, seed)


def report(out: Path) -> str:
    return write_report(out, samples=False, conditioning=False, echo=lambda _: None).read_text()


def row(text: str, first: str, section: str) -> list[str]:
    part = text[text.index(section):]
    line = next(line for line in part.splitlines() if line.startswith(f"| {first}"))
    return [c.strip() for c in line.strip("|").split("|")]


TABLES = "## Tables 4-5"


def test_three_seeds_pairs_beside_the_papers_rows_and_the_claims_verdicts(tmp_path):
    out = tmp_path / "timm"
    fill(out, load_study("leaner-timm", preset="verdict"), 3)
    text = report(out)
    # each variant: top-1 over seeds, no top-5 (10 classes), parameters, its preset's paper row as printed
    assert row(text, "`deit-b` | `deit-b`", TABLES) == [
        "`deit-b`", "`deit-b`", "(12, 12)", "85.00 ± 1.00 (n=3)", "–", "1.00M", "`timm-deit-b`: (12, 12) 3072",
        "80.4", "95.1", "86.6M", "178.4 GB"]
    assert row(text, "`xcit-m` | `xcit-m-reduced`", TABLES) == [
        "`xcit-m`", "`xcit-m-reduced`", "(12, 16)", "80.17 ± 1.04 (n=3)", "–", "560.0k",
        "`timm-xcit-m-reduced`: (12, 16) 2048", "81.7", "95.6", "59.0M", "196 GB"]
    # each pair: paired difference (0.5, 0.7, 0.3 points: mean 0.5, sd 0.2), its 95% t interval, the ratios
    half = T_975_2 * 0.2 / math.sqrt(3)
    deit = row(text, "`deit-b-reduced` / `deit-b`", "Reduced against original")
    assert deit == ["`deit-b-reduced` / `deit-b`", "3", "+0.50", f"[{0.5 - half:+.2f}, {0.5 + half:+.2f}]", "0.46x",
                    "+0.4", f"{40.1 / 86.6:.2f}x", f"{101.6 / 178.4:.2f}x"]
    xcit = row(text, "`xcit-m-reduced` / `xcit-m`", "Reduced against original")
    assert xcit[2] == f"{(-1.0 - 0.5 - 1.0) / 3:+.2f}" and xcit[4] == "0.70x"
    assert xcit[5:] == ["+0.3", "0.70x", f"{196 / 320.8:.2f}x"]
    # the scale of both
    assert "Scale: here image classification on fashion-mnist (IDX), 10 classes at 32 px" in text
    assert "with models scaled down" in text
    assert "the paper: ImageNet-1k (1,000 classes, 224 px), 300 epochs" in text
    # the CSV, unrounded
    pairs = {r["reduced"]: r for r in read_csv(out / "report" / "pairs.csv")}
    assert float(pairs["deit-b-reduced"]["params_ratio"]) == pytest.approx(0.46)
    assert float(pairs["deit-b-reduced"]["top1_difference"]) == pytest.approx(0.5)
    assert float(pairs["deit-b-reduced"]["interval_low"]) == pytest.approx(0.5 - half, abs=1e-5)
    assert float(pairs["xcit-m-reduced"]["paper_memory_ratio"]) == pytest.approx(196 / 320.8)
    assert [float(x) for x in pairs["xcit-m-reduced"]["top1_difference_per_seed"].split()] == \
        pytest.approx([-1.0, -0.5, -1.0])
    # findings: ours beside the paper's
    assert ("`deit-b-reduced` against `deit-b`: top-1 85.50% vs 85.00% (+0.50 points, 95% interval "
            f"[{0.5 - half:+.2f}, {0.5 + half:+.2f}] over 3 paired seeds) with 0.46x the parameters; the paper's "
            "Table 4: 80.8% vs 80.4% (+0.4 points) with 0.46x the parameters and 0.57x the training memory.") in text
    # the figure: both arrows here and in the paper
    pts = read_csv(out / "report" / "accuracy_vs_params.csv")
    assert {(r["source"], r["variant"]) for r in pts} == {
        *(("this study", n) for n in TOP1), *(("paper", f"timm-{n}") for n in TOP1)}
    ours = {r["variant"]: r for r in pts if r["source"] == "this study"}
    assert float(ours["deit-b-reduced"]["params_m"]) == 0.46 and float(ours["deit-b-reduced"]["top1"]) == \
        pytest.approx(85.5)
    assert (out / "report" / "accuracy_vs_params.png").stat().st_size > 1000
    # the declared claims: the verdict section, as every layout renders it
    verdicts = text[text.index("## Verdicts on the papers' claims"):]
    assert "| reduced DeiT-B (7 x 16 heads, MLP ratio 2) is as good as DeiT-B (12 x 12) |" in verdicts
    assert "non-inferior within the margin" in verdicts and "not shown at this scale" in verdicts
    assert "the paper: DeiT-B on ImageNet-1k, 300 epochs" in verdicts


def deit_and_xcit(raw: dict) -> dict:
    """The study file with only the DeiT and XCiT variants and pairs (those TOP1 fakes)."""
    def keep(name: str) -> bool:
        return name.startswith(("deit", "xcit"))

    for table in (raw, *raw.get("presets", {}).values()):
        if "variants" in table:
            table["variants"] = [v for v in table["variants"] if keep(v["name"])]
        if "pairs" in table.get("report", {}):
            table["report"]["pairs"] = [p for p in table["report"]["pairs"] if keep(p[1])]
    return raw


def set_pairs(raw: dict, pairs: list) -> None:
    """``pairs`` in the file's [report] and in the tiny preset's, which quick extends."""
    raw["report"]["pairs"] = raw["presets"]["tiny"]["report"]["pairs"] = pairs


def test_one_seed_and_a_variant_without_a_paper_row(tmp_path):
    raw = deit_and_xcit(load_study_file("leaner-timm")[0])
    for table in (raw, *raw.get("presets", {}).values()):  # the variants, wherever the study lists them
        for v in table.get("variants", []):
            v["name"] = v["name"].replace("deit-b", "deit-tiny")
    set_pairs(raw, [["deit-tiny-reduced", "deit-tiny"], ["xcit-m-reduced", "xcit-m"]])
    path = tmp_path / "renamed.toml"
    path.write_text(tomli_w.dumps(raw))
    out = tmp_path / "one"
    fill(out, load_study(str(path), preset="quick", seeds=1), 1)
    text = report(out)
    no_row = ["none (no preset `timm-deit-tiny`)", "–", "–", "–", "–"]
    assert row(text, "`deit-tiny` | `deit-tiny`", TABLES)[6:] == no_row
    assert row(text, "`deit-tiny-reduced` / `deit-tiny`", "Reduced against original") == [
        "`deit-tiny-reduced` / `deit-tiny`", "1", "+0.50", "–", "0.46x", "no paper row", "–", "–"]
    assert "one seed: no interval) with 0.46x the parameters; the paper has no row for this pair." in text
    assert "With one paired seed per architecture there is no interval" in text
    assert row(text, "`xcit-m-reduced` / `xcit-m`", "Reduced against original")[5] == "+0.3"


def test_the_papers_sizes_are_said_and_a_pair_naming_no_variant_is_refused_in_one_line(tmp_path, capsys):
    out = tmp_path / "bad"
    four = tmp_path / "four.toml"
    four.write_text(tomli_w.dumps(deit_and_xcit(load_study_file("leaner-timm")[0])))
    fill(out, load_study(str(four), preset="quick", seeds=1), 1, {n: timm_preset(f"timm-{n}").params for n in TOP1})
    text = report(out)
    assert "with the paper's models (its presets' counts)" in text and "scaled down" not in text
    assert row(text, "`xcit-m-reduced` / `xcit-m`", "Reduced against original")[4] == f"{59_002_600 / 84_395_752:.2f}x"
    saved = read_toml(out / STUDY_TOML)
    saved["definition"]["report"]["pairs"] = [["deit-b-reduced", "deit-c"]]
    (out / STUDY_TOML).write_text(tomli_w.dumps(saved))
    assert main(["report", str(out), "--no-samples", "--no-conditioning"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "[report] pairs names variant 'deit-c', which the study does not have" in err
    # a pair that is not two names is refused before any run starts
    raw, _ = load_study_file("leaner-timm")
    set_pairs(raw, [["deit-b-reduced"]])
    path = tmp_path / "short.toml"
    path.write_text(tomli_w.dumps(raw))
    assert main(["study", str(path), "--out", str(tmp_path / "never")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pairs" in err and not (tmp_path / "never").exists(), err
