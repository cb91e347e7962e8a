"""A small inline-SVG line chart (no plotting library, no script): metric vs step.

Axis labels are short (``tick_label``: at most 7 characters, SI prefixes for very small or
large values, e.g. a loss of 2.73e-08 reads ``27.3n``) and the left margin is sized for the
longest one, so no label is cut at the chart's edge.

Example::

    svg = line_chart_svg("reward/mean", [1, 2, 3], [0.1, 0.4, 0.3])
    assert svg.startswith("<svg") and "polyline" in svg and "reward/mean" in svg
"""

from __future__ import annotations

import math
from html import escape

WIDTH, HEIGHT = 256, 140
_PAD_L, _PAD_R, _PAD_T, _PAD_B = 42, 10, 22, 22
_DOTS_UP_TO = 60  # few points: draw dots with hover titles
TICK_CHAR_PX = 6.5  # an upper bound of a character's width in the 10px axis font (page_css: .chart .yl)
TICK_GAP_PX = 4  # between a y label's right end and the axis
_SI = {-24: "y", -21: "z", -18: "a", -15: "f", -12: "p", -9: "n", -6: "µ", -3: "m",
       0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E", 21: "Z", 24: "Y"}


def _fmt(v: float) -> str:
    return f"{v:.4g}"  # hover titles: room for more digits


def tick_label(v: float) -> str:
    """A short axis label (at most 7 characters): plain in [0.01, 1000), else an SI prefix.

    >>> [tick_label(x) for x in (0, 0.5, -0.0123, 999.9, 2.73e-08, -5.96e-08, 1234567, 1e-30)]
    ['0', '0.5', '-0.0123', '1k', '27.3n', '-59.6n', '1.23M', '1e-30']
    """
    if v == 0 or not math.isfinite(v):
        return "0" if v == 0 else str(v)
    rounded = float(f"{v:.3g}")
    if 0.01 <= abs(rounded) < 1000:
        return f"{rounded:g}"
    a = abs(v)
    exp3 = 3 * math.floor(math.log10(a) / 3)
    mant = float(f"{v / 10 ** exp3:.3g}")
    if abs(mant) >= 1000:  # 999.96 rounds up to the next prefix
        exp3, mant = exp3 + 3, mant / 1000
    if exp3 not in _SI:
        return f"{v:.0e}".replace("e-0", "e-").replace("e+0", "e+").replace("e+", "e")
    return f"{mant:g}{_SI[exp3]}"


def left_margin(labels: list[str]) -> int:
    """The left padding that fits the longest y label, at least the default."""
    longest = max((len(x) for x in labels), default=0)
    return max(_PAD_L, math.ceil(longest * TICK_CHAR_PX) + TICK_GAP_PX + 2)


def line_chart_svg(title: str, steps: list[int], values: list[float],
                   band: tuple[list[float], list[float]] | None = None,
                   width: int = WIDTH, height: int = HEIGHT, color: str = "#2f6fdf") -> str:
    """SVG markup of ``values`` over ``steps``; ``band`` = (lower, upper) shaded around the line."""
    lo_v = min(values + (band[0] if band else []))
    hi_v = max(values + (band[1] if band else []))
    if hi_v - lo_v < 1e-12:
        lo_v, hi_v = lo_v - 0.5, hi_v + 0.5
    x0, x1 = min(steps), max(steps)
    span_x = max(1, x1 - x0)
    hi_label, lo_label = tick_label(hi_v), tick_label(lo_v)
    pad_l = left_margin([hi_label, lo_label])
    plot_w, plot_h = width - pad_l - _PAD_R, height - _PAD_T - _PAD_B

    def px(step: int) -> float:
        return pad_l + (step - x0) / span_x * plot_w if x1 > x0 else pad_l + plot_w / 2

    def py(v: float) -> float:
        return _PAD_T + (hi_v - v) / (hi_v - lo_v) * plot_h

    parts = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
        f'<text x="{pad_l}" y="14" class="ct">{escape(title)}</text>',
        f'<line x1="{pad_l}" y1="{_PAD_T + plot_h}" x2="{pad_l + plot_w}" y2="{_PAD_T + plot_h}" class="ax"/>',
        f'<line x1="{pad_l}" y1="{_PAD_T}" x2="{pad_l}" y2="{_PAD_T + plot_h}" class="ax"/>',
        f'<text x="{pad_l - TICK_GAP_PX}" y="{_PAD_T + 4}" class="yl">{escape(hi_label)}</text>',
        f'<text x="{pad_l - TICK_GAP_PX}" y="{_PAD_T + plot_h}" class="yl">{escape(lo_label)}</text>',
        f'<text x="{pad_l}" y="{height - 6}" class="xl">{x0}</text>',
        f'<text x="{pad_l + plot_w}" y="{height - 6}" class="xl xr">step {x1}</text>',
    ]
    if band:
        upper = " ".join(f"{px(s):.1f},{py(v):.1f}" for s, v in zip(steps, band[1]))
        lower = " ".join(f"{px(s):.1f},{py(v):.1f}" for s, v in reversed(list(zip(steps, band[0]))))
        parts.append(f'<polygon points="{upper} {lower}" fill="{color}" opacity="0.15"/>')
    pts = " ".join(f"{px(s):.1f},{py(v):.1f}" for s, v in zip(steps, values))
    parts.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="1.8"/>')
    if len(steps) <= _DOTS_UP_TO:
        for s, v in zip(steps, values):
            parts.append(f'<circle cx="{px(s):.1f}" cy="{py(v):.1f}" r="2.5" fill="{color}">'
                         f'<title>step {s}: {_fmt(v)}</title></circle>')
    parts.append("</svg>")
    return "".join(parts)
