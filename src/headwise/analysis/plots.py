"""Figures of the attention analysis (matplotlib, Agg backend: no display needed).

Non-finite condition numbers (rank-deficient layers) cannot be drawn; each figure says in a
note how many points it left out.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

SCHEME_ORDER = ("constant", "ascending", "descending", "linear", "explicit")


def _save(fig: plt.Figure, path: str | Path) -> Path:
    """Save atomically (a temporary file renamed into place) and close the figure."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=path.suffix)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=130, bbox_inches="tight")
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
        plt.close(fig)
    return path


def _layer_colors(n: int) -> list:
    # Distinct colours for a few layers; a sequential map once they would repeat.
    if n <= 10:
        return [f"C{k}" for k in range(n)]
    return list(plt.get_cmap("viridis")(np.linspace(0, 0.9, n)))


def _log_axis(ax: plt.Axes, values) -> None:
    # Condition numbers span decades across layers and heads: always a log axis (when drawable).
    if any(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in values):
        ax.set_yscale("log")


def _note_dropped(ax: plt.Axes, dropped: int) -> None:
    if dropped:
        ax.text(0.01, 0.01, f"{dropped} rank-deficient point(s) (kappa = inf) not drawn",
                transform=ax.transAxes, fontsize=8, color="0.3", va="bottom")


