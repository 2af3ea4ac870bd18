"""Tuning by one rule (pure logic, no training): the lr grid, its extension until the optimum is bracketed,
and the choice of lr* (a quadratic in ln lr through the best point and its neighbours, or the best point).

The rule (arXiv 1910.11758 and the AlgoPerf rules for equal tuning effort; the public follow-up "Retuning
the Linear Baseline at GPT-3 Large" (GitHub fork 25simsa1/1beyond_query_linearity, 2026) for the quadratic):

* the grid is log-spaced in x2 steps: ``centre * 2**k`` for ``points`` consecutive k around 0;
* every grid point is trained on every tuning seed; its score is the mean final val loss (nats) over
  those seeds, and a point with any diverged (or missing-loss) seed is *lost*: score +inf;
* while the best point lies on an edge of the grid, the grid grows by one x2 step beyond that edge,
  until the best point has a worse neighbour on each side (*bracketed*) or the grid holds
  ``max_points`` points (*not bracketed*); when every point is lost the grid grows downwards
  (a lost point is one whose lr is too high for this arm);
* lr* is the vertex exp(-B / 2A) of y = A x^2 + B x + C, x = ln lr, through the best point and its
  two neighbours, when the optimum is bracketed, A > 0 and the vertex lies between the neighbours;
  otherwise (rule ``best``, or any of these failing) the best grid point.  A is the curvature in
  nats per (ln lr)^2, and A (ln 2)^2 is the predicted loss of missing the optimum by a factor 2.

Why the vertex by default: on a x2 grid the best point can lie up to a factor sqrt(2) from the true
optimum (a predicted cost of up to A (ln 2)^2 / 4), and the vertex uses the three best-informed points
instead of one; bounded to the bracket, it never moves lr* more than one grid step from the best
point.  Both values are written to the tuning table, so the choice can be re-made from the evidence
(``tune.rule``).
"""
from __future__ import annotations

import math

import numpy as np

from study.config.naming import lr_key

#: the lr* rules: "vertex" (the quadratic's vertex where it is defined, else the best point), "best"
RULES = ("vertex", "best")
#: grid statuses
BRACKETED, EXTEND, NOT_BRACKETED = "bracketed", "extend", "optimum not bracketed"
LOST = "lost"


def canonical(lr: float) -> float:
    """``lr`` rounded to :func:`lr_key`'s digits, so that grids built by doubling and halving meet exactly."""
    return float(lr_key(lr))


