"""Statistics of human judgments: pure functions (numpy/scipy only, no Django).

Kept free of the ORM so every number on a results page can be checked against a textbook value in a
unit test, and so the same code can be reused from notebooks on exported judgments.

Outcomes of a pairwise judgment are written from the point of view of the (system_a, system_b)
pair as stored, never as shown on screen: ``"a"`` (a wins), ``"b"`` (b wins), ``"tie"`` and
``"both_bad"``. For win rates and Bradley–Terry, ties and both-bad count as half a win each, as in
Chatbot Arena.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Hashable, Iterable, Sequence
from statistics import median
from typing import Any

import numpy as np

OUTCOMES = ("a", "b", "tie", "both_bad")
TIE_OUTCOMES = ("tie", "both_bad")


# --------------------------------------------------------------------------------------------------
# Proportions
# --------------------------------------------------------------------------------------------------


def wilson_interval(successes: float, n: float, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval of a proportion.

    Preferred over the normal (Wald) interval because it stays inside [0, 1] and is sensible for
    the small counts a campaign has at the beginning (0 of 5 is not "0 ± 0"). ``successes`` may be
    fractional (ties count half).
    """
    if n <= 0:
        return (0.0, 1.0)
    p = successes / n
    z2 = z * z
    denom = 1 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = (z / denom) * math.sqrt(max(p * (1 - p) / n + z2 / (4 * n * n), 0.0))
    return (max(0.0, centre - half), min(1.0, centre + half))


def _score(outcome: str) -> float:
    """Points of system a for one outcome (ties and both-bad are half a win)."""
    if outcome == "a":
        return 1.0
    if outcome == "b":
        return 0.0
    if outcome in TIE_OUTCOMES:
        return 0.5
    raise ValueError(f"unknown outcome {outcome!r}; expected one of {OUTCOMES}")


def win_rate_matrix(
    comparisons: Iterable[tuple[Hashable, Hashable, str]], systems: Sequence[Hashable] | None = None
) -> dict[str, Any]:
    """Row system's win rate against column system, with Wilson intervals.

    ``comparisons`` are ``(system_a, system_b, outcome)``. Returns ``systems``, ``wins`` (ties as
    half), ``counts``, ``rate`` (None where a pair never met), ``low``, ``high`` as nested lists
    indexed [row][col], plus ``overall`` (each system's win rate against everyone, with interval).
    """
    comps = list(comparisons)
    names = list(systems) if systems is not None else sorted({s for c in comps for s in c[:2]}, key=str)
    idx = {s: i for i, s in enumerate(names)}
    k = len(names)
    wins = [[0.0] * k for _ in range(k)]
    counts = [[0] * k for _ in range(k)]
    for a, b, outcome in comps:
        if a == b:
            continue
        i, j = idx[a], idx[b]
        s = _score(outcome)
        wins[i][j] += s
        wins[j][i] += 1 - s
        counts[i][j] += 1
        counts[j][i] += 1
    rate: list[list[float | None]] = [[None] * k for _ in range(k)]
    low: list[list[float | None]] = [[None] * k for _ in range(k)]
    high: list[list[float | None]] = [[None] * k for _ in range(k)]
    for i in range(k):
        for j in range(k):
            if counts[i][j]:
                rate[i][j] = wins[i][j] / counts[i][j]
                low[i][j], high[i][j] = wilson_interval(wins[i][j], counts[i][j])
    overall = []
    for i, name in enumerate(names):
        w, n = sum(wins[i]), sum(counts[i])
        lo, hi = wilson_interval(w, n)
        overall.append(
            {"system": name, "wins": w, "n": n, "rate": (w / n if n else None), "low": lo, "high": hi}
        )
    return {
        "systems": names,
        "wins": wins,
        "counts": counts,
        "rate": rate,
        "low": low,
        "high": high,
        "overall": overall,
    }


