"""Simulation (not a test): adaptive vs uniform choice of pairwise comparisons (issue 28, section 1).

Eight systems with known Bradley–Terry strengths are judged by simulated annotators; each campaign
is run twice from the same seed, once with the uniform assignment (least-judged pair first, as a
uniform campaign serves its items) and once with the adaptive rule. The adaptive arm calls
``annotation.active.pair_scores`` — the very function ``assignment.next_item`` calls on the server —
with the same exploration floor, so this measures the product's rule, not a re-implementation.

Strengths. Elo 1250, 1200, 1170, 1130, 1100, 1060, 1020, 950: a 300-point range with neighbours
30–70 points apart. That is the shape of public leaderboards of language models compared by people
(Chatbot Arena, Chiang et al. 2024: models next to each other in the ranking are typically tens of
Elo points apart, the whole field a few hundred), and of the checkpoints of one RL run, whose late
checkpoints differ little while early ones are far behind.

Annotators. A pool of 20; each has a lapse rate (answers left or right at random) drawn from
U(0.05, 0.30), a position bias toward the left output drawn from N(0.3, 0.15) in log-odds, and says
"tie" 8 % of the time. Sides are shown at random, as on the server. The model is therefore *not*
Bradley–Terry for the fit: lapses flatten the observed preferences, which is what real data does.

Measured per campaign (checkpoints every ``--every`` judgments, product's fit: ties half, N(0, 1)
prior): the judgments after which Kendall's τ with the true order stays ≥ 0.9 until the end of the
budget, and the judgments after which the mean 95 % posterior-interval width (the results page's
Laplace interval, Elo points) first falls to ``--width`` or below. Not reached = censored at the
budget (counted as larger than every reached value when taking medians).

Unbiasedness check (``--check-bias``): the same two designs on annotators that follow the
Bradley–Terry model exactly (no lapses, no position bias, no ties), plain maximum-likelihood fit
after ``--bias-judgments`` judgments: the mean estimated strength of each system over the campaigns
against the truth, and how often the 95 % Wald interval covers the true strength.

    .venv/bin/python bench/adaptive_pairs.py --campaigns 50 --seed 0 --check-bias
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from annotation import active, stats  # noqa: E402  (pure modules: no Django needed)

TRUE_ELO = np.array([1250.0, 1200.0, 1170.0, 1130.0, 1100.0, 1060.0, 1020.0, 950.0])
ELO = 400.0 / math.log(10.0)  # Elo points per natural log-odds unit
K = len(TRUE_ELO)
PAIRS = [(i, j) for i in range(K) for j in range(i + 1, K)]


@dataclass
class Annotator:
    lapse: float
    bias: float
    tie: float


def annotators(rng: np.random.Generator, n: int, exact: bool) -> list[Annotator]:
    if exact:
        return [Annotator(0.0, 0.0, 0.0) for _ in range(n)]
    return [Annotator(float(rng.uniform(0.05, 0.30)), float(rng.normal(0.3, 0.15)), 0.08) for _ in range(n)]


def judge(rng: np.random.Generator, ann: Annotator, theta: np.ndarray, i: int, j: int) -> float:
    """Points of system i against j in one judgment (1, 0 or 0.5 for a tie)."""
    i_left = rng.random() < 0.5
    if rng.random() < ann.tie:
        return 0.5
    if rng.random() < ann.lapse:
        left_wins = rng.random() < 0.5
    else:
        left, right = (i, j) if i_left else (j, i)
        left_wins = rng.random() < 1.0 / (1.0 + math.exp(-(theta[left] - theta[right] + ann.bias)))
    return 1.0 if left_wins == i_left else 0.0


def kendall_tau(est: np.ndarray, truth: np.ndarray) -> float:
    c = d = 0
    for i, j in PAIRS:
        s = np.sign(est[i] - est[j]) * np.sign(truth[i] - truth[j])
        c += s > 0
        d += s < 0
    return (c - d) / len(PAIRS)


def mean_width(wins: np.ndarray) -> tuple[np.ndarray, float]:
    """The results page's fit (prior sd 1) and mean 95 % posterior-interval width in Elo points."""
    reg = 1.0 / stats.DEFAULT_PRIOR_SD**2
    theta = stats._bt_fit(wins, reg)
    sd = stats._bt_posterior_sd(wins, theta, reg)
    return theta, float(np.mean(2 * 1.959963984540054 * ELO * sd))


def choose(
    design: str, wins: np.ndarray, counts: np.ndarray, rng: np.random.Generator, explore: float
) -> tuple[int, int]:
    """Uniform: the least-judged pair (random among equals), like least-judged items first.
    Adaptive: the server's rule — the uniform choice with probability ``explore``, else the best
    pair by ``active.pair_scores``."""
    if design == "adaptive" and rng.random() >= explore:
        scores = active.pair_scores(wins)
        return active.pair_order(scores, list(range(K)), limit=1)[0]
    low = min(counts[i, j] for i, j in PAIRS)
    cands = [(i, j) for i, j in PAIRS if counts[i, j] == low]
    return cands[int(rng.integers(len(cands)))]


