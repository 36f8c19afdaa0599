"""The report's figures as standalone SVG: seed means with mean ± std bands, one colour per cell.

Why hand-written: neither kaleido nor matplotlib is installed here, and an SVG plotly writes into its
HTML page is drawn by JavaScript, not an image."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from engine.presets import ALGORITHM_LABELS

_PALETTE = {
    "zero_shot": "#7f7f7f",
    "supervised": "#8c564b",
    "ppo": "#1f77b4",
    "nlpo": "#d62728",
    "supervised_ppo": "#17becf",
    "supervised_nlpo": "#ff7f0e",
}
# Series that are not cells (a comparison of two runs): colours by position.
_FALLBACK = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b")


def _ticks(lo: float, hi: float, n: int = 5, integer: bool = False) -> list[float]:
    """Round tick values from at or below ``lo`` to at or above ``hi`` (whole numbers with ``integer``)."""
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    if integer:
        step = max(1, round(step))
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [round(i * step, 12) for i in range(first, last + 1)]


def svg_chart(
    title: str,
    data: dict[str, Any],
    width: int = 640,
    height: int = 360,
    x_label: str = "iteration",
    integer_x: bool = True,
    legend_width: int = 150,
) -> str:
    """A line chart of seed means with mean ± std bands, one colour per cell, as a standalone SVG.

    Why hand-written: neither kaleido nor matplotlib is installed here, and an SVG plotly writes
    into its HTML page is drawn by JavaScript, not an image. Cells with a single step (Zero-shot,
    Supervised: one evaluation) are drawn as dashed horizontal lines across the plot."""
    ml, mr, mt, mb = 60, legend_width, 30, 40
    pw, ph = width - ml - mr, height - mt - mb
    cells = data.get("cells", {})
    xs = [s for c in cells.values() for s in c["steps"]]
    ys: list[float] = []
    for c in cells.values():
        for m, sd in zip(c["mean"], c["std"]):
            if m is None:
                continue
            ys += [m - (sd or 0.0), m + (sd or 0.0)]
    esc = lambda s: s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")  # noqa: E731
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{ml}" y="18" font-size="13" font-weight="bold">{esc(title)}</text>',
    ]
    if not xs or not ys:
        parts.append(f'<text x="{ml}" y="{mt + ph / 2}">no data</text></svg>')
        return "\n".join(parts)
    x0, x1 = min(xs), max(xs)
    if x1 == x0:
        x1 = x0 + 1
    yt = _ticks(min(ys), max(ys))
    y0, y1 = yt[0], yt[-1] if yt[-1] > yt[0] else yt[0] + 1

    def px(x: float) -> float:
        return ml + (x - x0) / (x1 - x0) * pw

    def py(y: float) -> float:
        return mt + ph - (y - y0) / (y1 - y0) * ph

    parts.append(f'<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
    for t in yt:
        parts.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{py(t):.1f}" y2="{py(t):.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{ml - 5}" y="{py(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    for t in _ticks(x0, x1, integer=integer_x):
        if x0 <= t <= x1:
            parts.append(f'<text x="{px(t):.1f}" y="{mt + ph + 15}" text-anchor="middle">{t:g}</text>')
    parts.append(f'<text x="{ml + pw / 2}" y="{height - 8}" text-anchor="middle">{esc(x_label)}</text>')
    for i, (cell, c) in enumerate(cells.items()):
        colour = _PALETTE.get(cell, _FALLBACK[i % len(_FALLBACK)])
        pts = [(s, m, sd) for s, m, sd in zip(c["steps"], c["mean"], c["std"]) if m is not None]
        parts += _series(pts, colour, px, py, ml, pw)
        ly = mt + 12 + i * 16
        dash = ' stroke-dasharray="5,4"' if len(pts) == 1 else ""
        parts.append(
            f'<line x1="{ml + pw + 10}" x2="{ml + pw + 30}" y1="{ly - 4}" y2="{ly - 4}" stroke="{colour}" stroke-width="2"{dash}/>'
        )
        parts.append(f'<text x="{ml + pw + 35}" y="{ly}">{esc(ALGORITHM_LABELS.get(cell, cell))}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def _series(
    pts: list[tuple[float, float, float | None]],
    colour: str,
    px: Callable[[float], float],
    py: Callable[[float], float],
    ml: float,
    pw: float,
) -> list[str]:
    """One cell's band and line; a single evaluation becomes a dashed level across the plot so it can be
    compared with the curves of the RL cells."""
    parts: list[str] = []
    if len(pts) == 1:
        _s, m, sd = pts[0]
        if sd:
            parts.append(
                f'<rect x="{ml}" y="{py(m + sd):.1f}" width="{pw}" height="{py(m - sd) - py(m + sd):.1f}" '
                f'fill="{colour}" fill-opacity="0.12"/>'
            )
        parts.append(
            f'<line x1="{ml}" x2="{ml + pw}" y1="{py(m):.1f}" y2="{py(m):.1f}" stroke="{colour}" '
            'stroke-dasharray="5,4" stroke-width="1.5"/>'
        )
    elif pts:
        if any(sd for _s, _m, sd in pts):
            upper = [f"{px(s):.1f},{py(m + (sd or 0)):.1f}" for s, m, sd in pts]
            lower = [f"{px(s):.1f},{py(m - (sd or 0)):.1f}" for s, m, sd in reversed(pts)]
            parts.append(f'<polygon points="{" ".join(upper + lower)}" fill="{colour}" fill-opacity="0.15"/>')
        line = " ".join(f"{px(s):.1f},{py(m):.1f}" for s, m, _sd in pts)
        parts.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="2"/>')
    return parts
