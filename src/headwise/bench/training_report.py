"""The targets and tables of the training sections (``hf``, ``penalty``, ``mfu``, ``bf16``, and
their ``gpu`` rerun): one table per measured sequence length and device, the targets from the
CPU's fp32 measurements."""

from __future__ import annotations

from typing import Any

from headwise.bench.report import number, quiet_count, ratio_cell, ratio_shown, target


def _sections(result: dict[str, Any], device: str, precision: str) -> list[dict[str, Any]]:
    return [s for s in result.get("training", []) if s["device"].startswith(device) and s["precision"] == precision]


def _labels(section: dict[str, Any]) -> tuple[str | None, str | None]:
    """The largest constant plan and the largest descending plan of a section."""
    cases = [c for c in section["cases"].values() if c["impl"] == "headwise"]

    def top(scheme: str) -> str | None:
        rows = [c for c in cases if c["scheme"] == scheme]
        return max(rows, key=lambda c: c["total"])["plan"] if rows else None

    return top("constant"), top("descending")


def training_targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """vs HF GPT-Neo at the longest T (the largest constant and descending plans), never slower
    than HF, the head-count penalty per T, MFU and bf16 at the longest T (CPU, fp32)."""
    targets: list[dict[str, Any]] = []
    fp32 = {s["seq_len"]: s for s in _sections(result, "cpu", "fp32")}
    longest = fp32.get(max(fp32)) if fp32 else None
    vs_hf = {(t, r["plan"]): r for t, s in fp32.items() for r in s["comparisons"]["vs_hf"]}
    if longest is not None:
        t = longest["seq_len"]
        big, desc = _labels(longest)
        for plan, goal in ((big, 1.25), (desc, 1.2)):
            row = vs_hf.get((t, plan))
            ref = row["reference"] if row else "HF"
            targets.append(target(f"vs HF GPT-Neo, T={t}: headwise {plan} / {ref}", f">= {goal}x",
                                  row and row["ratio"], row and row["ratio"] >= goal, row and ratio_shown(row)))
    if vs_hf:
        worst = min(vs_hf.items(), key=lambda kv: kv[1]["ratio"])
        (t, plan), row = worst
        targets.append(target("never slower than HF on any plan (worst plan)", ">= 1.0x", row["ratio"],
                              row["ratio"] >= 1.0, f"{ratio_shown(row)}: {plan} vs {row['reference']}, T={t}"))
    for t, s in sorted(fp32.items()):
        rows = s["comparisons"]["penalty"]
        if len(rows) >= 2:
            w = min(rows, key=lambda r: r["ratio"])
            targets.append(target(f"head-count penalty, T={t}: every plan / {w['baseline'].split()[-1]} (worst)",
                                  ">= 0.9x", w["ratio"], w["ratio"] >= 0.9, f"{ratio_shown(w)}: {w['plan']}"))
    if longest is not None:
        base = next(iter(c for c in longest["cases"].values() if c["impl"] == "headwise"))
        mfu = base["mfu_median"]
        targets.append(target(f"MFU, fp32, headwise {base['plan']} T={longest['seq_len']} "
                              f"({longest['params'] / 1e6:.1f}M params)", ">= 65% of fp32 matmul peak",
                              mfu, mfu is not None and mfu >= 0.65,
                              f"{mfu:.0%} ({base.get('basis', '')} rounds)" if mfu is not None else None))
        targets += _bf16_targets(longest, "amx_bf16" in result.get("machine", {}).get("cpu", ""))
    return targets


def _bf16_targets(section: dict[str, Any], amx: bool) -> list[dict[str, Any]]:
    """bf16 training: on a CPU with AMX, MFU >= 55% of the measured bf16 matmul peak; without it
    (bf16 matmuls at best ~2x fp32 there), >= 2x the fp32 throughput."""
    out, t = [], section["seq_len"]
    for row in section["comparisons"]["bf16"]:
        if amx:
            case = section["cases"].get(f"headwise {row['plan']} bf16")
            mfu = case["mfu_median"] if case else None
            out.append(target(f"bf16 MFU (AMX CPU), headwise {row['plan']} T={t}", ">= 55% of bf16 matmul peak",
                              mfu, mfu is not None and mfu >= 0.55,
                              f"{mfu:.0%} ({case.get('basis', '')} rounds; {row['ratio']:.2f}x the fp32 tokens/s)"
                              if case else None))
        else:
            out.append(target(f"bf16 autocast / fp32 training (no AMX), {row['plan']} T={t}", ">= 2x",
                              row["ratio"], row["ratio"] >= 2.0, ratio_shown(row)))
    return out