def campaign(
    design: str, seed: int, budget: int, every: int, explore: float, exact: bool = False
) -> dict[str, list[float]]:
    """One simulated campaign; the annotators and outcomes depend on the seed only."""
    rng_people = np.random.default_rng([seed, 1])
    pool = annotators(rng_people, 20, exact)
    rng = np.random.default_rng([seed, 2])
    theta_true = (TRUE_ELO - TRUE_ELO.mean()) / ELO
    wins = np.zeros((K, K))
    counts = np.zeros((K, K), dtype=int)
    taus, widths, ns = [], [], []
    for n in range(1, budget + 1):
        i, j = choose(design, wins, counts, rng, explore)
        s = judge(rng, pool[int(rng.integers(len(pool)))], theta_true, i, j)
        wins[i, j] += s
        wins[j, i] += 1.0 - s
        counts[i, j] += 1
        if n % every == 0:
            theta, width = mean_width(wins)
            taus.append(kendall_tau(theta, theta_true))
            widths.append(width)
            ns.append(n)
    return {"n": ns, "tau": taus, "width": widths, "wins": wins.tolist(), "counts": counts.tolist()}


def judgments_to_tau(run: dict[str, list[float]], target: float) -> float:
    """First checkpoint from which τ stays ≥ target to the end; inf when it never settles."""
    first = math.inf
    for n, tau in zip(run["n"], run["tau"]):
        if tau >= target:
            first = min(first, n)
        else:
            first = math.inf
    return first


def judgments_to_width(run: dict[str, list[float]], target: float) -> float:
    return next((n for n, w in zip(run["n"], run["width"]) if w <= target), math.inf)


def summary(xs: list[float]) -> dict[str, float | int]:
    finite = sorted(x for x in xs if math.isfinite(x))
    ordered = finite + [math.inf] * (len(xs) - len(finite))
    q = lambda f: ordered[min(len(ordered) - 1, int(round(f * (len(ordered) - 1))))]  # noqa: E731
    return {"median": statistics.median(ordered) if ordered else math.inf, "q25": q(0.25), "q75": q(0.75),
            "min": ordered[0], "max": ordered[-1], "not_reached": len(xs) - len(finite)}  # fmt: skip


def bias_check(campaigns: int, seed: int, budget: int, explore: float) -> dict[str, object]:
    """Exact Bradley–Terry annotators, plain ML fit at the end: mean estimate and 95 % coverage."""
    theta_true = (TRUE_ELO - TRUE_ELO.mean()) / ELO
    out: dict[str, object] = {}
    for design in ("uniform", "adaptive"):
        est, cover = [], []
        for c in range(campaigns):
            run = campaign(design, seed + 10_000 + c, budget, budget, explore, exact=True)
            wins = np.array(run["wins"])
            theta = stats._bt_fit(wins, stats._MLE_REG)
            sd = stats._bt_posterior_sd(wins, theta, stats._MLE_REG)
            est.append(theta)
            cover.append(np.abs(theta - theta_true) <= 1.959963984540054 * sd)
        mean = np.mean(est, axis=0)
        se = np.std(est, axis=0, ddof=1) / math.sqrt(campaigns)
        out[design] = {
            "mean_elo_minus_truth": [round(float(x), 1) for x in ELO * (mean - theta_true)],
            "se_elo": [round(float(x), 1) for x in ELO * se],
            "coverage": [round(float(x), 3) for x in np.mean(cover, axis=0)],
            "coverage_all": round(float(np.mean(cover)), 3),
        }
    return out


def oracle_bound(steps: int = 4000) -> dict[str, float]:
    """The best any design could do for the mean interval width, knowing the true strengths: the
    greedy A-optimal allocation of ``steps`` comparisons (expected information, no sampling noise)
    against the balanced one. Interval widths scale as 1/sqrt(judgments), so the judgments a design
    needs for a given mean width are proportional to the square of its mean posterior sd."""
    theta = (TRUE_ELO - TRUE_ELO.mean()) / ELO
    p = 1.0 / (1.0 + np.exp(-(theta[:, None] - theta[None, :])))
    info = p * (1.0 - p)
    centre = np.eye(K) - 1.0 / K

    def mean_sd(alloc: np.ndarray) -> float:
        a = alloc + alloc.T
        prec = np.diag((a * info).sum(axis=1)) - a * info + np.ones((K, K)) / K  # pins the centre
        return float(np.mean(np.sqrt(np.diag(centre @ np.linalg.inv(prec) @ centre))))

    alloc = np.zeros((K, K))
    for i, j in PAIRS:
        alloc[i, j] = 1.0  # one of each first, so every system is connected
    for _ in range(steps - len(PAIRS)):
        a = alloc + alloc.T
        prec = np.diag((a * info).sum(axis=1)) - a * info + np.ones((K, K)) / K
        cov = centre @ np.linalg.inv(prec) @ centre
        best = max(PAIRS, key=lambda ij: _trace_drop(cov, info, *ij))
        alloc[best] += 1.0
    balanced = np.zeros((K, K))
    for i, j in PAIRS:
        balanced[i, j] = steps / len(PAIRS)
    return {"judgments_ratio_a_optimal_vs_uniform": round((mean_sd(alloc) / mean_sd(balanced)) ** 2, 3)}


