"""Statistics checked against textbook and hand-computed values (no database needed)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from annotation import stats

N = None


def test_wilson_interval_known_values():
    # 5 of 10 at 95%: the textbook (0.2366, 0.7634); 0 of 10: (0, 0.2775) — never the Wald "0 ± 0".
    lo, hi = stats.wilson_interval(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)
    lo, hi = stats.wilson_interval(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)
    assert stats.wilson_interval(0, 0) == (0.0, 1.0)


def test_cohen_kappa_textbook_example():
    # Wikipedia "Cohen's kappa": 50 proposals, yes/yes 20, yes/no 5, no/yes 10, no/no 15 -> p_o=0.7, p_e=0.5.
    a = ["yes"] * 25 + ["no"] * 25
    b = ["yes"] * 20 + ["no"] * 5 + ["yes"] * 10 + ["no"] * 15
    assert stats.cohen_kappa(a, b) == pytest.approx(0.4)
    assert stats.cohen_kappa(["x", "x"], ["x", "x"]) is None  # p_e = 1: undefined, not a division by zero


def test_fleiss_kappa_wikipedia_worked_example():
    table = [
        [0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0], [2, 2, 8, 1, 1],
        [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2], [6, 5, 2, 1, 0], [0, 2, 2, 3, 7],
    ]  # fmt: skip
    assert stats.fleiss_kappa(table) == pytest.approx(0.210, abs=5e-4)
    # From per-item labels the same table is rebuilt.
    items = [[c for c, k in enumerate(row) for _ in range(k)] for row in table]
    assert stats.fleiss_kappa(stats.ratings_to_table(items, categories=range(5))) == pytest.approx(
        0.2099, abs=1e-4
    )


def _units(*coders):
    return [[x for x in col if x is not None] for col in zip(*coders)]


def test_krippendorff_alpha_paper_example():
    # Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", 4 observers x 12 units:
    # nominal .743, ordinal .815, interval .849.
    a = [1, 2, 3, 3, 2, 1, 4, 1, 2, N, N, N]
    b = [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, N, 3]
    c = [N, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, N]
    d = [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, N]
    units = _units(a, b, c, d)
    assert stats.krippendorff_alpha(units, "nominal") == pytest.approx(0.743, abs=5e-4)
    assert stats.krippendorff_alpha(units, "ordinal") == pytest.approx(0.815, abs=5e-4)
    assert stats.krippendorff_alpha(units, "interval") == pytest.approx(0.849, abs=5e-4)


def test_krippendorff_alpha_wikipedia_example():
    # Wikipedia "Krippendorff's alpha": 3 coders x 15 units; nominal 0.691, interval 0.811.
    a = [N, N, N, N, N, 3, 4, 1, 2, 1, 1, 3, 3, N, 3]
    b = [1, N, 2, 1, 3, 3, 4, 3, N, N, N, N, N, N, N]
    c = [N, N, 2, 1, 3, 4, 4, N, 2, 1, 1, 3, 3, N, 4]
    units = _units(a, b, c)
    assert stats.krippendorff_alpha(units, "nominal") == pytest.approx(0.691, abs=5e-4)
    assert stats.krippendorff_alpha(units, "interval") == pytest.approx(0.811, abs=5e-4)
    # Perfect agreement is 1; ordinal respects a custom order of labels.
    assert (
        stats.krippendorff_alpha([["lo", "lo"], ["hi", "hi"], ["mid", "mid"]], "ordinal", ["lo", "mid", "hi"])
        == 1.0
    )
    with pytest.raises(ValueError, match="unknown level"):
        stats.krippendorff_alpha(units, "ratio-ish")


def test_bradley_terry_two_players_closed_form():
    # A beats B 3 times of 4: MLE odds 3, Elo-scale gap 400*log10(3) = 190.85 (prior_sd=None: the MLE).
    r = stats.bradley_terry([("A", "B", "a")] * 3 + [("A", "B", "b")], n_bootstrap=0, prior_sd=None)
    gap = r["rating"][0] - r["rating"][1]
    assert gap == pytest.approx(400 * math.log10(3), abs=0.01)
    assert sum(r["rating"]) / 2 == pytest.approx(1000)
    # Ties count half a win each: 2 wins + 2 ties = 3 of 4 points, the same gap.
    r2 = stats.bradley_terry(
        [("A", "B", "a")] * 2 + [("A", "B", "tie"), ("B", "A", "both_bad")], n_bootstrap=0, prior_sd=None
    )
    assert r2["rating"][0] - r2["rating"][1] == pytest.approx(gap, abs=0.01)


def test_bradley_terry_small_tournament_score_equations_and_ranks():
    # Round robin, 10 games per pair: A-B 7:3, A-C 8:2, B-C 6:4. At the MLE every player's expected
    # number of wins equals their observed wins (the BT likelihood equations).
    games = {("A", "B"): 7, ("A", "C"): 8, ("B", "C"): 6}
    comps = []
    for (x, y), w in games.items():
        comps += [(x, y, "a")] * w + [(x, y, "b")] * (10 - w)
    r = stats.bradley_terry(comps, n_bootstrap=200, seed=1, prior_sd=None)
    rating = dict(zip(r["systems"], r["rating"]))
    observed = {"A": 15, "B": 9, "C": 6}
    for p in "ABC":
        expected = sum(10 * stats.bt_win_probability(rating[p], rating[q]) for q in "ABC" if q != p)
        assert expected == pytest.approx(observed[p], abs=1e-3)
    assert rating["A"] > rating["B"] > rating["C"]
    for i in range(3):
        assert r["low"][i] <= r["rating"][i] <= r["high"][i]
    # With 10 games per pair, A's interval clears C's: A ranks 1, C's rank is below A's.
    ranks = dict(zip(r["systems"], r["rank"]))
    assert ranks["A"] == 1 and ranks["C"] > 1


def test_bradley_terry_undefeated_player_stays_finite():
    r = stats.bradley_terry([("A", "B", "a")] * 5, n_bootstrap=20)
    assert all(math.isfinite(x) for x in r["rating"] + r["low"] + r["high"])
    assert r["rating"][0] > r["rating"][1]


def test_bradley_terry_prior_solves_the_map_equations_in_closed_form():
    # Two players, A wins w of n: the MAP under θ ~ N(0, sd²) with θ_A = t = −θ_B solves
    # (w − n σ(2t)) = t / sd². Check the fitted gap against a root found by bisection.
    for w, n, sd in [(1, 1, 1.0), (3, 4, 1.0), (9, 10, 0.5), (40, 50, 2.0)]:
        r = stats.bradley_terry(
            [("A", "B", "a")] * w + [("A", "B", "b")] * (n - w), n_bootstrap=0, prior_sd=sd
        )
        lo, hi = 0.0, 20.0
        for _ in range(200):
            t = (lo + hi) / 2
            if w - n / (1 + math.exp(-2 * t)) - t / sd**2 > 0:
                lo = t
            else:
                hi = t
        assert r["rating"][0] - r["rating"][1] == pytest.approx(2 * t * 400 / math.log(10), abs=0.01)


def test_one_judgment_gives_a_modest_gap_and_a_wide_interval():
    """Issue 13: one judgment gave 2044 vs −44 with a zero-width interval and ranks 1/2."""
    r = stats.bradley_terry([("A", "B", "a")], n_bootstrap=1000)
    gap = r["rating"][0] - r["rating"][1]
    assert 50 < gap < 200  # measured 117
    assert all(h - lo > 300 for lo, h in zip(r["low"], r["high"]))  # measured ~400 wide
    assert r["rank"] == [1, 1]  # the intervals overlap: no ranking from one judgment
    # One system always winning (separated data): the bootstrap alone is zero-width, the interval is not.
    r5 = stats.bradley_terry([("A", "B", "a")] * 5, n_bootstrap=200)
    assert all(h - lo > 200 for lo, h in zip(r5["low"], r5["high"]))
    assert all(math.isfinite(x) for x in r5["rating"] + r5["low"] + r5["high"])


def test_bradley_terry_with_lots_of_data_matches_an_independent_fit():
    """With ~1,000 comparisons per system the prior's pull is a few rating points: the ratings match
    a maximum-likelihood fit by scipy's general-purpose optimiser on the same likelihood."""
    from scipy.optimize import minimize

    rng = np.random.default_rng(3)
    true = {"A": 0.8, "B": 0.3, "C": 0.0, "D": -0.6}
    names = list(true)
    comps = []
    for _ in range(2000):
        i, j = rng.choice(4, size=2, replace=False)
        p = 1 / (1 + math.exp(-(true[names[i]] - true[names[j]])))
        comps.append((names[i], names[j], "a" if rng.random() < p else "b"))
    r = stats.bradley_terry(comps, names, n_bootstrap=200)

    def nll(theta: np.ndarray) -> float:
        t = dict(zip(names, theta))
        return -sum(
            math.log(1 / (1 + math.exp(-(t[a] - t[b]) if o == "a" else (t[a] - t[b])))) for a, b, o in comps
        )

    fit = minimize(nll, np.zeros(4), method="BFGS").x
    fit = 1000 + (fit - fit.mean()) * 400 / math.log(10)
    assert np.max(np.abs(np.array(r["rating"]) - fit)) < 5  # Elo points; measured < 2
    assert r["rank"][0] == 1 and r["rank"][3] == 4  # clearly separated ends are ranked
    for i in range(4):
        assert r["low"][i] < fit[i] < r["high"][i]