# --------------------------------------------------------------------------------------------------
# Bradley–Terry
# --------------------------------------------------------------------------------------------------
#
# Why a second Bradley–Terry beside ``engine/reward_model.py``: both use the model
# P(i ≻ j) = σ(θ_i − θ_j), but they fit different unknowns. Here θ is one number per *system* (a
# handful), fitted in closed-form Newton steps on a win matrix with a prior and a posterior interval
# per system (the rankings and leaderboards need the intervals). The reward model's θ is a neural
# network's score of *any text*, fitted by gradient descent on individual pairs so it can score
# generations it never saw. One implementation would either pull torch into the annotation
# statistics or lose the intervals, so each keeps its own, and only the model is shared.


# A weak Gaussian prior on each system's log-strength θ (natural log-odds units): θ ~ N(0, 1²).
# 95% of prior mass puts a system within ±2 log-odds (±350 Elo points) of the average, which real
# comparisons of language models rarely exceed; one judgment then moves two systems ~116 Elo points
# apart with a ±200-point interval instead of 2044 vs −44 with a zero-width one. Each comparison adds
# about as much curvature as the prior (at most 1/4 per comparison), so with tens of comparisons per
# system the prior's pull is a few Elo points and with hundreds it vanishes.
DEFAULT_PRIOR_SD = 1.0
_MLE_REG = 1e-6  # prior_sd=None: the plain maximum-likelihood fit (kept finite by a tiny L2 term)


def _bt_fit(wins: np.ndarray, reg: float, iters: int = 100) -> np.ndarray:
    """MAP log-strengths for a batch of win matrices: ``wins[..., i, j]`` = i's wins over j.

    Newton's method on Σ w_ij log σ(θ_i − θ_j) − reg/2 |θ|² for every matrix of the batch at once
    (the bootstrap refits 1,000 of them). ``reg`` = 1/prior_sd²; a tiny ``reg`` is the MLE, kept
    finite when a system never won. Returns θ centred on 0, shape ``wins.shape[:-1]``.
    """
    w_all = np.asarray(wins, dtype=float)
    single = w_all.ndim == 2
    if single:
        w_all = w_all[None]
    b, k, _ = w_all.shape
    theta = np.zeros((b, k))
    n = w_all + np.swapaxes(w_all, 1, 2)
    eye = np.eye(k)
    for _ in range(iters):
        diff = theta[:, :, None] - theta[:, None, :]
        p = 1.0 / (1.0 + np.exp(-diff))
        grad = (w_all - n * p).sum(axis=2) - reg * theta
        w = n * p * (1 - p)
        hess = w - w.sum(axis=2)[:, :, None] * eye - reg * eye
        step = np.linalg.solve(hess, grad[:, :, None])[:, :, 0]
        theta -= step
        if np.max(np.abs(step)) < 1e-10:
            break
    theta -= theta.mean(axis=1, keepdims=True)
    return theta[0] if single else theta


def _bt_posterior_sd(wins: np.ndarray, theta: np.ndarray, reg: float) -> np.ndarray:
    """Standard deviation of each centred log-strength under the normal (Laplace) approximation of
    the posterior: the inverse curvature of the penalised likelihood at its maximum. Unlike the
    bootstrap it does not collapse to zero width when every resample is the same data set."""
    k = len(theta)
    n = wins + wins.T
    p = 1.0 / (1.0 + np.exp(-(theta[:, None] - theta[None, :])))
    w = n * p * (1 - p)
    precision = np.diag(w.sum(axis=1)) - w + reg * np.eye(k)
    cov = np.linalg.inv(precision)
    centre = np.eye(k) - 1.0 / k
    return np.sqrt(np.clip(np.diag(centre @ cov @ centre), 0.0, None))