def initial_grid(centre: float, points: int) -> list[float]:
    """``points`` learning rates in x2 steps around ``centre``: ``centre * 2**k``, k = -(points-1)//2 ...

    >>> initial_grid(3e-3, 3)
    [0.0015, 0.003, 0.006]

    Raises:
        ValueError: centre <= 0 or points < 1.
    """
    if not centre > 0 or points < 1:
        raise ValueError(f"an lr grid needs centre > 0 and points >= 1 (got {centre}, {points})")
    lo = -((points - 1) // 2)
    return [canonical(centre * 2.0 ** k) for k in range(lo, lo + points)]


def score(losses: list[float | None]) -> float:
    """The score of one grid point: the mean of its seeds' final val losses (nats); +inf (lost) when a
    seed diverged (None or a non-finite loss) or there is none."""
    if not losses or any(x is None or not math.isfinite(x) for x in losses):
        return math.inf
    return float(np.mean(losses))


def best_index(lrs: list[float], scores: list[float]) -> int | None:
    """Index of the lowest finite score (ties: the smaller lr), None when every point is lost."""
    finite = [i for i, s in enumerate(scores) if math.isfinite(s)]
    return min(finite, key=lambda i: (scores[i], lrs[i])) if finite else None


def grid_status(lrs: list[float], scores: list[float], max_points: int) -> tuple[str, float | None]:
    """Whether the grid (sorted ``lrs`` with their ``scores``) brackets its optimum, and where to extend.

    Returns:
        (BRACKETED, None): the best point has a worse neighbour on each side;
        (EXTEND, lr): add this lr (x2 beyond the edge holding the best point; below the lowest when
        every point is lost);
        (NOT_BRACKETED, None): the best point is on an edge (or every point is lost) and the grid
        already holds ``max_points`` points.
    """
    i = best_index(lrs, scores)
    if i is not None and 0 < i < len(lrs) - 1:
        return BRACKETED, None
    if len(lrs) >= max_points:
        return NOT_BRACKETED, None
    if i is None or i == 0:
        return EXTEND, canonical(lrs[0] / 2)
    return EXTEND, canonical(lrs[-1] * 2)


def quadratic(lrs: list[float], scores: list[float]) -> dict:
    """The parabola y = A x^2 + B x + C, x = ln lr, through three points (exact interpolation).

    Returns: {"A" (nats per (ln lr)^2), "B", "C", "vertex" (exp(-B / 2A), None when A <= 0: no
    minimum), "miss_cost_x2" (A (ln 2)^2, nats: the predicted loss of an lr a factor 2 from the
    vertex), "vertex_loss" (the parabola at its vertex, None when A <= 0)}.

    Raises:
        ValueError: not three distinct finite points.
    """
    x = np.log(np.asarray(lrs, dtype=float))
    y = np.asarray(scores, dtype=float)
    if len(x) != 3 or len(set(x.tolist())) != 3 or not np.all(np.isfinite(y)):
        raise ValueError("the quadratic needs three distinct learning rates with finite losses")
    a, b, c = (float(v) for v in np.polyfit(x, y, 2))
    out = {"A": a, "B": b, "C": c, "miss_cost_x2": a * math.log(2) ** 2, "vertex": None, "vertex_loss": None}
    if a > 0:
        xv = -b / (2 * a)
        out["vertex"] = math.exp(xv)
        out["vertex_loss"] = a * xv * xv + b * xv + c
    return out


def choose(lrs: list[float], scores: list[float], max_points: int, rule: str = "vertex") -> dict:
    """lr* of one arm's grid by the rule of this module.

    Args:
        lrs, scores: the grid (any order) and each point's score (:func:`score`, +inf = lost).
        rule: "vertex" or "best" (:data:`RULES`).

    Returns: {"status" (BRACKETED / NOT_BRACKETED; EXTEND when the grid is not finished), "best_lr",
    "best_loss", "fit" (:func:`quadratic` through the best point and its neighbours, None when they
    are not three finite points), "lr_star", "source" ("vertex" or "best point") and "why" (the
    reason the vertex was not taken, None when it was)}; lr_star is None when every point is lost.

    Raises:
        ValueError: an unknown rule.
    """
    if rule not in RULES:
        raise ValueError(f"unknown lr* rule {rule!r}: choose one of {list(RULES)}")
    order = sorted(range(len(lrs)), key=lambda i: lrs[i])
    lrs, scores = [lrs[i] for i in order], [scores[i] for i in order]
    status, _ = grid_status(lrs, scores, max_points)
    i = best_index(lrs, scores)
    out = {"status": status, "best_lr": None if i is None else lrs[i],
           "best_loss": None if i is None else scores[i], "fit": None, "lr_star": None, "source": None,
           "why": None}
    if i is None:
        out["why"] = "every point is lost"
        return out
    out.update(lr_star=lrs[i], source="best point")
    if 0 < i < len(lrs) - 1 and all(math.isfinite(s) for s in scores[i - 1:i + 2]):
        out["fit"] = quadratic(lrs[i - 1:i + 2], scores[i - 1:i + 2])
    if rule == "best":
        out["why"] = "tune.rule is best"
    elif status != BRACKETED:
        out["why"] = "the optimum is not bracketed"
    elif out["fit"] is None:
        out["why"] = "a neighbour of the best point is lost"
    elif out["fit"]["vertex"] is None:
        out["why"] = "the parabola has no minimum (A <= 0)"
    elif not lrs[i - 1] <= out["fit"]["vertex"] <= lrs[i + 1]:
        out["why"] = "the vertex lies outside the bracket"
    else:
        out.update(lr_star=out["fit"]["vertex"], source="vertex")
    return out


def tune_arm(evaluate, centre: float, points: int, max_points: int) -> tuple[list[float], list[float], str]:
    """Run the grid rule: score the initial grid, extend it until bracketed or at ``max_points``.

    Args:
        evaluate: ``lr -> score`` (nats, +inf = lost); called once per grid point, in the order the
            rule needs them (the initial grid from low to high, then each extension).

    Returns: (the sorted lrs, their scores, the final status: BRACKETED or NOT_BRACKETED).
    """
    grid = {lr: evaluate(lr) for lr in initial_grid(centre, min(points, max_points))}
    while True:
        lrs = sorted(grid)
        scores = [grid[x] for x in lrs]
        status, new = grid_status(lrs, scores, max_points)
        if status != EXTEND:
            return lrs, scores, status
        grid[new] = evaluate(new)
