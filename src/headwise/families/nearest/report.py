"""The ``rank`` layout (Amsel, Yehudai & Bruna, "Quality over Quantity in Attention Layers"):
error against rank per head for each width and depth, error against sequence length, and the
"learned nothing" baseline of the nearest-neighbour task.

    [report]
    kind = "rank"

Every quantity comes from the runs: depth, heads and rank (head_dim) from the plan, d from the
model, the number of points N and the task variant from the task config. Width w = heads x rank / d
is the number of d-dimensional multi-head blocks (w = 1: the standard head_dim = d / heads).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

from headwise.report.data import VariantRuns
from headwise.report.document import Document, finish, fmt, fmt_params, log2_ticks, new_figure, plural
from headwise.report.registry import Layout, register_layout
from headwise.report.sections import seed_cell
from headwise.families.nearest.task import NearestTaskConfig


@dataclass
class RankPoint:
    """A completed nearest-neighbour variant, by the quantities of Amsel et al.'s figures."""

    v: VariantRuns
    d: int
    layers: int
    heads: int
    rank: int
    n: int
    #: the error of the best prediction of the form -c x_i
    baseline: float

    @property
    def width(self) -> float:
        return self.heads * self.rank / self.d

    @property
    def error(self) -> float:
        return self.v.stats.mean