def bradley_terry(
    comparisons: Iterable[tuple[Hashable, Hashable, str]],
    systems: Sequence[Hashable] | None = None,
    n_bootstrap: int = 1000,
    seed: int = 0,
    scale: float = 400.0,
    base: float = 10.0,
    init_rating: float = 1000.0,
    prior_sd: float | None = DEFAULT_PRIOR_SD,
) -> dict[str, Any]:
    """Bradley–Terry ratings on the Elo scale with 95% intervals and ranks.

    The model is Chatbot Arena's: P(i beats j) = 1 / (1 + base^((R_j − R_i)/scale)), ties counting
    as half a win for each side, ratings centred on ``init_rating``. Ratings are the posterior mode
    under the weak prior θ ~ N(0, prior_sd²) on natural-log strengths (``prior_sd=None``: the plain
    maximum-likelihood fit). The 95% interval is the union of the bootstrap percentile interval
    (comparisons resampled with replacement, refitted) and, with a prior, the Laplace posterior
    interval (±1.96 sd): the bootstrap alone has zero width when every resample is the same data
    (one judgment; one system that always wins). The rank of a system is 1 + the number of systems
    whose lower bound exceeds its upper bound (systems whose intervals overlap share a rank).
    """
    comps = [c for c in comparisons if c[0] != c[1]]
    names = list(systems) if systems is not None else sorted({s for c in comps for s in c[:2]}, key=str)
    idx = {s: i for i, s in enumerate(names)}
    k = len(names)
    if k == 0:
        return {"systems": [], "rating": [], "low": [], "high": [], "rank": [], "n": 0, "prior_sd": prior_sd}
    reg = 1.0 / (prior_sd * prior_sd) if prior_sd else _MLE_REG
    factor = scale / math.log(base)
    # Comparisons as counts of distinct (a, b, points-of-a) cells: a bootstrap resample is then one
    # multinomial draw over the cells, the same distribution as resampling comparisons one by one.
    cells: dict[tuple[int, int, float], int] = Counter((idx[a], idx[b], _score(o)) for a, b, o in comps)
    keys = list(cells)
    counts = np.array([cells[c] for c in keys], dtype=float)
    ci = np.array([c[0] for c in keys], dtype=int)
    cj = np.array([c[1] for c in keys], dtype=int)
    cs = np.array([c[2] for c in keys], dtype=float)

    def wins_of(weights: np.ndarray) -> np.ndarray:
        """(B, m) cell counts → (B, k, k) win matrices."""
        w = np.zeros((weights.shape[0], k, k))
        for m in range(len(keys)):
            w[:, ci[m], cj[m]] += weights[:, m] * cs[m]
            w[:, cj[m], ci[m]] += weights[:, m] * (1 - cs[m])
        return w

    full = wins_of(counts[None])[0] if keys else np.zeros((k, k))
    theta = _bt_fit(full, reg)
    rating = init_rating + factor * theta
    low, high = rating.copy(), rating.copy()
    if comps and n_bootstrap > 0:
        rng = np.random.default_rng(seed)
        draws = rng.multinomial(len(comps), counts / counts.sum(), size=n_bootstrap).astype(float)
        boots = init_rating + factor * _bt_fit(wins_of(draws), reg)
        low = np.minimum(low, np.percentile(boots, 2.5, axis=0))
        high = np.maximum(high, np.percentile(boots, 97.5, axis=0))
    if prior_sd:
        half = 1.959963984540054 * factor * _bt_posterior_sd(full, theta, reg)
        low = np.minimum(low, rating - half)
        high = np.maximum(high, rating + half)
    rank = [1 + int(np.sum(low > high[i])) for i in range(k)]
    return {
        "systems": names,
        "rating": rating.tolist(),
        "low": low.tolist(),
        "high": high.tolist(),
        "rank": rank,
        "n": len(comps),
        "prior_sd": prior_sd,
    }


def bt_win_probability(r_i: float, r_j: float, scale: float = 400.0, base: float = 10.0) -> float:
    """Predicted probability that a system rated r_i beats one rated r_j."""
    return 1.0 / (1.0 + base ** ((r_j - r_i) / scale))