def plot_condition_vs_step(rows: list[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """Condition number vs training step, one line per layer and the model average (dashed),
    from the rows of :func:`headwise.analysis.runs.analyze_run`."""
    layers = sorted({r["layer"] for r in rows if r["layer"] != "all"})
    fig, ax = plt.subplots(figsize=(7, 4.2))
    dropped = 0
    colors = _layer_colors(len(layers))
    for color, layer in zip(colors, layers):
        pts = sorted((r["step"], r["cond_mean"]) for r in rows if r["layer"] == layer)
        heads = next(r["heads"] for r in rows if r["layer"] == layer)
        good = [(s, v) for s, v in pts if math.isfinite(v)]
        dropped += len(pts) - len(good)
        if good:
            ax.plot(*zip(*good), marker="o", ms=3, color=color, label=f"layer {layer} ({heads} heads)")
    pts = sorted((r["step"], r["cond_mean"]) for r in rows if r["layer"] == "all")
    good = [(s, v) for s, v in pts if math.isfinite(v)]
    if good:
        ax.plot(*zip(*good), ls="--", marker="s", ms=4, color="black", lw=2, label="mean over layers")
    _log_axis(ax, [r["cond_mean"] for r in rows])
    ax.set_xlabel("training step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("condition number of A (mean over sequences)")
    ax.set_title(title or "Attention conditioning during training")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    _note_dropped(ax, dropped)
    return _save(fig, path)


def plot_head_stats_vs_step(rows: list[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """Attention entropy and effective rank of the head outputs (means over heads) vs step, one
    line per layer."""
    layers = sorted({r["layer"] for r in rows if r["layer"] != "all"})
    colors = _layer_colors(len(layers))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for color, layer in zip(colors, layers):
        sel = sorted((r for r in rows if r["layer"] == layer), key=lambda r: r["step"])
        label = f"layer {layer} ({sel[0]['heads']} heads x {sel[0]['head_dim']})"
        steps = [r["step"] for r in sel]
        ax1.plot(steps, [r["entropy"] for r in sel], marker="o", ms=3, color=color, label=label)
        ax2.plot(steps, [r["erank"] for r in sel], marker="o", ms=3, color=color, label=label)
    # Uniform attention under each mask: the ceiling the entropies are read against.
    for k, value in enumerate(sorted({r["entropy_uniform"] for r in rows if r["layer"] != "all"})):
        ax1.axhline(value, color="0.4", ls=":", lw=1, label="uniform attention" if k == 0 else None)
    low, high = ax1.get_ylim()
    ceiling = max(r["entropy_uniform"] for r in rows)
    ax1.set_ylim(low, max(high, ceiling + 0.05 * (ceiling - low)))  # keep the ceiling off the frame
    ax1.set_ylabel("attention entropy (nats, mean over heads)")
    ax1.ticklabel_format(axis="y", useOffset=False)
    ax2.set_ylabel("effective rank of head output (mean over heads)")
    for ax in (ax1, ax2):
        ax.set_xlabel("training step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    handles, labels = ax1.get_legend_handles_labels()  # one legend for both panels
    ax2.legend(handles, labels, fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    fig.suptitle(title or "Head statistics during training")
    fig.tight_layout(w_pad=3)
    return _save(fig, path)


def plot_condition_vs_heads(rows: list[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """Model condition number (average over layers) vs total heads, one series per scheme, from
    the rows of :func:`headwise.analysis.runs.condition_vs_heads`: every run as a point, the
    mean over seeds joined by a line."""
    by_scheme: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_scheme[r["scheme"]].append(r)
    order = sorted(by_scheme, key=lambda s: (SCHEME_ORDER.index(s) if s in SCHEME_ORDER else 99, s))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    dropped = 0
    for k, scheme in enumerate(order):
        color = f"C{k}"
        sel = [r for r in by_scheme[scheme] if math.isfinite(r["cond_mean"])]
        dropped += len(by_scheme[scheme]) - len(sel)
        if not sel:
            continue
        ax.scatter([r["total_heads"] for r in sel], [r["cond_mean"] for r in sel], color=color, s=18, alpha=0.6)
        totals = sorted({r["total_heads"] for r in sel})
        means = [float(np.mean([r["cond_mean"] for r in sel if r["total_heads"] == t])) for t in totals]
        ax.plot(totals, means, color=color, marker="o", label=scheme)
    _log_axis(ax, [r["cond_mean"] for r in rows])
    ax.set_xlabel("total attention heads")
    ax.set_ylabel("condition number of A (mean over layers)")
    ax.set_title(title or "Attention conditioning vs heads")
    ax.grid(alpha=0.3)
    ax.legend(title="scheme", fontsize=9)
    _note_dropped(ax, dropped)
    return _save(fig, path)


def plot_theory(grid: list[dict[str, Any]], sweep: list[dict[str, Any]], path: str | Path) -> Path:
    """Left: measured kappa of Gaussian N x D blocks vs the closed form, one series per N.
    Right: kappa vs heads at a fixed head width (measured and closed form)."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.4))
    ns = sorted({r["n"] for r in grid})
    for k, n in enumerate(ns):
        sel = sorted((r for r in grid if r["n"] == n), key=lambda r: r["d"])
        ax1.errorbar([r["closed_form"] for r in sel], [r["kappa_mean"] for r in sel],
                     yerr=[r["kappa_std"] for r in sel], marker="o", ms=4, capsize=2, color=f"C{k}",
                     label=f"N = {n}")
    top = max(r["closed_form"] for r in grid) * 1.05
    ax1.plot([1, top], [1, top], color="black", ls="--", lw=1, label="measured = closed form")
    ax1.set_xlim(1, top)
    ax1.set_ylim(1, top)
    ax1.set_xlabel(r"closed form $(\sqrt{D}+\sqrt{N})/(\sqrt{D}-\sqrt{N})$")
    ax1.set_ylabel(r"measured $\kappa$ (mean $\pm$ std over seeds)")
    ratios = sorted({r["ratio"] for r in grid})
    ax1.set_title(f"Gaussian N x D blocks, D/N in {{{', '.join(f'{x:g}' for x in ratios)}}}", fontsize=10)
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=8)

    # Near D = N the seeds' spread is heavy-tailed: draw the median with the min-max range.
    sel = sorted(sweep, key=lambda r: r["heads"])
    heads = [r["heads"] for r in sel]
    med = [r["kappa_median"] for r in sel]
    err = [[m - r["kappa_min"] for m, r in zip(med, sel)], [r["kappa_max"] - m for m, r in zip(med, sel)]]
    ax2.errorbar(heads, med, yerr=err, marker="o", ms=4, capsize=2, color="C0",
                 label="measured (median, min-max over seeds)")
    # inf breaks the closed-form line at D = N instead of bridging it.
    closed = [r["closed_form"] if math.isfinite(r["closed_form"]) else math.nan for r in sel]
    ax2.plot(heads, closed, marker="x", ls="--", color="C3", label="closed form")
    ax2.axhline(1, color="black", lw=0.8)
    n, d = sel[0]["n"], sel[0]["head_dim"]
    square = [r["heads"] for r in sel if r["d"] == r["n"]]
    if square:
        ax2.axvline(square[0], color="0.5", ls=":", lw=1)
        ax2.text(square[0], 0.09, " D = N: closed form infinite", fontsize=8, color="0.3",
                 transform=ax2.get_xaxis_transform(), va="bottom")
    ax2.set_xscale("log", base=2)
    ax2.set_xticks(heads, [str(h) for h in heads])
    ax2.minorticks_off()
    ax2.set_yscale("log")
    ax2.set_xlabel(f"heads h (head width d = {d}, D = h d)")
    ax2.set_ylabel(r"$\kappa$ of $[A_1 \dots A_h]$")
    ax2.set_title(f"N = {n} tokens: kappa -> 1 as heads grow", fontsize=10)
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return _save(fig, path)


def plot_head_scores(methods: dict[str, list[list[float]]], path: str | Path, title: str = "") -> Path:
    """A heat map per scoring method, layers x query heads, from each method's per-layer head
    scores (:mod:`headwise.analysis.head_importance`); a layer with fewer heads leaves its
    right-hand cells blank. A small map writes each score in its cell."""
    rows = max(map(len, methods.values()))
    fig, axes = plt.subplots(1, len(methods), figsize=(4.2 * len(methods), 0.6 * rows + 1.6), squeeze=False)
    for ax, (method, layers) in zip(axes[0], methods.items()):
        width = max(map(len, layers))
        grid = np.full((len(layers), width), np.nan)
        for i, scores in enumerate(layers):
            grid[i, :len(scores)] = scores
        image = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", cmap="viridis")
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
        if grid.size <= 64:  # small enough to read each score
            for (i, h), value in np.ndenumerate(grid):
                if math.isfinite(value):
                    light = image.norm(value) > 0.6  # viridis turns yellow: dark text there
                    ax.text(h, i, f"{value:.3g}", ha="center", va="center", fontsize=7,
                            color="black" if light else "white")
        ax.set_xticks(range(width))
        ax.set_yticks(range(len(layers)), [f"layer {i} ({len(s)})" for i, s in enumerate(layers)])
        ax.set_xlabel("query head")
        ax.set_title(method)
    fig.suptitle(title or "Head importance")
    fig.tight_layout()
    return _save(fig, path)