def training_tables(result: dict[str, Any]) -> list[str]:
    """One table per training measurement (sequence length, device, precision), in measured order."""
    return [line for s in result.get("training", []) for line in _training_table(s)]


def _training_table(s: dict[str, Any]) -> list[str]:
    t, dev, prec = s["seq_len"], s["device"], s["precision"]
    head = f"{dev}, {prec}, T={t}, B={s['batch']} ({s['tokens_per_step']} tokens/step)"
    cases = s["cases"]
    comp = s["comparisons"]
    vs_hf = {r["plan"]: r for r in comp["vs_hf"]}
    pen = {r["plan"]: r for r in comp["penalty"]}
    bf16 = {r["plan"]: r for r in comp["bf16"]}
    base_label = next((r["baseline"].split()[-1] for r in comp["penalty"]), "baseline")
    peaks = s["peak_flops_median"]
    peak_text = ", ".join(
        f"{p} {v / 1e9:,.0f} GFLOP/s (per round {min(s['peak_flops'][p]) / 1e9:,.0f}-"
        f"{max(s['peak_flops'][p]) / 1e9:,.0f})" for p, v in sorted(peaks.items()))
    lines = [f"## Training step: {head}", "",
             f"Measured matmul peak (median of the quiet measurements): {peak_text}; waited "
             f"{s.get('idle_wait_s', 0):.0f} s in all for the machine to go quiet before rounds.", "",
             f"| plan | heads | quiet | tok/s | vs HF (reference) | vs {base_label} | model GFLOP/s | MFU |"
             + (" bf16 tok/s | bf16 / fp32 | bf16 MFU |" if bf16 else ""),
             "|---|---|---|---|---|---|---|---|" + ("---|---|---|" if bf16 else "")]
    for name, c in cases.items():
        if c["impl"] != "headwise" or c["precision"] != prec:
            continue
        plan = c["plan"]
        ref = vs_hf.get(plan)
        hf_text = f"{ratio_cell(ref)} vs {ref['reference']}" if ref else ""
        row = (f"| {plan} | {','.join(map(str, c['heads']))} | {quiet_count(c)} | "
               f"{number(c['tokens_per_s_median'], 1)} | {hf_text} | "
               f"{ratio_cell(pen.get(plan)) or 'baseline'} | {number(c['model_flops_per_s_median'] / 1e9, 1)} | "
               f"{number(c['mfu_median'] and 100 * c['mfu_median'], 0)}% |")
        if bf16:
            b = cases.get(f"{name} bf16")
            row += (f" {number(b['tokens_per_s_median'], 1)} | {ratio_cell(bf16.get(plan))} | "
                    f"{number(100 * b['mfu_median'], 0)}% |" if b else " | | |")
        lines.append(row)
    for name, c in cases.items():
        if c["impl"] == "hf":
            mem = f", peak memory {c['peak_memory_bytes'] / 2**30:.2f} GiB" if c.get("peak_memory_bytes") else ""
            lines.append(f"| {name} (HF) | {','.join(map(str, c['heads']))} | {quiet_count(c)} | "
                         f"{number(c['tokens_per_s_median'], 1)} | "
                         f"reference{mem} | | {number(c['model_flops_per_s_median'] / 1e9, 1)} | "
                         f"{number(100 * c['mfu_median'], 0)}% |" + (" | | |" if bf16 else ""))
    if dev.startswith("cuda"):
        mems = [(n, c["peak_memory_bytes"]) for n, c in cases.items() if c.get("peak_memory_bytes")]
        if mems:
            lines += ["", "Peak memory: " + "; ".join(f"{n} {b / 2**30:.2f} GiB" for n, b in mems) + "."]
    lines.append("")
    return lines
