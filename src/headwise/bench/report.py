"""Targets and the markdown table of a benchmark result (the dict :func:`run_bench` returns)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from headwise.bench.core import QUIET_STALL, quiet_mask
from headwise.config import atomic_write_text

RESULT_JSON = "latest.json"
RESULT_MD = "latest.md"


def _sections(result: dict[str, Any], device: str, precision: str) -> list[dict[str, Any]]:
    return [s for s in result.get("training", []) if s["device"].startswith(device) and s["precision"] == precision]


def _labels(section: dict[str, Any]) -> tuple[str | None, str | None]:
    """The largest constant plan and the largest descending plan of a section."""
    cases = [c for c in section["cases"].values() if c["impl"] == "headwise"]

    def top(scheme: str) -> str | None:
        rows = [c for c in cases if c["scheme"] == scheme]
        return max(rows, key=lambda c: c["total"])["plan"] if rows else None

    return top("constant"), top("descending")


def _target(name: str, goal: str, value: float | None, ok: bool | None, shown: str | None = None) -> dict[str, Any]:
    return {"target": name, "goal": goal, "measured": value,
            "shown": shown if shown is not None else ("n/a" if value is None else f"{value:.2f}"),
            "met": ok if value is not None else None}


def evaluate_targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Every target of the issue with its measured figure (None where the section did not run)."""
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
            targets.append(_target(f"vs HF GPT-Neo, T={t}: headwise {plan} / {ref}", f">= {goal}x",
                                   row and row["ratio"], row and row["ratio"] >= goal, row and _shown(row)))
    if vs_hf:
        worst = min(vs_hf.items(), key=lambda kv: kv[1]["ratio"])
        (t, plan), row = worst
        targets.append(_target("never slower than HF on any plan (worst plan)", ">= 1.0x", row["ratio"],
                               row["ratio"] >= 1.0, f"{_shown(row)}: {plan} vs {row['reference']}, T={t}"))
    for t, s in sorted(fp32.items()):
        rows = s["comparisons"]["penalty"]
        if len(rows) >= 2:
            w = min(rows, key=lambda r: r["ratio"])
            targets.append(_target(f"head-count penalty, T={t}: every plan / {w['baseline'].split()[-1]} (worst)",
                                   ">= 0.9x", w["ratio"], w["ratio"] >= 0.9, f"{_shown(w)}: {w['plan']}"))
    if longest is not None:
        base = next(iter(c for c in longest["cases"].values() if c["impl"] == "headwise"))
        mfu = base["mfu_median"]
        targets.append(_target(f"MFU, fp32, headwise {base['plan']} T={longest['seq_len']} "
                               f"({longest['params'] / 1e6:.1f}M params)", ">= 65% of fp32 matmul peak",
                               mfu, mfu is not None and mfu >= 0.65,
                               f"{mfu:.0%} ({base.get('basis', '')} rounds)" if mfu is not None else None))
        targets += _bf16_targets(longest, "amx_bf16" in result.get("machine", {}).get("cpu", ""))
    tok = result.get("tokenize")
    if tok is not None:
        rate = tok.get("tokens_per_second_median")
        targets.append(_target("GPT-Neo tokenization", ">= 1M tokens/s", rate, rate is not None and rate >= 1e6,
                               f"{rate / 1e6:.2f}M tokens/s" if rate else f"skipped: {tok.get('skipped')}"))
    for gen in result.get("generation", []):
        if gen["device"] != "cpu":
            continue
        sp = gen["speedup"]
        targets.append(_target(f"KV-cache / no-cache generation at {gen['new_tokens']} new tokens", ">= 5x",
                               sp["ratio"], sp["ratio"] >= 5.0, f"{sp['ratio']:.1f}x ({sp.get('basis', '')} rounds)"))
    vision = result.get("vision")
    if vision is not None:
        comp = vision["comparisons"]
        for row in comp["vs_hf"]:
            targets.append(_target(f"ViT vs HF ViTForImageClassification ({vision.get('hf_attn_implementation')}), "
                                   f"training images/s: headwise {row['plan']} / {row['reference']}", ">= 1.0x",
                                   row["ratio"], row["ratio"] >= 1.0, _shown(row)))
        pen = comp["penalty"]
        targets.append(_target(f"ViT head-count penalty: headwise {pen['plan']} / {pen['baseline'].split()[-1]}",
                               ">= 0.9x", pen["ratio"], pen["ratio"] >= 0.9, _shown(pen)))
    nys = result.get("nystrom")
    if nys is not None:
        for row in nys["comparisons"]:
            t, hf, soft = row["seq_len"], row["vs_hf"], row["vs_softmax"]
            targets.append(_target(f"Nyström layer vs HF NystromformerSelfAttention, fwd+bwd tokens/s, T={t}: "
                                   f"headwise / HF", ">= 1.0x", hf["ratio"], hf["ratio"] >= 1.0, _shown(hf)))
            if t >= nys["softmax_target_from"]:
                targets.append(_target(f"Nyström layer vs softmax attention (SDPA), fwd+bwd tokens/s, T={t}: "
                                       f"nystrom / softmax", "> 1.0x", soft["ratio"], soft["ratio"] > 1.0,
                                       _shown(soft)))
    enc = result.get("encoder")
    if enc is not None:
        targets += _encoder_targets(enc)
    gpu = {s["seq_len"]: s for s in result.get("training", []) if s["device"].startswith("cuda")}
    if gpu:
        s = gpu[max(gpu)]
        base = next(iter(c for c in s["cases"].values() if c["impl"] == "headwise"))
        targets.append(_target(f"GPU MFU bf16, {base['plan']} T={s['seq_len']}", ">= 40% of bf16 matmul peak",
                               base["mfu_median"], base["mfu_median"] >= 0.40, f"{base['mfu_median']:.0%}"))
        for t, s in sorted(gpu.items()):
            rows = s["comparisons"]["penalty"]
            if rows:
                w = min(rows, key=lambda r: r["ratio"])
                targets.append(_target(f"GPU head-count penalty, T={t} (worst)", ">= 0.85x", w["ratio"],
                                       w["ratio"] >= 0.85, f"{w['ratio']:.2f}x ({w['plan']})"))
    return targets


