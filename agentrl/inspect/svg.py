"""A small inline-SVG line chart (no plotting library, no script): metric vs step.

Example::

    svg = line_chart_svg("reward/mean", [1, 2, 3], [0.1, 0.4, 0.3])
    assert svg.startswith("<svg") and "polyline" in svg and "reward/mean" in svg
"""

from __future__ import annotations

from html import escape

WIDTH, HEIGHT = 256, 140
_PAD_L, _PAD_R, _PAD_T, _PAD_B = 42, 10, 22, 22
_DOTS_UP_TO = 60  # few points: draw dots with hover titles


def _fmt(v: float) -> str:
    return f"{v:.3g}"


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
    plot_w, plot_h = width - _PAD_L - _PAD_R, height - _PAD_T - _PAD_B

    def px(step: int) -> float:
        return _PAD_L + (step - x0) / span_x * plot_w if x1 > x0 else _PAD_L + plot_w / 2

    def py(v: float) -> float:
        return _PAD_T + (hi_v - v) / (hi_v - lo_v) * plot_h

    parts = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
        f'<text x="{_PAD_L}" y="14" class="ct">{escape(title)}</text>',
        f'<line x1="{_PAD_L}" y1="{_PAD_T + plot_h}" x2="{_PAD_L + plot_w}" y2="{_PAD_T + plot_h}" class="ax"/>',
        f'<line x1="{_PAD_L}" y1="{_PAD_T}" x2="{_PAD_L}" y2="{_PAD_T + plot_h}" class="ax"/>',
        f'<text x="{_PAD_L - 4}" y="{_PAD_T + 4}" class="yl">{_fmt(hi_v)}</text>',
        f'<text x="{_PAD_L - 4}" y="{_PAD_T + plot_h}" class="yl">{_fmt(lo_v)}</text>',
        f'<text x="{_PAD_L}" y="{height - 6}" class="xl">{x0}</text>',
        f'<text x="{_PAD_L + plot_w}" y="{height - 6}" class="xl xr">step {x1}</text>',
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