def test_win_rate_matrix_counts_ties_half_with_intervals():
    comps = [("x", "y", "a"), ("x", "y", "a"), ("y", "x", "tie"), ("x", "y", "b")]
    m = stats.win_rate_matrix(comps)
    assert m["systems"] == ["x", "y"]
    assert m["counts"][0][1] == 4 and m["wins"][0][1] == 2.5 and m["wins"][1][0] == 1.5
    assert m["rate"][0][1] == pytest.approx(0.625)
    assert (m["low"][0][1], m["high"][0][1]) == pytest.approx(stats.wilson_interval(2.5, 4))
    assert m["rate"][0][0] is None


def test_likert_means_t_interval():
    res = stats.likert_means([("s1", "fluency", v) for v in (1, 2, 3, 4, 5)] + [("s2", "fluency", 4)])
    s1 = res["fluency"]["s1"]
    # mean 3, sd sqrt(2.5), t(0.975, 4) = 2.776 -> half width 2.776*1.5811/sqrt(5) = 1.963
    assert s1["mean"] == 3 and s1["high"] - 3 == pytest.approx(1.963, abs=1e-3)
    assert res["fluency"]["s2"]["n"] == 1


def test_annotator_stats_gold_and_leave_one_out_majority():
    rows = [
        {"annotator": "u1", "item": 1, "label": "a", "seconds": 4, "gold": "a"},
        {"annotator": "u2", "item": 1, "label": "a", "seconds": 6, "gold": "a"},
        {"annotator": "u3", "item": 1, "label": "b", "seconds": 8, "gold": "a"},
        {"annotator": "u1", "item": 2, "label": "b", "seconds": 10},
        {"annotator": "u2", "item": 2, "label": "b", "seconds": 2},
    ]
    by = {r["annotator"]: r for r in stats.annotator_stats(rows)}
    assert by["u1"]["count"] == 2 and by["u1"]["median_seconds"] == 7
    assert by["u3"]["gold_accuracy"] == 0.0 and by["u1"]["gold_accuracy"] == 1.0
    # u3 vs the others' majority "a" on item 1: disagrees. u1 on item 1: others are a,b (no majority).
    assert by["u3"]["majority_agreement"] == 0.0 and by["u3"]["majority_n"] == 1
    assert by["u1"]["majority_n"] == 1 and by["u1"]["majority_agreement"] == 1.0
    assert stats.pairwise_cohen({"u1": {1: "a", 2: "b"}, "u2": {1: "a", 2: "b"}})[0]["kappa"] == 1.0


def test_metric_human_agreement_and_tau():
    pairs = [
        {"human": "a", "metrics": {"m": (0.9, 0.1), "len": (3, 3)}},
        {"human": "b", "metrics": {"m": (0.2, 0.8), "len": (5, 1)}},
        {"human": "a", "metrics": {"m": (0.1, 0.5), "len": (1, 2)}},
        {"human": "tie", "metrics": {"m": (0.1, 0.5)}},  # undecided: skipped
    ]
    res = stats.metric_human_agreement(pairs)
    assert res["m"]["n"] == 3 and res["m"]["agreement"] == pytest.approx(2 / 3)
    assert res["m"]["tau"] == pytest.approx((2 - 1) / 3)
    assert res["len"]["agreement"] == pytest.approx(0.5 / 3) and res["len"]["tau"] == -1.0