# --------------------------------------------------------------------------------------------------
# Likert
# --------------------------------------------------------------------------------------------------


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> dict[str, Any]:
    """Mean with a Student-t interval (small samples of 1–5 scores are the norm here)."""
    from scipy import stats as st

    x = np.asarray([float(v) for v in values], dtype=float)
    n = len(x)
    if n == 0:
        return {"mean": None, "low": None, "high": None, "n": 0, "sd": None}
    m = float(x.mean())
    if n == 1:
        return {"mean": m, "low": m, "high": m, "n": 1, "sd": 0.0}
    sd = float(x.std(ddof=1))
    half = float(st.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    return {"mean": m, "low": m - half, "high": m + half, "n": n, "sd": sd}


def likert_means(scores: Iterable[tuple[Hashable, str, float]]) -> dict[str, dict[Hashable, dict[str, Any]]]:
    """``(system, axis, score)`` triples → {axis: {system: mean_ci}}."""
    grouped: dict[str, dict[Hashable, list[float]]] = defaultdict(lambda: defaultdict(list))
    for system, axis, score in scores:
        grouped[axis][system].append(float(score))
    return {axis: {s: mean_ci(v) for s, v in by_sys.items()} for axis, by_sys in grouped.items()}


# --------------------------------------------------------------------------------------------------
# Agreement
# --------------------------------------------------------------------------------------------------


def cohen_kappa(rater1: Sequence[Hashable], rater2: Sequence[Hashable]) -> float | None:
    """Cohen's kappa of two raters over the same items (None when undefined: no items or p_e = 1)."""
    if len(rater1) != len(rater2):
        raise ValueError("cohen_kappa: both raters must rate the same items")
    n = len(rater1)
    if n == 0:
        return None
    po = sum(1 for x, y in zip(rater1, rater2) if x == y) / n
    c1, c2 = Counter(rater1), Counter(rater2)
    pe = sum(c1[c] * c2[c] for c in set(c1) | set(c2)) / (n * n)
    if pe >= 1.0:
        return None
    return (po - pe) / (1 - pe)


def fleiss_kappa(table: Sequence[Sequence[float]]) -> float | None:
    """Fleiss' kappa from an items × categories count table.

    Rows may have different numbers of raters (each row needs at least two); with equal counts this
    is exactly Fleiss (1971).
    """
    t = np.asarray(table, dtype=float)
    if t.ndim != 2 or t.shape[0] == 0:
        return None
    n_i = t.sum(axis=1)
    t = t[n_i >= 2]
    n_i = n_i[n_i >= 2]
    if len(t) == 0:
        return None
    p_i = ((t * t).sum(axis=1) - n_i) / (n_i * (n_i - 1))
    p_bar = float(p_i.mean())
    p_j = t.sum(axis=0) / n_i.sum()
    pe = float((p_j**2).sum())
    if pe >= 1.0:
        return None
    return float((p_bar - pe) / (1 - pe))


def ratings_to_table(
    items: Iterable[Sequence[Hashable]], categories: Sequence[Hashable] | None = None
) -> list[list[int]]:
    """Per-item label lists → count table for :func:`fleiss_kappa`."""
    items = [list(x) for x in items]
    cats = list(categories) if categories is not None else sorted({c for it in items for c in it}, key=str)
    pos = {c: i for i, c in enumerate(cats)}
    table = []
    for it in items:
        row = [0] * len(cats)
        for c in it:
            row[pos[c]] += 1
        table.append(row)
    return table


def krippendorff_alpha(
    units: Iterable[Sequence[Any]], level: str = "nominal", values: Sequence[Any] | None = None
) -> float | None:
    """Krippendorff's alpha from per-unit value lists (missing ratings are simply absent).

    ``level`` is ``nominal``, ``ordinal`` or ``interval``. For ordinal data ``values`` gives the order
    of the categories (default: sorted). Computed from the coincidence matrix as in Krippendorff
    (2011), "Computing Krippendorff's Alpha-Reliability": units with fewer than two values are not
    pairable and are dropped.
    """
    pairable = [list(u) for u in units if len(u) >= 2]
    if not pairable:
        return None
    vals = list(values) if values is not None else sorted({v for u in pairable for v in u})
    pos = {v: i for i, v in enumerate(vals)}
    k = len(vals)
    o = np.zeros((k, k))
    for u in pairable:
        m = len(u)
        cnt = Counter(pos[v] for v in u)
        for c, nc in cnt.items():
            for d, nd in cnt.items():
                pairs = nc * (nc - 1) if c == d else nc * nd
                o[c, d] += pairs / (m - 1)
    n_c = o.sum(axis=1)
    n = n_c.sum()
    if n <= 1:
        return None
    if level == "nominal":
        delta = 1.0 - np.eye(k)
    elif level == "ordinal":
        delta = np.zeros((k, k))
        for c in range(k):
            for d in range(k):
                lo, hi = min(c, d), max(c, d)
                s = n_c[lo : hi + 1].sum() - (n_c[c] + n_c[d]) / 2.0
                delta[c, d] = s * s
    elif level == "interval":
        num = np.asarray([float(v) for v in vals])
        delta = (num[:, None] - num[None, :]) ** 2
    else:
        raise ValueError(f"krippendorff_alpha: unknown level {level!r} (nominal, ordinal, interval)")
    d_o = float((o * delta).sum())
    e = np.outer(n_c, n_c) - np.diag(n_c)
    d_e = float((e * delta).sum()) / (n - 1)
    if d_e == 0:
        return None
    return float(1.0 - d_o / d_e)


def pairwise_cohen(
    labels: dict[Hashable, dict[Hashable, Hashable]], min_common: int = 2
) -> list[dict[str, Any]]:
    """Cohen's kappa for every pair of annotators on the items both judged.

    ``labels`` is {annotator: {item: label}}.
    """
    anns = sorted(labels, key=str)
    out = []
    for x in range(len(anns)):
        for y in range(x + 1, len(anns)):
            a, b = anns[x], anns[y]
            common = sorted(set(labels[a]) & set(labels[b]), key=str)
            if len(common) < min_common:
                continue
            k = cohen_kappa([labels[a][i] for i in common], [labels[b][i] for i in common])
            out.append({"a": a, "b": b, "n": len(common), "kappa": k})
    return out


def annotator_stats(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per-annotator count, median seconds, gold accuracy and agreement with the majority.

    ``rows`` have ``annotator``, ``item``, ``label``, optional ``seconds`` and optional ``gold``
    (the known answer of an attention item). Agreement with the majority compares each label with
    the strict majority of the OTHER annotators on that item (leave-one-out, so an annotator does
    not agree with themself); items where the others have no strict majority are not counted.
    """
    rows = list(rows)
    by_item: dict[Hashable, list[tuple[Hashable, Hashable]]] = defaultdict(list)
    for r in rows:
        by_item[r["item"]].append((r["annotator"], r["label"]))
    per: dict[Hashable, dict[str, Any]] = {}
    for r in rows:
        s = per.setdefault(
            r["annotator"], {"times": [], "gold_n": 0, "gold_ok": 0, "maj_n": 0, "maj_ok": 0, "n": 0}
        )
        s["n"] += 1
        if r.get("seconds") is not None:
            s["times"].append(float(r["seconds"]))
        if r.get("gold") is not None:
            s["gold_n"] += 1
            s["gold_ok"] += int(r["label"] == r["gold"])
        others = Counter(lab for ann, lab in by_item[r["item"]] if ann != r["annotator"])
        if others:
            (top, cnt), *rest = others.most_common()
            if cnt * 2 > sum(others.values()):
                s["maj_n"] += 1
                s["maj_ok"] += int(r["label"] == top)
    out = []
    for ann in sorted(per, key=str):
        s = per[ann]
        out.append(
            {
                "annotator": ann,
                "count": s["n"],
                "median_seconds": median(s["times"]) if s["times"] else None,
                "gold_n": s["gold_n"],
                "gold_accuracy": s["gold_ok"] / s["gold_n"] if s["gold_n"] else None,
                "majority_n": s["maj_n"],
                "majority_agreement": s["maj_ok"] / s["maj_n"] if s["maj_n"] else None,
            }
        )
    return out


def majority_label(labels: Sequence[Hashable]) -> Hashable | None:
    """The strict-plurality label (None on a tie for first place or no labels)."""
    if not labels:
        return None
    common = Counter(labels).most_common()
    if len(common) > 1 and common[0][1] == common[1][1]:
        return None
    return common[0][0]


# --------------------------------------------------------------------------------------------------
# Automatic metrics vs humans
# --------------------------------------------------------------------------------------------------


def metric_human_agreement(pairs: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Do automatic metrics prefer what humans prefer, on the same pairs?

    Each pair has ``human`` ("a" or "b": the human decision; undecided pairs are skipped) and
    ``metrics``: {name: (score_a, score_b)}. For each metric: ``agreement`` = fraction of
    human-decided pairs where the metric prefers the same output (a metric tie counts half);
    ``tau`` = WMT's Kendall tau-like correlation (Concordant − Discordant) / (Concordant + Discordant),
    where metric ties are neither; ``n`` pairs and ``metric_ties``.
    """
    acc: dict[str, dict[str, float]] = defaultdict(lambda: {"conc": 0, "disc": 0, "ties": 0})
    for p in pairs:
        h = p.get("human")
        if h not in ("a", "b"):
            continue
        for name, (sa, sb) in p.get("metrics", {}).items():
            if sa is None or sb is None:
                continue
            a = acc[name]
            if sa == sb:
                a["ties"] += 1
            elif (sa > sb) == (h == "a"):
                a["conc"] += 1
            else:
                a["disc"] += 1
    out = {}
    for name, a in sorted(acc.items()):
        n = a["conc"] + a["disc"] + a["ties"]
        decided = a["conc"] + a["disc"]
        out[name] = {
            "n": int(n),
            "agreement": (a["conc"] + 0.5 * a["ties"]) / n if n else None,
            "tau": (a["conc"] - a["disc"]) / decided if decided else None,
            "metric_ties": int(a["ties"]),
            "concordant": int(a["conc"]),
            "discordant": int(a["disc"]),
        }
    return out


# --------------------------------------------------------------------------------------------------
# AI judges vs humans
# --------------------------------------------------------------------------------------------------


def ai_judge_agreement(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Position bias of an AI judge and its agreement with the human majority.

    Each row is one item judged twice: ``passes`` = two ``(label, choice)`` — ``label`` "A"/"B" is the
    position that won ("A" = shown first, "" = no verdict), ``choice`` the same in system terms
    ("a"/"b"/"tie") — and ``human``, the human majority label or None. The item's AI verdict is the
    system both passes chose, else "tie" (inconsistent pairs count as ties).

    - ``first_position_rate``: share of decided passes won by the response shown first, before the
      consistency rule (0.5 = no position bias), over ``n_decided_passes``.
    - ``inconsistency_rate``: share of items whose two passes both decided, for different systems.
    - ``kappa``: Cohen's kappa of AI verdicts against the human majority on the items that have one
      (``n_kappa``); "both bad" counts as a tie there, since the AI says only a, b or tie.
    - ``accuracy``: on items decided by both the humans and the AI (``n_accuracy``), the share where
      they agree; ``coverage``: the share of human-decided items that the AI decided.
    """
    rows = list(rows)
    verdicts: Counter[str] = Counter()
    first_wins = decided_passes = inconsistent = 0
    ai_lab, hum_lab = [], []
    acc_n = acc_ok = human_decided = 0
    for r in rows:
        (l1, c1), (l2, c2) = r["passes"]
        for lab in (l1, l2):
            if lab in ("A", "B"):
                decided_passes += 1
                first_wins += lab == "A"
        if c1 in ("a", "b") and c2 in ("a", "b") and c1 != c2:
            inconsistent += 1
        v = c1 if c1 == c2 and c1 in ("a", "b") else "tie"
        verdicts[v] += 1
        h = r.get("human")
        if h is None:
            continue
        h = "tie" if h in TIE_OUTCOMES else h
        ai_lab.append(v)
        hum_lab.append(h)
        if h in ("a", "b"):
            human_decided += 1
            if v in ("a", "b"):
                acc_n += 1
                acc_ok += v == h
    n = len(rows)
    return {
        "n_items": n,
        "verdicts": {k: verdicts.get(k, 0) for k in ("a", "b", "tie")},
        "n_decided_passes": decided_passes,
        "first_position_rate": first_wins / decided_passes if decided_passes else None,
        "n_inconsistent": inconsistent,
        "inconsistency_rate": inconsistent / n if n else None,
        "n_kappa": len(ai_lab),
        "kappa": cohen_kappa(ai_lab, hum_lab) if ai_lab else None,
        "n_accuracy": acc_n,
        "accuracy": acc_ok / acc_n if acc_n else None,
        "coverage": acc_n / human_decided if human_decided else None,
    }
