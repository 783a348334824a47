"""Trials on several objectives: the Pareto front, non-dominated sorting and crowding distance
(NSGA-II's, Deb et al. 2002), and the ``k`` points the confirmation takes along the fronts.

Every function takes the points (one value per objective) and each objective's direction
(``minimize`` or ``maximize``) and answers with indices into the points. Light on purpose (no
Optuna), so the report and the confirmation share it.
"""

from __future__ import annotations

import math
from typing import Sequence

from headwise.search.record import oriented


def _keyed(points: Sequence[Sequence[float]], directions: Sequence[str]) -> list[list[float]]:
    """The points turned so that lower is better in every objective."""
    return [[oriented(v, d) for v, d in zip(p, directions)] for p in points]


def _dominates(a: list[float], b: list[float]) -> bool:
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))


def pareto_front(points: Sequence[Sequence[float]], directions: Sequence[str]) -> list[int]:
    """Indices of the non-dominated points: no other point is at least as good in every
    objective and better in one. Equal points do not dominate each other: both stay."""
    keyed = _keyed(points, directions)
    return [i for i, p in enumerate(keyed) if not any(_dominates(q, p) for q in keyed)]


def non_dominated_sort(points: Sequence[Sequence[float]], directions: Sequence[str]) -> list[list[int]]:
    """The points' fronts, best first: the non-dominated points, then those only they dominate,
    and so on (each front in index order)."""
    keyed, left, fronts = _keyed(points, directions), list(range(len(points))), []
    while left:
        front = [i for i in left if not any(_dominates(keyed[j], keyed[i]) for j in left)]
        fronts.append(front)
        left = [i for i in left if i not in front]
    return fronts


def crowding_distance(points: Sequence[Sequence[float]], front: list[int]) -> dict[int, float]:
    """NSGA-II's crowding distance of each point of ``front``: summed over the objectives, the gap
    between its two neighbours along that objective over the front's range in it; the points at
    either end of an objective (where the front's values differ) are infinitely far."""
    distance = {i: 0.0 for i in front}
    for m in range(len(points[front[0]]) if front else 0):
        ordered = sorted(front, key=lambda i: points[i][m])
        low, high = points[ordered[0]][m], points[ordered[-1]][m]
        if high == low:  # the objective does not tell these points apart
            continue
        distance[ordered[0]] = distance[ordered[-1]] = math.inf
        for before, i, after in zip(ordered, ordered[1:], ordered[2:]):
            distance[i] += (points[after][m] - points[before][m]) / (high - low)
    return distance


def pareto_select(points: Sequence[Sequence[float]], directions: Sequence[str], k: int) -> list[int]:
    """``k`` points along the Pareto fronts, as NSGA-II keeps its survivors: whole fronts, best
    first, while they fit; then, of the front that does not, the most isolated points (largest
    crowding distance; on a tie, the earlier point), so that the choice spreads along it."""
    chosen: list[int] = []
    for front in non_dominated_sort(points, directions):
        if len(chosen) + len(front) > k:
            distance = crowding_distance(points, front)
            front = sorted(front, key=lambda i: -distance[i])[:k - len(chosen)]
        chosen += front
        if len(chosen) == k:
            break
    return chosen
