"""The search report's figures: each function returns a matplotlib figure, the rows of what it
draws and its caption (saved as PNG and CSV by :meth:`headwise.report.document.Document.figure`).

Figures use matplotlib's object API with the Agg canvas, like the study report's: no display and
no global pyplot state.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Sequence

from headwise.report.document import new_figure, plural

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from headwise.search.record import Objective, Trial

Rows = list[dict[str, Any]]
Drawn = tuple["Figure", Rows, str]


def best_so_far(values: Sequence[float], direction: str) -> list[float]:
    """The running best of ``values`` (the lowest for "minimize", the highest for "maximize")."""
    out: list[float] = []
    for v in values:
        better = not out or (v < out[-1] if direction == "minimize" else v > out[-1])
        out.append(v if better else out[-1])
    return out


def history_figure(objectives: Sequence[Objective], trials: Sequence[Trial]) -> Drawn:
    """Each objective by trial number: complete trials (named schemes labelled), pruned ones at
    their last reported value, and the best complete value so far."""
    fig, axes = new_figure(height=3.2 * len(objectives), nrows=len(objectives))
    rows: Rows = []
    for ax, o in zip(axes[:, 0], objectives):
        done = sorted((t for t in trials if t.state == "complete" and t.value(o.metric) is not None),
                      key=lambda t: t.number)
        pruned = [t for t in trials if t.state == "pruned" and t.value(o.metric) is not None]
        xs, ys = [t.number for t in done], [t.value(o.metric) for t in done]
        ax.plot(xs, ys, "o", color="tab:blue", ms=4, label="complete")
        if pruned:
            ax.plot([t.number for t in pruned], [t.value(o.metric) for t in pruned], "x", color="tab:gray",
                    label="pruned (last reported)")
        running = best_so_far(ys, o.direction)  # type: ignore[arg-type]
        if done:
            ax.step(xs, running, where="post", color="tab:red", lw=1.5, label="best so far")
        for t in done:
            if t.named:
                ax.annotate(t.named, (t.number, t.value(o.metric)), textcoords="offset points", xytext=(4, 4),
                            fontsize=7)
        ax.set_xlabel("trial")
        ax.set_ylabel(f"{o.metric} ({o.direction})")
        if done or pruned:
            ax.legend(fontsize=7, loc="best")
        best = dict(zip(xs, running))
        rows += [{"objective": o.metric, "trial": t.number, "state": t.state, "named": t.named or "",
                  "value": t.value(o.metric), "best_so_far": best.get(t.number)}
                 for t in sorted(done + pruned, key=lambda t: t.number)]
    return fig, rows, ("Each trial's objective value by trial number (pruned trials at their last reported value), "
                       "and the best complete value so far.")


def pareto_figure(objectives: Sequence[Objective], trials: Sequence[Trial], front: Sequence[int]) -> Drawn:
    """The complete trials in the first two objectives, the front (indices into ``trials``) in red
    and joined in order of the first."""
    fig, axes = new_figure(width=6.0, height=4.6)
    ax = axes[0, 0]
    x, y = objectives[0].metric, objectives[1].metric
    on = set(front)
    ax.plot([t.value(x) for t in trials], [t.value(y) for t in trials], "o", color="tab:gray", ms=4, label="trials")
    best = sorted((trials[i] for i in front), key=lambda t: t.value(x))  # type: ignore[arg-type, return-value]
    ax.plot([t.value(x) for t in best], [t.value(y) for t in best], "o-", color="tab:red", ms=5, label="Pareto front")
    for t in best:
        ax.annotate(str(t.number) + (f" {t.named}" if t.named else ""), (t.value(x), t.value(y)),
                    textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xlabel(f"{x} ({objectives[0].direction})")
    ax.set_ylabel(f"{y} ({objectives[1].direction})")
    ax.legend(fontsize=7, loc="best")
    rows = [{"trial": t.number, "named": t.named or "", **{o.metric: t.value(o.metric) for o in objectives},
             "on_front": i in on} for i, t in enumerate(trials)]
    over = " (the front is over all objectives)" if len(objectives) > 2 else ""
    return fig, rows, f"Complete trials in {x} and {y}, the Pareto front highlighted{over}."


def heads_heatmap(plans: Sequence[Trial], metric: str) -> Drawn:
    """Plans as rows (best on top), layers as columns, heads per layer as colour with the number
    written in each cell; a layer a plan does not have stays blank."""
    import numpy as np

    depth = max(len(t.plan.heads) for t in plans)
    grid = np.ma.masked_invalid([[float(t.plan.heads[k]) if k < len(t.plan.heads) else math.nan for k in range(depth)]
                                 for t in plans])
    fig, axes = new_figure(width=max(4.0, 1.6 + 0.55 * depth), height=max(2.2, 1.0 + 0.42 * len(plans)))
    ax = axes[0, 0]
    image = ax.imshow(grid, cmap="viridis", aspect="auto")
    for r, t in enumerate(plans):
        for k, h in enumerate(t.plan.heads):
            ax.text(k, r, str(h), ha="center", va="center", fontsize=7,
                    color="white" if image.norm(h) < 0.6 else "black")  # legible on viridis' dark and light ends
    ax.set_xticks(range(depth))
    ax.set_xticklabels([str(k) for k in range(depth)])
    ax.set_yticks(range(len(plans)))
    ax.set_yticklabels([f"#{r} trial {t.number}" + (f" ({t.named})" if t.named else "")
                        for r, t in enumerate(plans, 1)], fontsize=7)
    ax.set_xlabel("layer")
    fig.colorbar(image, ax=ax, label="heads")
    rows = [{"rank": r, "trial": t.number, "named": t.named or "", metric: t.value(metric),
             **{f"layer{k}": (t.plan.heads[k] if k < len(t.plan.heads) else None) for k in range(depth)}}
            for r, t in enumerate(plans, 1)]
    return fig, rows, (f"Heads per layer of the {plural(len(plans), 'best distinct plan')} by {metric}, best on top "
                       "(blank: the plan has no such layer).")


def importances_figure(names: Sequence[str], params: Sequence[dict[str, float]],
                       layers: Sequence[dict[str, float]]) -> Drawn:
    """For each objective (a row of panels): the importance of each param, and summed per layer."""
    n = max(len(params[0]), len(layers[0]))
    fig, axes = new_figure(width=9.0, height=max(2.4, 0.8 + 0.22 * n) * len(names), ncols=2, nrows=len(names))
    rows: Rows = []
    for row, (name, p, l) in enumerate(zip(names, params, layers)):
        for ax, what, data in ((axes[row, 0], "param", p), (axes[row, 1], "layer", l)):
            keys = list(data)[::-1]  # barh draws bottom up: the first key on top
            ax.barh(range(len(keys)), [data[k] for k in keys], color="tab:blue")
            ax.set_yticks(range(len(keys)))
            ax.set_yticklabels(keys, fontsize=7)
            ax.set_xlabel(f"importance for {name}")
            ax.set_title(f"per {what}", fontsize=9)
            rows += [{"objective": name, "per": what, "name": k, "importance": data[k]} for k in data]
    return fig, rows, "Parameter importances (fANOVA) per param and summed per layer, one row of panels per objective."
