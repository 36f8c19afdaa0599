"""Issue 26.7: when an AI judge's verdicts carry no information it is flagged, by thresholds with a
stated statistic (docs/annotation.md, "When an AI judge is uninformative"). Pure functions: the
exact binomial p-value against hand-computed values, and which agreement summaries warn."""

from __future__ import annotations

import math

from annotation import stats
from annotation.ai_judges import binomial_two_sided_p, judge_warnings


def _rows(n: int, first: str, second: str, human: str | None = None) -> list[dict]:
    """``n`` items whose passes won by position ``first`` (a shown first) and ``second`` (b first)."""
    choice = {("A", True): "a", ("B", True): "b", ("A", False): "b", ("B", False): "a"}
    return [
        {"passes": [(first, choice[(first, True)]), (second, choice[(second, False)])], "human": human}
        for _ in range(n)
    ]


def test_exact_binomial_p_values() -> None:
    assert binomial_two_sided_p(32, 32) == 2 / 2**32
    assert binomial_two_sided_p(0, 8) == binomial_two_sided_p(8, 8) == 2 / 256  # the smallest n below 0.01
    assert math.isclose(binomial_two_sided_p(7, 10), 2 * (1 + 10 + 45 + 120) / 1024)
    assert binomial_two_sided_p(5, 10) == 1.0 and binomial_two_sided_p(0, 0) == 1.0


def test_a_judge_that_always_picks_the_first_response_is_flagged_three_ways() -> None:
    agreement = stats.ai_judge_agreement(_rows(8, "A", "A", human="a") + _rows(8, "A", "A", human="b"))
    warnings = judge_warnings(agreement)
    assert len(warnings) == 3, warnings
    assert "first-shown response in 32 of 32 decided passes" in warnings[0] and "p = 4.7e-10" in warnings[0]
    assert warnings[1].startswith("Ties: 16 of 16 items")
    assert "κ = 0.00" in warnings[2]


def test_a_consistent_judge_a_mild_bias_and_a_small_sample_are_not_flagged() -> None:
    # Always system a, whichever side shows it: half the passes won by each position.
    assert judge_warnings(stats.ai_judge_agreement(_rows(20, "A", "B", human="a"))) == []
    # 60 % first-position wins over 200 passes: significant (p ≈ 0.005) but mild, absorbed by the swap.
    mild = _rows(20, "A", "A") + _rows(80, "A", "B")
    agreement = stats.ai_judge_agreement(mild)
    assert agreement["first_position_rate"] == 0.6
    assert not any(w.startswith("Position") for w in judge_warnings(agreement))
    # Three items, all first-position ties: too few to say anything.
    assert judge_warnings(stats.ai_judge_agreement(_rows(3, "A", "A"))) == []
