"""The over-optimisation watch: a proxy reward against a gold signal, by training progress and by
√KL from the initial policy.

Why: a reward that is only a proxy (a sentiment classifier, a learned reward model, a metric) can keep
rising while what it stands for falls; Gao et al. (2022, "Scaling Laws for Reward Model
Overoptimization") show the gold score first rising, then falling, as a function of
``d = sqrt(KL(policy || initial policy))``, while the proxy keeps climbing. A run that measures a gold
signal on its periodic evaluations (the ``gold`` metric, ``engine/metrics/gold.py``, or any evaluation
metric the researcher picks) can show both curves and say when it happened.

Series (all from ``metrics.jsonl`` or the web app's stored points):

- proxy: ``eval/reward_mean`` (the optimised reward on the evaluation prompts; ``train/reward_mean``
  at the same step when the run has no evaluation reward);
- gold: ``eval/gold`` by default, or the evaluation key given;
- KL: ``train/kl_episode``, the mean per-episode KL of the sampled policy from the reference model
  (the initial policy, or the supervised warm start when there is one) at the rollout of that step;
  the x-axis is its square root, as in Gao et al. An evaluation at step s takes the KL logged at step
  s + 1 (that rollout was sampled by the policy the evaluation scored), else the latest at or before s.

The warning has two rules, each over ``n`` consecutive evaluations (the run page's N):

- *falls*: the gold fell at each of them (strictly) while the proxy rose over the same evaluations (its
  last value above its first). Needs nothing but the means; a noisy gold breaks its runs (on the real
  case of docs/engine.md one rise within the noise kept it silent at N = 3).
- *below the best*: each of them is below the best evaluation before it by more than ``z`` (2)
  standard errors of the difference while the proxy stands above its value at that best. When the
  per-sample scores of both evaluations are known by prompt (``sample_id``) and they share at least
  two prompts, the error is that of the paired per-prompt differences (a run's evaluations score the
  same prompts, so the prompts' own spread — a review's sentiment, a question's difficulty — cancels);
  otherwise ``sqrt(se² + se_best²)`` from each point's own error (independent: conservative). This is
  Gao et al.'s picture read directly: past the gold's peak, the proxy higher, the gold lower beyond
  its noise.

Pure Python, no torch: the web process uses it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.jsonl import read_jsonl
from engine.study.charts import svg_chart

__all__ = [
    "DEFAULT_FALLS",
    "DEFAULT_Z",
    "Drop",
    "Episode",
    "Point",
    "Watch",
    "align",
    "difference_error",
    "drops_from_best",
    "falling_episodes",
    "group_scores",
    "paired_error",
    "watch",
    "sample_errors",
    "sample_scores",
    "standard_error",
    "step_errors",
    "watch_run_dir",
    "write_svgs",
]

PROXY_KEYS = ("eval/reward_mean", "train/reward_mean")
GOLD_KEY = "eval/gold"
KL_KEY = "train/kl_episode"
DEFAULT_FALLS = 3
DEFAULT_Z = 2.0


@dataclass(frozen=True)
class Point:
    step: int
    proxy: float | None
    gold: float
    sqrt_kl: float | None


@dataclass(frozen=True)
class Episode:
    """Evaluations ``start_step``..``end_step`` over which gold fell at every step and the proxy rose."""

    start_step: int
    end_step: int
    falls: int
    gold_drop: float
    proxy_rise: float


@dataclass(frozen=True)
class Drop:
    """Evaluations ``start_step``..``end_step`` (``evaluations`` of them, consecutive), each below the
    best evaluation before it (``best_step``) by more than ``z`` standard errors while the proxy stood
    above its value there. ``gold_drop``, ``z_last`` and ``proxy_rise`` are read at the last one."""

    best_step: int
    start_step: int
    end_step: int
    evaluations: int
    gold_drop: float
    z_last: float
    proxy_rise: float
    paired: bool = False  # whether z_last came from paired per-prompt differences


@dataclass
class Watch:
    points: list[Point]
    falls: int
    episodes: list[Episode] = field(default_factory=list)
    best: Point | None = None
    best_checkpoint: int | None = None
    drops: list[Drop] = field(default_factory=list)
    z: float = DEFAULT_Z
    has_errors: bool = False  # whether the points had standard errors (the second rule could run)

    @property
    def warning(self) -> str | None:
        """One or two sentences for the run page (one per rule that found a stretch), or None."""
        parts = []
        last = self.points[-1].step if self.points else None
        if self.episodes:
            e = self.episodes[-1]
            more = f" ({len(self.episodes)} such stretches)" if len(self.episodes) > 1 else ""
            parts.append(
                f"the gold fell at {e.falls} consecutive evaluations "
                f"(steps {e.start_step}–{e.end_step}, −{e.gold_drop:.4g}) while the proxy rose "
                f"(+{e.proxy_rise:.4g}){', and is still falling' if e.end_step == last else ''}{more}"
            )
        if self.drops:
            d = self.drops[-1]
            more = f" ({len(self.drops)} such stretches)" if len(self.drops) > 1 else ""
            how = " of the paired per-prompt differences" if d.paired else ""
            parts.append(
                f"the gold stayed more than {self.z:g} standard errors{how} below its best (step {d.best_step}) "
                f"at {d.evaluations} consecutive evaluations (steps {d.start_step}–{d.end_step}; "
                f"−{d.gold_drop:.4g}, {d.z_last:.1f} SE at step {d.end_step}) while the proxy stood above "
                f"its value there (+{d.proxy_rise:.4g}){', and still does' if d.end_step == last else ''}{more}"
            )
        if not parts:
            return None
        return "Possible reward over-optimisation: " + "; ".join(parts) + "."

    def to_dict(self) -> dict[str, Any]:
        return {
            "points": [vars(p) for p in self.points],
            "falls": self.falls,
            "episodes": [vars(e) for e in self.episodes],
            "drops": [vars(d) for d in self.drops],
            "z": self.z,
            "has_errors": self.has_errors,
            "best": vars(self.best) if self.best else None,
            "best_checkpoint": self.best_checkpoint,
            "warning": self.warning,
        }


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def align(
    gold: Mapping[int, float],
    proxy: Mapping[int, float] | None = None,
    kl: Mapping[int, float] | None = None,
) -> list[Point]:
    """One point per step with a finite gold value, with the proxy at that step and √KL of the policy
    that evaluation scored.

    ``train/kl_episode`` at step s is measured on iteration s's rollout, sampled *before* that
    iteration's update, i.e. by the policy after s − 1 updates. An evaluation at step s scores the
    policy after s updates, whose KL is logged at step s + 1: that one is taken when it exists, else
    the latest logged at or before s (the run's last evaluation, or sparse logs; None where there is
    none). Step 0 (``train.eval_at_start``: the starting policy) is at KL 0 by definition when nothing
    was logged for it: the reference *is* that policy."""
    proxy, kl = proxy or {}, kl or {}
    kl_steps = sorted(s for s, v in kl.items() if _finite(v))
    out, j, last_kl = [], 0, None
    for step in sorted(s for s, v in gold.items() if _finite(v)):
        while j < len(kl_steps) and kl_steps[j] <= step:
            last_kl = kl[kl_steps[j]]
            j += 1
        at = kl.get(step + 1)
        value = float(at) if _finite(at) else last_kl
        p = proxy.get(step)
        out.append(
            Point(
                step=int(step),
                proxy=float(p) if _finite(p) else None,
                gold=float(gold[step]),
                sqrt_kl=math.sqrt(max(float(value), 0.0))
                if value is not None
                else (0.0 if step <= 0 else None),
            )
        )
    return out


def falling_episodes(points: list[Point], falls: int = DEFAULT_FALLS) -> list[Episode]:
    """Maximal stretches of at least ``falls`` consecutive strict gold decreases over which the proxy
    rose (last proxy above the first); a stretch with missing proxies cannot say the proxy rose."""
    if falls < 1:
        raise ValueError(f"falls must be at least 1, got {falls}")
    out: list[Episode] = []
    i = 0
    while i < len(points) - 1:
        j = i
        while j + 1 < len(points) and points[j + 1].gold < points[j].gold:
            j += 1
        if j - i >= falls:
            a, b = points[i], points[j]
            if a.proxy is not None and b.proxy is not None and b.proxy > a.proxy:
                out.append(Episode(a.step, b.step, j - i, a.gold - b.gold, b.proxy - a.proxy))
        i = max(j, i + 1)
    return out


Scores = Mapping[int, Mapping[str, float]]  # {step: {sample_id: per-sample gold score}}


def paired_error(a: Mapping[str, float], b: Mapping[str, float]) -> tuple[int, float] | None:
    """``(n, standard error)`` of the mean per-prompt difference over the prompts both evaluations
    scored (None below two shared prompts)."""
    diffs = [a[k] - b[k] for k in a.keys() & b.keys()]
    se = standard_error(diffs)
    return None if se is None else (len(diffs), se)


def difference_error(
    step: int, best_step: int, errors: Mapping[int, float], scores: Scores | None = None
) -> tuple[float, bool] | None:
    """The standard error of ``gold[best_step] − gold[step]`` and whether it is paired: over the shared
    prompts when both evaluations' per-sample scores are known, else from the two points' own errors
    as independent ones. None when neither is known."""
    if scores and step in scores and best_step in scores:
        paired = paired_error(scores[best_step], scores[step])
        if paired is not None:
            return paired[1], True
    se_p, se_b = errors.get(step), errors.get(best_step)
    if _finite(se_p) and _finite(se_b):
        return math.sqrt(float(se_p) ** 2 + float(se_b) ** 2), False
    return None


def drops_from_best(
    points: list[Point],
    errors: Mapping[int, float],
    falls: int = DEFAULT_FALLS,
    z: float = DEFAULT_Z,
    scores: Scores | None = None,
) -> list[Drop]:
    """Maximal stretches of at least ``falls`` consecutive evaluations each below the best before it
    by more than ``z`` standard errors of the difference (:func:`difference_error`: paired when
    ``scores`` has both evaluations by prompt) while the proxy stands above its value at that best.
    The best is the running one: a new best ends a stretch and becomes the reference. A point without
    a standard error (or a proxy) ends a stretch: it cannot show the drop."""
    if falls < 1:
        raise ValueError(f"falls must be at least 1, got {falls}")
    out: list[Drop] = []
    best: Point | None = None
    run: list[tuple[Point, float, bool]] = []  # (point, its z, paired) of the stretch, all below ``best``
    for p in [*points, None]:  # None: the end closes the last stretch
        below = False
        if p is not None and best is not None and p.gold <= best.gold:
            err = difference_error(p.step, best.step, errors, scores)
            if err is not None and p.proxy is not None and best.proxy is not None:
                se, paired = err
                zz = (best.gold - p.gold) / se if se > 0 else (math.inf if p.gold < best.gold else 0.0)
                below = zz > z and p.proxy > best.proxy
        if below:
            run.append((p, zz, paired))
            continue
        if len(run) >= falls and best is not None:
            last, z_last, paired_last = run[-1]
            out.append(
                Drop(
                    best.step,
                    run[0][0].step,
                    last.step,
                    len(run),
                    best.gold - last.gold,
                    z_last,
                    (last.proxy or 0.0) - (best.proxy or 0.0),
                    paired_last,
                )
            )
        run.clear()
        if p is not None and (best is None or p.gold > best.gold):
            best = p
    return out


def watch(
    gold: Mapping[int, float],
    proxy: Mapping[int, float] | None = None,
    kl: Mapping[int, float] | None = None,
    checkpoints: Iterable[int] = (),
    falls: int = DEFAULT_FALLS,
    errors: Mapping[int, float] | None = None,
    z: float = DEFAULT_Z,
    scores: Scores | None = None,
) -> Watch:
    """Points, the stretches of both warning rules (the second only with ``errors``, each step's
    standard error of the gold, or ``scores``, each step's per-sample gold by prompt), the best
    evaluation by gold (the earliest of equal ones) and the checkpoint saved at that step, if one was
    (else the saved checkpoint with the best gold)."""
    points = align(gold, proxy, kl)
    result = Watch(points=points, falls=falls, episodes=falling_episodes(points, falls), z=z)
    if errors or scores:
        result.has_errors = True
        result.drops = drops_from_best(points, errors or {}, falls, z, scores)
    if points:
        result.best = max(points, key=lambda p: (p.gold, -p.step))
        saved = set(int(s) for s in checkpoints)
        with_ckpt = [p for p in points if p.step in saved]
        if with_ckpt:
            result.best_checkpoint = max(with_ckpt, key=lambda p: (p.gold, -p.step)).step
    return result


def series_from_rows(rows: Iterable[Mapping[str, Any]], key: str) -> dict[int, float]:
    """``{step: value}`` of one key in metrics.jsonl-style rows (``{"step": s, key: v, ...}``)."""
    return {int(r["step"]): float(r[key]) for r in rows if _finite(r.get(key))}


def pick_proxy(series: Mapping[str, Mapping[int, float]]) -> tuple[str, Mapping[int, float]]:
    for key in PROXY_KEYS:
        if series.get(key):
            return key, series[key]
    return PROXY_KEYS[0], {}


def watch_run_dir(
    run_dir: str | Path, gold_key: str = GOLD_KEY, falls: int = DEFAULT_FALLS
) -> tuple[Watch, str]:
    """The watch of a run directory (metrics.jsonl, checkpoints/rl-<step>), and the proxy key used."""
    run_dir = Path(run_dir)
    # The run may still be writing: a last line cut short is passed over, as the study reader does.
    rows = read_jsonl(run_dir / "metrics.jsonl", skip_invalid=True)
    keys = {gold_key, KL_KEY, *PROXY_KEYS}
    series = {k: series_from_rows(rows, k) for k in keys}
    proxy_key, proxy = pick_proxy(series)
    if not series[gold_key]:
        found = sorted({k for r in rows for k in r if k.startswith("eval/")})
        raise KeyError(
            f"{run_dir}: no {gold_key!r} in metrics.jsonl; evaluation keys: {', '.join(found) or 'none'}"
        )
    ckpts = [int(p.name[3:]) for p in (run_dir / "checkpoints").glob("rl-*") if p.name[3:].isdigit()]
    rows = _eval_rows(run_dir, gold_key, with_ids=True)  # samples.jsonl read once for both
    errors = {step: se for step, (_n, se) in step_errors((st, v) for st, v, _sid in rows).items()}
    scores = group_scores((st, sid, v) for st, v, sid in rows if sid)
    return watch(series[gold_key], proxy, series[KL_KEY], ckpts, falls, errors, scores=scores), proxy_key


def sample_errors(run_dir: str | Path, key: str) -> dict[int, tuple[int, float]]:
    """``{step: (n, standard error)}`` of an evaluation key from the per-sample scores in samples.jsonl.

    Why from the samples: metrics.jsonl holds each evaluation's mean only. Periodic evaluations store
    ``train.log_samples`` of their generations with every metric's per-sample value (the final one
    stores all), so a run that keeps as many as it has evaluation prompts gives each point its
    sample standard deviation / √n. Steps with fewer than two scored samples are left out."""
    return step_errors(_eval_rows(run_dir, key))


def sample_scores(run_dir: str | Path, key: str) -> dict[int, dict[str, float]]:
    """``{step: {sample_id: score}}`` of an evaluation key from samples.jsonl, for paired differences
    (:func:`difference_error`); samples without an id are left out, repeats of an id averaged."""
    return group_scores((step, sid, v) for step, v, sid in _eval_rows(run_dir, key, with_ids=True) if sid)


def group_scores(rows: Iterable[tuple[Any, Any, Any]]) -> dict[int, dict[str, float]]:
    """``{step: {sample_id: mean score}}`` from ``(step, sample_id, score)`` rows, non-finite scores
    left out: the one grouping the run-directory watch and the web app's (``overopt_views``) share."""
    sums: dict[int, dict[str, list[float]]] = {}
    for step, sid, v in rows:
        if _finite(v):
            sums.setdefault(int(step), {}).setdefault(str(sid), []).append(float(v))
    return {step: {sid: sum(vs) / len(vs) for sid, vs in ids.items()} for step, ids in sums.items()}


