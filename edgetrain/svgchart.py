"""The chart frame the HTML reports share (profile, fleet): inline SVG with its axes, tick labels and fonts
sized to read on a phone as on a desktop; ``fmt`` is how their numbers are written."""
from __future__ import annotations

import html
import math


def fmt(v, digits: int = 3) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.{digits}g}"
    return str(v)


W, H = 640, 220
# The charts' font in user units: 11 on a wide screen; on a phone, where the 640-unit chart is scaled down to the
# screen's width, 15 (the CSS below), so that it reads at about 9 px.
CHART_FONT, CHART_FONT_MAX = 11, 15
PAD_B, PAD_T, PAD_R = 34, 14, 16  # the left pad is each chart's own (pad_left): its tick labels' width


def svg(body: str, height: int = H, title: str = "") -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {height}" width="{W}" height="{height}" '
            f'role="img" aria-label="{html.escape(title)}" font-family="system-ui,sans-serif" font-size="11">'
            f'{body}</svg>')


def text(x, y, s, anchor="start", extra="") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" {extra}>{html.escape(str(s))}</text>'


def text_width(s: str, font_px: float = CHART_FONT_MAX) -> float:
    """A generous width for ``s`` in user units at the largest font the charts use (system-ui digits and
    letters average under 0.6 em)."""
    return 0.62 * font_px * len(s)


def nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if v <= m * exp:
            return m * exp
    return 10 * exp


def pad_left(ymax: float) -> float:
    """Room left of the plot for the rotated unit (up to x=24) and the longest tick label at the phone's font."""
    return max(66.0, 30.0 + text_width(max((fmt(ymax * i / 4) for i in range(5)), key=len)))


def axes(ymax: float, unit: str, height: int = H) -> str:
    PAD_L = pad_left(ymax)  # noqa: N806 - the pad every chart reads
    out = []
    plot_h = height - PAD_B - PAD_T
    for i in range(5):
        y = height - PAD_B - plot_h * i / 4
        out.append(f'<line x1="{PAD_L:.1f}" x2="{W - PAD_R}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(text(PAD_L - 6, y + 4, fmt(ymax * i / 4), "end"))
    out.append(text(16, PAD_T + plot_h / 2, unit, "middle",
                     f'transform="rotate(-90 16 {PAD_T + plot_h / 2:.1f})"'))
    return "".join(out)