@register_layout
class RankLayout(Layout):
    """Rank per head against number of heads against depth, on the nearest-neighbour task."""

    kind = "rank"
    # vector models of a few dimensions: their conditioning is not what this study is about
    conditioning = False

    def setup(self) -> None:
        from headwise.families.nearest.baseline import baseline_loss

        self.points = []
        for v in self.study.done:
            task = v.task
            if isinstance(task, NearestTaskConfig) and v.heads and v.d_model:
                self.points.append(RankPoint(v, v.d_model, v.n_layers or 0, v.heads[0], v.head_dims[0],
                                             task.n_points, baseline_loss(v.d_model, task.n_points, task.variant)))

    def panel(self, v: VariantRuns) -> str:
        return f"{plural(v.n_layers or 0, 'layer')}, N = {v.n_points if v.n_points is not None else '?'}"

    def sections(self, doc: Document) -> list[str]:
        if not self.points:
            doc.add("No completed nearest-neighbour runs to plot.")
            return []
        self.echo("report: scoring the final models")
        main_n = Counter(p.n for p in self.points).most_common(1)[0][0]
        findings = self._rank_figure(doc, main_n)
        findings += self._seqlen_figure(doc)
        self._table(doc)
        return findings

    def _rank_figure(self, doc: Document, main_n: int) -> list[str]:
        """Error against rank per head, a panel per depth and a line per width, at the usual N."""
        pts = [p for p in self.points if p.n == main_n]
        d = pts[0].d
        doc.add("## Error vs rank per head",
                f"Final eval error (mean squared distance to the target point) on the nearest-neighbour task at d = {d}, "
                f"N = {main_n} points. Width w is the number of d-dimensional multi-head blocks (heads x rank / d): w = 1 "
                "is the standard head_dim = d / heads. \"Learned nothing\" is the best prediction of the form -c x_i "
                "(predicting 0 scores 1).")
        layers = sorted({p.layers for p in pts})
        widths = sorted({p.width for p in pts})
        fig, axes = new_figure(4.2 * len(layers) + 0.8, 4.6, ncols=len(layers), sharey=True)
        rows = []
        for j, depth in enumerate(layers):
            ax = axes[0, j]
            sel = [p for p in pts if p.layers == depth]
            for i, w in enumerate(widths):
                line = sorted((p for p in sel if p.width == w), key=lambda p: p.rank)
                if not line:
                    continue
                label = "heads = d / rank" if w == 1 else f"heads = {w:g} d / rank"
                ax.plot([p.rank for p in line], [p.error for p in line], marker="o", color=f"C{i}", label=label)
                for p in line:
                    ax.annotate(f"{p.heads}h", (p.rank, p.error), textcoords="offset points", xytext=(4, 4),
                                fontsize=7, color=f"C{i}")
                    rows.append(dict(variant=p.v.name, layers=depth, rank=p.rank, heads=p.heads, width=w,
                                     n_points=p.n, d=p.d, loss=p.error, learned_nothing=p.baseline))
            ax.axhline(sel[0].baseline, color="k", ls="--", lw=1, label="learned nothing")
            ax.axhline(0, color="0.6", lw=0.6)
            log2_ticks(ax, [p.rank for p in sel])
            finish(ax, "rank per head (head_dim)", title=plural(depth, "layer"), legend=None)
        axes[0, 0].set_ylabel("final eval error")
        axes[0, 0].legend(fontsize=8, loc="center left")
        doc.figure("error_vs_rank", fig, rows, f"Error against rank per head for each width and depth (d = {d}, "
                   f"N = {main_n}); labels give the heads per layer; dashed: the learned-nothing level, as in Amsel et "
                   "al.'s Fig. 1.")
        return [f for f in (self._rank_finding(pts, depth, main_n) for depth in layers) if f]

    @staticmethod
    def _rank_finding(pts: list[RankPoint], depth: int, n: int) -> str | None:
        """One full-rank head against the lowest-rank heads of width 1 (and wider ones) at a depth."""
        d = pts[0].d
        full = next((p for p in pts if p.layers == depth and p.heads == 1 and p.rank == d), None)
        low = [p for p in pts if p.layers == depth and p.rank < d and p.width == 1]
        if not (full and low):
            return None
        worst = min(low, key=lambda p: p.rank)
        text = (f"{plural(depth, 'layer')}, N = {n}: one full-rank head (rank {d}) reaches error {full.error:.3f}; "
                f"{worst.heads} heads of rank {worst.rank} (the standard head_dim = d / heads) reach {worst.error:.3f}")
        wider = [p for p in pts if p.layers == depth and p.rank == worst.rank and p.width > 1]
        if wider:
            best = min(wider, key=lambda p: p.error)
            text += f", and {best.heads} heads of rank {worst.rank} reach {best.error:.3f}"
        return text + f"; learned nothing: {full.baseline:.3f}."

    def _seqlen_figure(self, doc: Document) -> list[str]:
        """Error against N for the shapes run at several N, a line style per depth."""
        shapes = defaultdict(set)
        for p in self.points:
            shapes[(p.rank, p.heads)].add(p.n)
        multi = sorted((s for s, ns in shapes.items() if len(ns) > 1), key=lambda s: -s[0])
        if not multi:
            return []
        pts = [p for p in self.points if (p.rank, p.heads) in multi]
        doc.add("## Error vs sequence length")
        fig, axes = new_figure(10.0, 5.0)
        ax = axes[0, 0]
        rows, findings = [], []
        styles = ["-", "--", ":", "-."]
        layer_set = sorted({p.layers for p in pts})
        for i, (r, h) in enumerate(multi):
            for k, depth in enumerate(layer_set):
                line = sorted((p for p in pts if (p.rank, p.heads) == (r, h) and p.layers == depth), key=lambda p: p.n)
                if not line:
                    continue
                ax.plot([p.n for p in line], [p.error for p in line], marker="o", color=f"C{i}",
                        ls=styles[k % len(styles)], label=f"{plural(h, 'head')} of rank {r}, {plural(depth, 'layer')}")
                rows += [dict(variant=p.v.name, layers=depth, rank=r, heads=h, n_points=p.n, loss=p.error,
                              learned_nothing=p.baseline) for p in line]
        ns = sorted({p.n for p in pts})
        base_line = {p.n: p.baseline for p in self.points}
        ax.plot(ns, [base_line[n] for n in ns], color="k", ls="--", lw=1, label="learned nothing")
        ax.axhline(0, color="0.6", lw=0.6)
        log2_ticks(ax, ns)
        finish(ax, "points per sample N (sequence length)", "final eval error",
               f"Error vs sequence length (d = {pts[0].d})", legend=None)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        doc.figure("error_vs_seqlen", fig, rows, "Error against the number of points for a full-rank head and for "
                   "low-rank heads, by depth; dashed: the learned-nothing level at each N.")
        for depth in layer_set:
            for (r, h) in multi:
                line = sorted((p for p in pts if (p.rank, p.heads) == (r, h) and p.layers == depth), key=lambda p: p.n)
                if len(line) > 1:
                    findings.append(f"{plural(h, 'head')} of rank {r}, {plural(depth, 'layer')}: error "
                                    + ", ".join(f"{p.error:.3f} at N={p.n}" for p in line)
                                    + " (learned nothing: " + ", ".join(f"{p.baseline:.3f}" for p in line) + ").")
        return findings

    def _table(self, doc: Document) -> None:
        """Every point with its learning rate (when they differ), error and pick accuracy."""
        doc.add("## Rank table", "Pick accuracy: the share of held-out tokens whose output is closest to the right "
                "point (first evaluation batch, seed 0).")
        lr = {p.v.name: p.v.done[0].lr for p in self.points}
        show_lr = len(set(lr.values())) > 1  # e.g. deeper models trained at a lower rate
        rows = []
        for p in sorted(self.points, key=lambda p: (p.n, p.layers, p.width, p.rank)):
            acc = self.probes.pick_accuracy(p.v.done[0])
            rows.append([f"`{p.v.name}`", p.layers, p.heads, p.rank, f"{p.width:g}", p.n]
                        + ([lr[p.v.name]] if show_lr else [])
                        + [fmt_params(p.v.params), seed_cell(p.v.stats), f"{p.baseline:.3f}", fmt(acc, 3)])
        doc.table(["variant", "layers", "heads", "rank", "width", "N"] + (["lr"] if show_lr else [])
                  + ["params", "final error", "learned nothing", "pick accuracy"], rows)
        if self.study.record.seeds < 2:
            doc.add("**Each configuration was trained with one seed, so no claim can be made about whether "
                    "the differences exceed seed-to-seed noise; rerun with `--seeds 3` to test them.**")