def _eval_rows(run_dir: str | Path, key: str, with_ids: bool = False) -> list[tuple[Any, ...]]:
    """``(step, per-sample score[, sample_id])`` of the evaluation split's samples in samples.jsonl."""
    run_dir = Path(run_dir)
    name = key.removeprefix("eval/")
    try:
        split = json.loads((run_dir / "config.json").read_text())["eval"]["split"]
    except (OSError, ValueError, KeyError, TypeError):
        split = "validation"
    path = run_dir / "samples.jsonl"
    rows = read_jsonl(path, skip_invalid=True) if path.exists() else []
    return [
        (r["step"], (r.get("metrics") or {}).get(name), *((r.get("sample_id"),) if with_ids else ()))
        for r in rows
        if r.get("split") == split
    ]


def step_errors(scores: Iterable[tuple[Any, Any]]) -> dict[int, tuple[int, float]]:
    """``{step: (n, standard error)}`` from ``(step, per-sample score)`` pairs, non-finite scores left
    out, steps with fewer than two left out: the one grouping the run-directory watch
    (:func:`sample_errors`) and the web app's (``overopt_views.gold_errors``) share."""
    by_step: dict[int, list[float]] = {}
    for step, v in scores:
        if _finite(v):
            by_step.setdefault(int(step), []).append(float(v))
    return {
        step: (len(vals), se) for step, vals in by_step.items() if (se := standard_error(vals)) is not None
    }


