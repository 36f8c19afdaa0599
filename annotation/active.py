"""Active choice of comparisons: which pair of systems is worth the next pairwise judgment.

Pure functions (numpy only, no Django), so that ``bench/adaptive_pairs.py`` simulates campaigns with
exactly the rule the server applies in ``assignment.next_item`` and the unit tests can check it
against hand-computed values.

The rule. Fit Bradley–Terry log-strengths θ to the judgments so far (the results page's fit: ties
half a win, weak N(0, 1) prior, so the fit exists from the first judgment on) and take the Laplace
posterior covariance of the centred strengths, C (the inverse curvature of the penalised likelihood,
centred like the ratings). One more comparison of systems i and j adds Fisher information
w = p(1 − p) along y = e_i − e_j, p being the fitted probability that i wins, and by
Sherman–Morrison lowers the summed variance of all systems' scores by

    score(i, j) = w · |C y|² / (1 + w · yᵀ C y).

That is the expected reduction of Bradley–Terry score variance, i.e. of the squared interval widths
the results page shows (the greedy step of an A-optimal design). It prefers pairs that are close
(p(1 − p) near 1/4, so the outcome is informative) and whose systems are still poorly known (large
C), and it sees that comparing two uncertain systems also tightens every system linked to them. It
costs one fit and one k × k inverse per call, then O(k) per pair: never a fit per candidate.

Exploration floor: with probability ``explore`` the caller serves the uniform order instead (the
least-judged item, as in a uniform campaign), so every pair keeps being sampled and no pair's
comparison count can stall at zero because the fit once thought its order settled.

Why the ranking stays unbiased: the choice of the next pair depends only on outcomes already
observed (and on an independent coin), never on the outcome it is about to produce. The likelihood
of the observed data then factorises into the Bradley–Terry terms times the design's probabilities,
which do not involve θ, so the maximum-likelihood fit and its intervals are those of the same data
collected by a fixed design ("ignorable design", as in sequential experiments and adaptive testing).
docs/annotation.md says more; the simulation checks it.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

import numpy as np

from annotation import stats

# The exploration floor: the share of requests that follow the uniform (least-judged) order.
DEFAULT_EXPLORE = 0.1


def win_matrix(
    counts: Iterable[tuple[Hashable, Hashable, str, float]], systems: Sequence[Hashable]
) -> np.ndarray:
    """``wins[i, j]``: system i's points against j from ``(system_a, system_b, outcome, count)`` rows
    (one aggregate query's output); ties and both-bad give half a point to each side, as in the fit.
    Rows naming a system outside ``systems`` (gold items' "good"/"bad") are ignored."""
    idx = {s: i for i, s in enumerate(systems)}
    wins = np.zeros((len(idx), len(idx)))
    for a, b, outcome, n in counts:
        i, j = idx.get(a), idx.get(b)
        if i is None or j is None or i == j:
            continue
        s = stats._score(outcome)
        wins[i, j] += n * s
        wins[j, i] += n * (1.0 - s)
    return wins


def pair_scores(wins: np.ndarray, prior_sd: float = stats.DEFAULT_PRIOR_SD) -> np.ndarray:
    """Symmetric k × k matrix: the expected drop of the summed score variance if i and j are
    compared once more (see the module docstring); the diagonal is 0. Deterministic in ``wins``, so
    the server and the simulation rank pairs identically."""
    wins = np.asarray(wins, dtype=float)
    k = wins.shape[0]
    if k < 2:
        return np.zeros((k, k))
    reg = 1.0 / (prior_sd * prior_sd)
    theta = stats._bt_fit(wins, reg)
    n = wins + wins.T
    p = 1.0 / (1.0 + np.exp(-(theta[:, None] - theta[None, :])))
    info = p * (1.0 - p)
    precision = np.diag((n * info).sum(axis=1)) - n * info + reg * np.eye(k)
    centre = np.eye(k) - 1.0 / k
    cov = centre @ np.linalg.inv(precision) @ centre
    iu, ju = np.triu_indices(k, 1)
    cy = cov[:, iu] - cov[:, ju]  # column m: C y for the pair (iu[m], ju[m])
    y_cov_y = cy[iu, np.arange(len(iu))] - cy[ju, np.arange(len(iu))]
    w = info[iu, ju]
    score = w * (cy**2).sum(axis=0) / (1.0 + w * y_cov_y)
    out = np.zeros((k, k))
    out[iu, ju] = score
    out[ju, iu] = score
    return out


def pair_order(scores: np.ndarray, systems: Sequence[Hashable], limit: int | None = None) -> list[tuple]:
    """The pairs ``(system_i, system_j)`` from most to least informative (ties broken by position,
    so the order is reproducible); at most ``limit`` of them."""
    k = len(systems)
    iu, ju = np.triu_indices(k, 1)
    vals = scores[iu, ju]
    order = sorted(range(len(iu)), key=lambda m: (-vals[m], m))
    if limit is not None:
        order = order[:limit]
    return [(systems[iu[m]], systems[ju[m]]) for m in order]
