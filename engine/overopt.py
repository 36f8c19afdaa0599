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
  the x-axis is its square root, as in Gao et al. An evaluation at step s takes the KL logged at the
  latest training step <= s.

The warning: gold fell at each of ``n`` consecutive evaluations (strictly) while the proxy rose over
the same evaluations (its last value above its first). Pure Python, no torch: the web process uses it.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.jsonl import read_jsonl

__all__ = [
    "DEFAULT_FALLS",
    "Episode",
    "Point",
    "Watch",
    "align",
    "falling_episodes",
    "watch",
    "watch_run_dir",
]

PROXY_KEYS = ("eval/reward_mean", "train/reward_mean")
GOLD_KEY = "eval/gold"
KL_KEY = "train/kl_episode"
DEFAULT_FALLS = 3


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


@dataclass
class Watch:
    points: list[Point]
    falls: int
    episodes: list[Episode] = field(default_factory=list)
    best: Point | None = None
    best_checkpoint: int | None = None

    @property
    def warning(self) -> str | None:
        """One sentence for the run page, or None when the gold never fell ``falls`` times in a row
        while the proxy rose."""
        if not self.episodes:
            return None
        e = self.episodes[-1]
        ongoing = self.points and e.end_step == self.points[-1].step
        more = f" ({len(self.episodes)} such stretches)" if len(self.episodes) > 1 else ""
        return (
            f"Possible reward over-optimisation: the gold fell at {e.falls} consecutive evaluations "
            f"(steps {e.start_step}–{e.end_step}, −{e.gold_drop:.4g}) while the proxy rose "
            f"(+{e.proxy_rise:.4g}){', and is still falling' if ongoing else ''}{more}."
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "points": [vars(p) for p in self.points],
            "falls": self.falls,
            "episodes": [vars(e) for e in self.episodes],
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
    """One point per step with a finite gold value, with the proxy at that step and √KL at the latest
    logged KL step at or before it (None where there is none). Step 0 (``train.eval_at_start``: the
    starting policy, before any update) is at KL 0 by definition: the reference is that policy."""
    proxy, kl = proxy or {}, kl or {}
    kl_steps = sorted(s for s, v in kl.items() if _finite(v))
    out, j, last_kl = [], 0, None
    for step in sorted(s for s, v in gold.items() if _finite(v)):
        while j < len(kl_steps) and kl_steps[j] <= step:
            last_kl = kl[kl_steps[j]]
            j += 1
        p = proxy.get(step)
        out.append(
            Point(
                step=int(step),
                proxy=float(p) if _finite(p) else None,
                gold=float(gold[step]),
                sqrt_kl=math.sqrt(max(float(last_kl), 0.0))
                if last_kl is not None
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


def watch(
    gold: Mapping[int, float],
    proxy: Mapping[int, float] | None = None,
    kl: Mapping[int, float] | None = None,
    checkpoints: Iterable[int] = (),
    falls: int = DEFAULT_FALLS,
) -> Watch:
    """Points, falling stretches, the best evaluation by gold (the earliest of equal ones) and the
    checkpoint saved at that step, if one was (else the saved checkpoint with the best gold)."""
    points = align(gold, proxy, kl)
    result = Watch(points=points, falls=falls, episodes=falling_episodes(points, falls))
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
    return watch(series[gold_key], proxy, series[KL_KEY], ckpts, falls), proxy_key


def main(argv: list[str] | None = None) -> int:
    """``python -m engine.overopt RUN_DIR [GOLD_KEY] [FALLS]``: the table and the warning, as text."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m engine.overopt RUN_DIR [GOLD_KEY] [FALLS]", file=sys.stderr)
        return 2
    w, proxy_key = watch_run_dir(
        args[0], args[1] if len(args) > 1 else GOLD_KEY, int(args[2]) if len(args) > 2 else DEFAULT_FALLS
    )
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
