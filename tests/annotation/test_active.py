"""The adaptive pair score (annotation/active.py) against hand-derived values (no database).

For two systems the posterior covariance along y = e_0 − e_1 is 1 / (2·n·w + 1) (n comparisons,
w = p(1 − p) at the fitted strengths, prior precision 1), which gives the score in closed form:
    score = 2w / ((2nw + 1) · (2(n + 1)w + 1)).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import brentq

from annotation import active


def test_no_data_two_systems_is_one_third():
    # Prior only: C = centred identity, y'Cy = 2, |Cy|² = 2, w = 1/4 -> (1/4·2) / (1 + 1/4·2) = 1/3.
    scores = active.pair_scores(np.zeros((2, 2)))
    assert scores[0, 1] == pytest.approx(1 / 3) and scores[1, 0] == pytest.approx(1 / 3)
    assert scores[0, 0] == 0.0


def test_three_to_one_record_matches_the_closed_form():
    wins = np.array([[0.0, 3.0], [1.0, 0.0]])
    # MAP difference d = θ0 − θ1 under θ ~ N(0, 1): 3 − 4σ(d) − d/2 = 0 (each θ is ±d/2).
    sig = lambda d: 1.0 / (1.0 + math.exp(-d))  # noqa: E731
    d = brentq(lambda d: 3 - 4 * sig(d) - d / 2, -10, 10)
    w = sig(d) * (1 - sig(d))
    n = 4
    expected = 2 * w / ((2 * n * w + 1) * (2 * (n + 1) * w + 1))
    assert active.pair_scores(wins)[0, 1] == pytest.approx(expected, rel=1e-9)
    # More judgments of the same pair are worth less (diminishing returns).
    assert active.pair_scores(wins * 3)[0, 1] < expected


def test_close_uncertain_pair_beats_a_settled_lopsided_one():
    # s0 beat s1 20-0 and s0 beat s2 20-0; s1 and s2 split 5-5: the informative comparison is s1 vs s2.
    wins = np.zeros((3, 3))
    wins[0, 1] = wins[0, 2] = 20
    wins[1, 2] = wins[2, 1] = 5
    scores = active.pair_scores(wins)
    assert scores[1, 2] > scores[0, 1] and scores[1, 2] > scores[0, 2]
    assert active.pair_order(scores, ["s0", "s1", "s2"])[0] == ("s1", "s2")


def test_an_unlinked_pair_is_worth_more_than_a_well_measured_one_of_equal_closeness():
    # s0-s1 compared 40 times (20-20), s2-s3 twice (1-1), s1-s2 40 times (20-20): all fitted equal,
    # so w is the same everywhere and the poorly known s3 makes its pairs the valuable ones.
    wins = np.zeros((4, 4))
    wins[0, 1] = wins[1, 0] = 20
    wins[1, 2] = wins[2, 1] = 20
    wins[2, 3] = wins[3, 2] = 1
    scores = active.pair_scores(wins)
    best = active.pair_order(scores, [0, 1, 2, 3], limit=1)[0]
    assert 3 in best
    assert scores[0, 1] < scores[2, 3]


def test_win_matrix_counts_ties_half_and_ignores_unknown_systems():
    rows = [("x", "y", "a", 3), ("y", "x", "tie", 2), ("x", "y", "both_bad", 1), ("good", "bad", "a", 5)]
    wins = active.win_matrix(rows, ["x", "y"])
    assert wins[0, 1] == pytest.approx(3 + 1 + 0.5)
    assert wins[1, 0] == pytest.approx(1 + 0.5)
    assert wins[0, 0] == wins[1, 1] == 0.0