def standard_error(values: list[float]) -> float | None:
    """Sample standard deviation / √n of one evaluation's per-sample scores (None below two): the
    error :func:`step_errors` puts on a point."""
    n = len(values)
    if n < 2:
        return None
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def write_svgs(
    run_dir: str | Path,
    out_dir: str | Path,
    gold_key: str = GOLD_KEY,
    also: Iterable[str] = (),
    labels: Mapping[str, str] | None = None,
) -> list[Path]:
    """Two standalone SVG charts of a run's watch, for documents: proxy, gold and the ``also`` keys
    (evaluation keys on the same scale) against the training step and against √KL, each point with
    ± one standard error where :func:`sample_errors` has one. Returns the files written."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    w, proxy_key = watch_run_dir(run_dir, gold_key)
    rows = read_jsonl(run_dir / "metrics.jsonl", skip_invalid=True)
    labels = dict(labels or {})
    keys = [proxy_key, gold_key, *[k for k in also if k not in (proxy_key, gold_key)]]
    kl_at = {p.step: p.sqrt_kl for p in w.points}
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for x_name, x_label in (("step", "training step"), ("kl", "√KL from the initial policy (nats)")):
        cells: dict[str, Any] = {}
        for key in keys:
            series = series_from_rows(rows, key)
            errors = sample_errors(run_dir, key)
            steps = [s for s in sorted(series) if s in kl_at and (x_name == "step" or kl_at[s] is not None)]
            if not steps:
                continue
            xs = [s if x_name == "step" else kl_at[s] for s in steps]
            role = "proxy" if key == proxy_key else "gold" if key == gold_key else ""
            # the key's last part: "eval/semantic/sentiment_tfidf_continuation" would not fit the legend
            short = key.rsplit("/", 1)[-1]
            name = labels.get(key) or (f"{role}: {short}" if role else short)
            cells[name] = {
                "steps": xs,
                "mean": [series[s] for s in steps],
                "std": [errors[s][1] if s in errors else 0.0 for s in steps],
            }
        title = f"{run_dir.name}: proxy and gold by {'step' if x_name == 'step' else '√KL'} (± 1 SE)"
        path = out_dir / f"overopt-{x_name}.svg"
        legend = max([150, *(int(24 + 6.5 * len(name)) for name in cells)])
        path.write_text(
            svg_chart(
                title,
                {"cells": cells},
                width=610 + legend,
                x_label=x_label,
                integer_x=x_name == "step",
                legend_width=legend,
            )
        )
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    """``python -m engine.overopt RUN_DIR [GOLD_KEY] [FALLS] [--svg DIR] [--also KEY ...]``: the table
    and the warning, as text; with ``--svg`` also the two charts (:func:`write_svgs`)."""
    ap = argparse.ArgumentParser(prog="python -m engine.overopt", description=main.__doc__)
    ap.add_argument("run_dir")
    ap.add_argument("gold_key", nargs="?", default=GOLD_KEY)
    ap.add_argument("falls", nargs="?", type=int, default=DEFAULT_FALLS)
    ap.add_argument("--svg", metavar="DIR", help="also write overopt-step.svg and overopt-kl.svg here")
    ap.add_argument("--also", nargs="*", default=[], metavar="KEY", help="more evaluation keys to draw")
    try:
        args = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    w, proxy_key = watch_run_dir(args.run_dir, args.gold_key, args.falls)
    print(f"{'step':>6} {'sqrt_kl':>8} {proxy_key:>18} {'gold':>10}")
    for p in w.points:
        kl = f"{p.sqrt_kl:.3f}" if p.sqrt_kl is not None else "-"
        proxy = f"{p.proxy:.4f}" if p.proxy is not None else "-"
        print(f"{p.step:>6} {kl:>8} {proxy:>18} {p.gold:>10.4f}")
    if w.best:
        print(
            f"best by gold: step {w.best.step} (gold {w.best.gold:.4f}); best checkpoint: {w.best_checkpoint}"
        )
    print(w.warning or "no warning")
    if args.svg:
        for path in write_svgs(args.run_dir, args.svg, args.gold_key, args.also):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