#: headwise's masked-LM training over HF BertForMaskedLM at the preset's plan (the issue's target)
ENCODER_VS_HF_GOAL = 1.2


def _encoder_targets(enc: dict[str, Any]) -> list[dict[str, Any]]:
    """Masked-LM training vs HF BERT: >= 1.2x at the preset's plan, never slower at any plan."""
    rows = enc["comparisons"]["vs_hf"]
    first, worst = rows[0], min(rows, key=lambda r: r["ratio"])
    what = f"Crammed BERT vs HF BertForMaskedLM ({enc['hf_attn_implementation']}), masked-LM training tokens/s"
    return [_target(f"{what}: headwise {first['plan']} / {first['reference']}", f">= {ENCODER_VS_HF_GOAL}x",
                    first["ratio"], first["ratio"] >= ENCODER_VS_HF_GOAL, _shown(first)),
            _target(f"{what}: never slower at any plan (worst plan)", ">= 1.0x", worst["ratio"], worst["ratio"] >= 1.0,
                    f"{_shown(worst)}: {worst['plan']} vs {worst['reference']}")]


def _bf16_targets(section: dict[str, Any], amx: bool) -> list[dict[str, Any]]:
    """bf16 training: on a CPU with AMX, MFU >= 55% of the measured bf16 matmul peak; without it
    (bf16 matmuls at best ~2x fp32 there), >= 2x the fp32 throughput."""
    out, t = [], section["seq_len"]
    for row in section["comparisons"]["bf16"]:
        if amx:
            case = section["cases"].get(f"headwise {row['plan']} bf16")
            mfu = case["mfu_median"] if case else None
            out.append(_target(f"bf16 MFU (AMX CPU), headwise {row['plan']} T={t}", ">= 55% of bf16 matmul peak",
                               mfu, mfu is not None and mfu >= 0.55,
                               f"{mfu:.0%} ({case.get('basis', '')} rounds; {row['ratio']:.2f}x the fp32 tokens/s)" if case
                               else None))
        else:
            out.append(_target(f"bf16 autocast / fp32 training (no AMX), {row['plan']} T={t}", ">= 2x",
                               row["ratio"], row["ratio"] >= 2.0, _shown(row)))
    return out


def _shown(row: dict[str, Any]) -> str:
    return f"{row['ratio']:.2f}x ({row.get('basis', '')} rounds; ratio of medians {row['ratio_of_medians']:.2f}x)"


def _num(x: float | None, digits: int = 0) -> str:
    return "n/a" if x is None else f"{x:,.{digits}f}"