def _trace_drop(cov: np.ndarray, info: np.ndarray, i: int, j: int) -> float:
    cy = cov[:, i] - cov[:, j]
    w = info[i, j]
    return float(w * (cy @ cy) / (1.0 + w * (cy[i] - cy[j])))


def main(argv: list[str] | None = None) -> dict[str, object]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--campaigns", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget", type=int, default=4000, help="judgments per simulated campaign")
    ap.add_argument("--every", type=int, default=20, help="checkpoint interval (judgments)")
    ap.add_argument("--tau", type=float, default=0.9)
    ap.add_argument("--width", type=float, default=100.0, help="target mean 95%% interval width, Elo")
    ap.add_argument("--explore", type=float, default=active.DEFAULT_EXPLORE)
    ap.add_argument("--check-bias", action="store_true")
    ap.add_argument("--bias-judgments", type=int, default=1500)
    ap.add_argument("--bias-campaigns", type=int, default=200)
    ap.add_argument("--json", help="write the full result here")
    ap.add_argument(
        "--spread",
        type=float,
        default=1.0,
        help="scale the strengths' distances from their mean (sensitivity)",
    )
    ap.add_argument("--oracle-only", action="store_true", help="only the oracle width bound")
    args = ap.parse_args(argv)
    global TRUE_ELO
    TRUE_ELO = TRUE_ELO.mean() + (TRUE_ELO - TRUE_ELO.mean()) * args.spread
    if args.oracle_only:
        bound = {"true_elo": TRUE_ELO.tolist(), **oracle_bound()}
        print(json.dumps(bound))
        return bound
    t0 = time.time()
    per: dict[str, dict[str, list[float]]] = {
        "uniform": {"tau": [], "width": []},
        "adaptive": {"tau": [], "width": []},
    }
    ratios: dict[str, list[float]] = {"tau": [], "width": []}
    for c in range(args.campaigns):
        got = {}
        for design in ("uniform", "adaptive"):
            run = campaign(design, args.seed + c, args.budget, args.every, args.explore)
            got[design] = (judgments_to_tau(run, args.tau), judgments_to_width(run, args.width))
            per[design]["tau"].append(got[design][0])
            per[design]["width"].append(got[design][1])
        for m, key in enumerate(("tau", "width")):
            u, a = got["uniform"][m], got["adaptive"][m]
            ratios[key].append(a / u if math.isfinite(u) and math.isfinite(a) else math.nan)
    result: dict[str, object] = {
        "command": "python bench/adaptive_pairs.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": _cpu_model(),
        "python": platform.python_version(),
        "true_elo": TRUE_ELO.tolist(),
        "campaigns": args.campaigns, "budget": args.budget, "every": args.every, "explore": args.explore,
        "tau_target": args.tau, "width_target_elo": args.width,
        "uniform": {k: summary(v) for k, v in per["uniform"].items()},
        "adaptive": {k: summary(v) for k, v in per["adaptive"].items()},
        "ratio_of_medians": {
            k: per_ratio(per["adaptive"][k], per["uniform"][k]) for k in ("tau", "width")
        },
        "per_campaign_ratio": {k: summary([r for r in v if not math.isnan(r)]) for k, v in ratios.items()},
    }  # fmt: skip
    result["oracle_width_bound"] = oracle_bound()
    if args.check_bias:
        result["bias_check"] = {
            "judgments": args.bias_judgments, "campaigns": args.bias_campaigns,
            **bias_check(args.bias_campaigns, args.seed, args.bias_judgments, args.explore),
        }  # fmt: skip
    result["seconds"] = round(time.time() - t0, 1)
    text = json.dumps(result, indent=1, default=str)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return result


def per_ratio(a: list[float], u: list[float]) -> float:
    ma, mu = summary(a)["median"], summary(u)["median"]
    return float(ma) / float(mu) if math.isfinite(float(mu)) else math.nan


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or os.uname().machine


if __name__ == "__main__":
    main()
