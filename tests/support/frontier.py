"""The Pareto frontier by its definition, the reference `analysis.ranking.pareto_mask` and the figures' ring are
checked against."""

from __future__ import annotations


def brute_force_frontier(points: list[tuple[float, float]]) -> set[tuple[float, float]]:
    """Non-dominated (memory, accuracy) points by definition: less memory is better, more accuracy is better."""
    return {p for p in points if not any(q[0] <= p[0] and q[1] >= p[1] and q != p for q in points)}