def _load_line(result: dict[str, Any]) -> str:
    parts = []
    for when, snap in result.get("load", {}).items():
        la = snap.get("loadavg")
        psi = snap.get("cpu_pressure_avg60")
        text = f"{when}: loadavg {la[0]:.2f}/{la[1]:.2f}" if la else f"{when}: loadavg n/a"
        if psi is not None:
            text += f", CPU pressure {psi:.0f}%"
        parts.append(text)
    return "; ".join(parts)


def render_markdown(result: dict[str, Any]) -> str:
    """The result as markdown: machine, settings and load, targets, then one table per section."""
    m = result["machine"]
    cfg = result["config"]
    lines = [f"# headwise benchmark ({'quick' if result['quick'] else 'full'} run, {result['date']})", ""]
    mem = f", {m['memory_gib']} GiB RAM" if m.get("memory_gib") else ""
    lines.append(f"- Machine: {m['cpu']}, {m['cores']} cores, {m['torch_threads']} torch threads{mem}"
                 + (f"; GPU {m['gpu']}" if m.get("gpu") else "; no GPU"))
    lines.append(f"- torch {m['torch']}, transformers {m.get('transformers')}, Python {m['python']}")
    lines.append(f"- Command: `{result.get('command', 'headwise bench')}`; "
                 f"wall time {result['wall_time_s'] / 60:.1f} min")
    lines.append("- Dtype: float32 unless marked bf16 (torch.autocast). A training step is forward + "
                 "cross-entropy (headwise: the LM task's own, headwise.model.loss; HF: F.cross_entropy on fp32 "
                 "logits, as transformers computes it) + backward + AdamW step on B x T random token ids; "
                 "every number is the median of "
                 f"{cfg['rounds']} rounds (every case once per round, in shuffled order) after {cfg['warmup']} "
                 "warm-up; a ratio is the median of per-round ratios (ratio of the medians in brackets). "
                 f"Only quiet rounds count when there are two or more: a sample is quiet when other work kept a "
                 f"task waiting for a CPU less than {100 * QUIET_STALL:.0f}% of its time (Linux PSI); "
                 "the `quiet` column says how many were.")
    lines.append(f"- Model: GPT-Neo, d_model {cfg['d_model']}, {cfg['n_layers']} layers G,L,..., window 256, "
                 f"vocab {cfg['vocab_size']:,}; HF = transformers GPTNeoForCausalLM, eager attention, "
                 "same weights (headwise.hf.to_hf)")
    opt = next((t.get("optimizer") for t in result.get("training", [])), None)
    settings = result.get("settings", {})
    lines.append(f"- Settings: glibc malloc keeps freed memory: {'yes' if settings.get('malloc_tuned') else 'no'}"
                 + (f"; optimizer AdamW fused={opt.get('fused')} foreach={opt.get('foreach')}" if opt else ""))
    lines.append(f"- Load: {_load_line(result)}")
    lines.append("")
    targets = result.get("targets") or evaluate_targets(result)
    if targets:
        lines += ["## Targets", "", "| target | goal | measured | met |", "|---|---|---|---|"]
        for t in targets:
            met = {True: "yes", False: "**no**", None: "n/a"}[t["met"]]
            lines.append(f"| {t['target']} | {t['goal']} | {t['shown']} | {met} |")
        lines.append("")
    for s in result.get("training", []):
        lines += _training_tables(s)
    for gen in result.get("generation", []):
        tps = gen["tokens_per_s_median"]
        lines += [f"## Generation ({gen['device']}, {gen['precision']}, {gen['plan']}, greedy, "
                  f"{gen['prompt_tokens']}-token prompt)", "",
                  "| new tokens | KV cache tok/s | no cache tok/s | speedup | greedy tokens agree |",
                  "|---|---|---|---|---|",
                  f"| {gen['new_tokens']} | {_num(tps['kv-cache'], 1)} | {_num(tps['no-cache'], 1)} | "
                  f"{gen['speedup']['ratio']:.1f}x | {gen['greedy_tokens_agree']} / {gen['new_tokens']} |", ""]
    if result.get("vision") is not None:
        lines += _vision_table(result["vision"])
    if result.get("nystrom") is not None:
        lines += _nystrom_table(result["nystrom"])
    if result.get("encoder") is not None:
        lines += _encoder_table(result["encoder"])
    tok = result.get("tokenize")
    if tok is not None:
        lines += ["## Tokenization (GPT-Neo, headwise.families.lm.bench)", ""]
        if "skipped" in tok:
            lines.append(f"skipped: {tok['skipped']}")
        else:
            lines += ["| tokens | stories | median tok/s | best tok/s |", "|---|---|---|---|",
                      f"| {tok['tokens']:,} | {tok['stories']:,} | {tok['tokens_per_second_median']:,} | "
                      f"{tok['tokens_per_second_best']:,} |"]
        lines.append("")
    return "\n".join(lines)


def _quiet(case: dict[str, Any]) -> str:
    stall = case.get("cpu_stall", [])
    return f"{sum(quiet_mask(stall))}/{len(stall)}"


def _ratio(row: dict[str, Any] | None) -> str:
    return "" if row is None else f"{row['ratio']:.2f}x ({row['ratio_of_medians']:.2f}x)"


def _training_tables(s: dict[str, Any]) -> list[str]:
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
        hf_text = f"{_ratio(ref)} vs {ref['reference']}" if ref else ""
        row = (f"| {plan} | {','.join(map(str, c['heads']))} | {_quiet(c)} | {_num(c['tokens_per_s_median'], 1)} | "
               f"{hf_text} | "
               f"{_ratio(pen.get(plan)) or 'baseline'} | {_num(c['model_flops_per_s_median'] / 1e9, 1)} | "
               f"{_num(c['mfu_median'] and 100 * c['mfu_median'], 0)}% |")
        if bf16:
            b = cases.get(f"{name} bf16")
            row += (f" {_num(b['tokens_per_s_median'], 1)} | {_ratio(bf16.get(plan))} | "
                    f"{_num(100 * b['mfu_median'], 0)}% |" if b else " | | |")
        lines.append(row)
    for name, c in cases.items():
        if c["impl"] == "hf":
            mem = f", peak memory {c['peak_memory_bytes'] / 2**30:.2f} GiB" if c.get("peak_memory_bytes") else ""
            lines.append(f"| {name} (HF) | {','.join(map(str, c['heads']))} | {_quiet(c)} | "
                         f"{_num(c['tokens_per_s_median'], 1)} | "
                         f"reference{mem} | | {_num(c['model_flops_per_s_median'] / 1e9, 1)} | "
                         f"{_num(100 * c['mfu_median'], 0)}% |" + (" | | |" if bf16 else ""))
    if dev.startswith("cuda"):
        mems = [(n, c["peak_memory_bytes"]) for n, c in cases.items() if c.get("peak_memory_bytes")]
        if mems:
            lines += ["", "Peak memory: " + "; ".join(f"{n} {b / 2**30:.2f} GiB" for n, b in mems) + "."]
    lines.append("")
    return lines


def _vision_table(v: dict[str, Any]) -> list[str]:
    comp = v["comparisons"]
    vs_hf = {r["plan"]: r for r in comp["vs_hf"]}
    lines = [f"## Vision training step ({v['device']}, {v['precision']}, B={v['batch']} images)", "",
             f"ViT: {v['image_size']} px, {v['channels']} channels, patch {v['patch_size']} ({v['positions']} "
             f"positions with the class token), d_model {v['d_model']}, {v['n_layers']} layers, MLP "
             f"{v['mlp_hidden']}, {v['num_classes']} classes, head_dim = d_model / heads ({v['params']:,} parameters "
             f"at every head count). HF = transformers ViTForImageClassification, {v['hf_attn_implementation']} "
             "attention, same weights (headwise.hf.vit.to_hf_vit). A step is forward, cross-entropy, backward and "
             f"AdamW; waited {v.get('idle_wait_s', 0):.0f} s in all for the machine to go quiet before rounds.", "",
             "| heads | quiet | headwise images/s | HF images/s | headwise / HF | vs fewest heads (headwise) |",
             "|---|---|---|---|---|---|"]
    pen = comp["penalty"]
    for h in v["heads"]:
        label = next(c["plan"] for c in v["cases"].values() if c["heads"] == h)
        ours, theirs = v["cases"][f"headwise {label}"], v["cases"][f"hf {label}"]
        penalty = _ratio(pen) if pen["plan"] == label else ("baseline" if pen["baseline"].endswith(label) else "")
        lines.append(f"| {label} | {_quiet(ours)} | {_num(ours['images_per_s_median'], 1)} | "
                     f"{_num(theirs['images_per_s_median'], 1)} | {_ratio(vs_hf.get(label))} | {penalty} |")
    hf_pen = comp.get("hf_penalty")
    if hf_pen:
        lines += ["", f"HF's own head-count ratio, {hf_pen['plan']} / {hf_pen['baseline'].split()[-1]}: "
                      f"{_ratio(hf_pen)}."]
    lines.append("")
    return lines


def _nystrom_table(n: dict[str, Any]) -> list[str]:
    comp = {r["seq_len"]: r for r in n["comparisons"]}
    cases = n["cases"]
    lines = [f"## Nyström attention layer, forward + backward ({n['device']}, {n['precision']}, B={n['batch']})", "",
             f"One layer: qkv projection, attention, output projection (with biases); d_model {n['d_model']}, "
             f"{n['heads']} heads of width {n['head_dim']}, {n['landmarks']} landmarks, {n['pinv_iterations']} "
             "pseudo-inverse iterations (per-head start), no conv. Softmax = the same headwise module with "
             "attention = global (SDPA), same weights; HF = transformers NystromformerSelfAttention (conv off) + "
             "Linear, a copy of the weights. A sample is several passes (forward, backward to the input and the "
             f"weights); waited {n.get('idle_wait_s', 0):.0f} s in all for the machine to go quiet before rounds.", "",
             "| T | quiet | headwise nyström tok/s | softmax tok/s | HF nyström tok/s | nyström / HF | "
             "nyström / softmax | max abs diff vs HF |",
             "|---|---|---|---|---|---|---|---|"]
    for t in n["seq_lens"]:
        ours, soft, hf = (cases[f"{impl} T={t}"] for impl in ("headwise nystrom", "headwise softmax", "hf nystrom"))
        lines.append(f"| {t} | {_quiet(ours)} | {_num(ours['tokens_per_s_median'])} | "
                     f"{_num(soft['tokens_per_s_median'])} | {_num(hf['tokens_per_s_median'])} | "
                     f"{_ratio(comp[t]['vs_hf'])} | {_ratio(comp[t]['vs_softmax'])} | "
                     f"{n['max_abs_diff'][str(t)]['hf']:.1e} |")
    lines.append("")
    return lines


def _encoder_table(e: dict[str, Any]) -> list[str]:
    comp = e["comparisons"]
    vs_hf, pen = {r["plan"]: r for r in comp["vs_hf"]}, {r["plan"]: r for r in comp["penalty"]}
    cases = e["cases"]
    lines = [f"## Encoder masked-LM training step ({e['device']}, {e['precision']}, B={e['batch']} x T={e['seq_len']})",
             "",
             f"{e['preset']}: {e['n_layers']} layers, d_model {e['d_model']}, gated MLP {e['mlp_hidden']}, vocab "
             f"{e['vocab_size']:,}, head_dim = d_model / heads ({e['params']:,} parameters at every plan); "
             f"{e['masked_tokens']} of {e['tokens_per_step']} tokens masked ({e['mask_rate']:.0%}, 80/10/10). HF = "
             f"transformers BertForMaskedLM, {e['hf_attn_implementation']} attention, intermediate size "
             f"{e['hf_intermediate']} (the gated MLP's matmul FLOPs; {e['hf_params']:,} parameters), its own "
             "weights. A step: forward, masked-LM loss (headwise decodes the masked positions alone; HF all, with -100 "
             "labels elsewhere), backward, AdamW; waited "
             f"{e.get('idle_wait_s', 0):.0f} s in all for the machine to go quiet before rounds.", "",
             "| plan | quiet | headwise tok/s | HF reference | HF tok/s | headwise / HF | vs the preset's plan |",
             "|---|---|---|---|---|---|---|"]
    for name, c in cases.items():
        if c["impl"] != "headwise":
            continue
        row, ref, penalty = vs_hf[c["plan"]], cases[c["reference"]], _ratio(pen.get(c["plan"])) or "baseline"
        lines.append(f"| {c['plan']} | {_quiet(c)} | {_num(c['tokens_per_s_median'], 1)} | {c['reference']} | "
                     f"{_num(ref['tokens_per_s_median'], 1)} | {_ratio(row)} | {penalty} |")
    lines.append("")
    return lines


def write_results(result: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """Write ``latest.json`` and ``latest.md`` into ``out_dir`` (atomically); returns their paths."""
    result.setdefault("targets", evaluate_targets(result))
    out_dir = Path(out_dir)
    js, md = out_dir / RESULT_JSON, out_dir / RESULT_MD
    atomic_write_text(js, json.dumps(result, indent=1) + "\n")
    atomic_write_text(md, render_markdown(result) + "\n")
    return js, md
