"""Small inline-SVG charts for the run report: line charts and grouped bar charts, no dependency.

Hand-written rather than matplotlib so that `eaglekit run` writes its report on the plain install
(matplotlib is the optional `plots` extra), and so that the page is text: every point is an
element with a `<title>` (its value on hover), and a test can count what was drawn.

    line_chart([Series("val", xs, ys)], title=..., xlabel=..., ylabel=...)   -> "<svg ...>...</svg>"
    bar_chart(["a", "b"], [Series("tau", [0, 1], [1.2, 1.5])], title=..., ylabel=...)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

# The charts' text and frame styles, one source for the report page's CSS and each standalone SVG file.
CHART_STYLE = {
    ".title": "font-size: 13px; font-weight: 600; fill: #1d2329",
    ".tick, .legend, .value": "font-size: 10px; fill: #444",
    ".label": "font-size: 11px; fill: #333",
    ".plot-area": "fill: #fff; stroke: #aab2ba",
    ".grid": "stroke: #e6e9ec",
    ".tickmark": "stroke: #aab2ba",
}


def chart_css(scope: str = "") -> str:
    """CHART_STYLE as CSS rules, each selector prefixed with `scope` (e.g. "svg ")."""
    return " ".join(
        f"{', '.join(scope + part.strip() for part in selector.split(','))} {{ {rule}; }}"
        for selector, rule in CHART_STYLE.items()
    )


PALETTE = ("#3b7dd8", "#d8843b", "#3ba55c", "#c8413b", "#8a5cc8", "#8c6d31", "#d85fa8", "#5f6b7a", "#17a2b8", "#b8a400")
W, H = 560, 300
LEFT, RIGHT, TOP, BOTTOM = 62, 14, 30, 46
MAX_MARKERS = 150  # points of a series drawn as markers with a hover title


@dataclass
class Series:
    """One line (or one bar colour): y values at x positions; None values are gaps."""

    name: str
    xs: list[float]
    ys: list[float | None]
    color: str | None = None
    dashed: bool = False
    labels: list[str] = field(default_factory=list)  # per point, shown on hover


@dataclass
class HLine:
    """A horizontal reference line (e.g. the tau the bench measured)."""

    name: str
    y: float
    color: str = "#444444"


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About `count` round tick values covering [lo, hi]."""
    if not math.isfinite(lo) or not math.isfinite(hi):
        return [0.0, 1.0]
    if hi <= lo:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / max(count, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks, v = [], start
    while v <= hi + step * 1e-9:
        ticks.append(round(v, 12))
        v += step
    if ticks[-1] < hi:
        ticks.append(round(v, 12))
    return ticks


def wrap(text: str, width: int, max_lines: int = 2) -> list[str]:
    """Words of `text` in lines of about `width` characters (the last one cut with an ellipsis)."""
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    if len(lines) > max_lines:
        lines = lines[: max_lines - 1] + [" ".join(lines[max_lines - 1 :])]
    return [line if len(line) <= width + 2 else line[:width] + "…" for line in lines] or [""]


def fmt_num(v: float) -> str:
    """Tick / value text: 1.5k, 2M, 0.25, 3."""
    a = abs(v)
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if a >= size:
            return f"{v / size:.3g}{unit}"
    if a == 0 or a >= 100:
        return f"{v:.0f}"
    return f"{v:.3g}"


class Frame:
    """Maps data coordinates into the plot area of one chart."""

    def __init__(self, xlo: float, xhi: float, ylo: float, yhi: float, *, logx: bool = False):
        self.logx = logx
        self.xlo, self.xhi = self.tx(xlo), self.tx(xhi)
        if self.xhi <= self.xlo:
            self.xlo, self.xhi = self.xlo - 0.5, self.xhi + 0.5
        self.ylo, self.yhi = ylo, yhi if yhi > ylo else ylo + 1

    def tx(self, x: float) -> float:
        return math.log2(x) if self.logx else x

    def px(self, x: float) -> float:
        return LEFT + (self.tx(x) - self.xlo) / (self.xhi - self.xlo) * (W - LEFT - RIGHT)

    def py(self, y: float) -> float:
        return TOP + (1 - (y - self.ylo) / (self.yhi - self.ylo)) * (H - TOP - BOTTOM)


def open_svg(kind: str, title: str) -> list[str]:
    return [
        f'<svg class="chart {kind}" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" '
        f'height="{H}" role="img" aria-label="{escape(title)}">',
        f'<text class="title" x="{W / 2}" y="18" text-anchor="middle">{escape(title)}</text>',
    ]


def axes(frame: Frame, xticks: list[tuple[float, str]], yticks: list[float], xlabel: str, ylabel: str) -> list[str]:
    out = [f'<rect class="plot-area" x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" height="{H - TOP - BOTTOM}"/>']
    for y in yticks:
        if frame.ylo - 1e-12 <= y <= frame.yhi + 1e-12:
            py = frame.py(y)
            out.append(f'<line class="grid" x1="{LEFT}" x2="{W - RIGHT}" y1="{py:.1f}" y2="{py:.1f}"/>')
            out.append(f'<text class="tick" x="{LEFT - 6}" y="{py + 4:.1f}" text-anchor="end">{fmt_num(y)}</text>')
    for x, text in xticks:
        px = frame.px(x)
        out.append(f'<line class="tickmark" x1="{px:.1f}" x2="{px:.1f}" y1="{H - BOTTOM}" y2="{H - BOTTOM + 4}"/>')
        out.append(f'<text class="tick" x="{px:.1f}" y="{H - BOTTOM + 16}" text-anchor="middle">{escape(text)}</text>')
    out.append(
        f'<text class="label" x="{(LEFT + W - RIGHT) / 2}" y="{H - 8}" text-anchor="middle">{escape(xlabel)}</text>'
    )
    out.append(
        f'<text class="label" x="14" y="{(TOP + H - BOTTOM) / 2}" text-anchor="middle" '
        f'transform="rotate(-90 14 {(TOP + H - BOTTOM) / 2})">{escape(ylabel)}</text>'
    )
    return out


def legend(items: list[tuple[str, str, bool]]) -> list[str]:
    """Entries (name, color, dashed) in rows at the top right of the plot area."""
    out, x, y = [], LEFT + 8, TOP + 12
    for name, color, dashed in items:
        width = 24 + 6.4 * len(name)
        if x + width > W - RIGHT:
            x, y = LEFT + 8, y + 14
        dash = ' stroke-dasharray="5 3"' if dashed else ""
        out.append(
            f'<line x1="{x}" x2="{x + 16}" y1="{y - 4}" y2="{y - 4}" stroke="{color}" stroke-width="2.5"{dash}/>'
        )
        out.append(f'<text class="legend" x="{x + 20}" y="{y}">{escape(name)}</text>')
        x += width + 8
    return out


def y_range(values: list[float], ylim: tuple[float | None, float | None]) -> tuple[float, float]:
    lo = ylim[0] if ylim[0] is not None else min(values)
    hi = ylim[1] if ylim[1] is not None else max(values)
    if ylim[0] is None and ylim[1] is None:
        pad = (hi - lo) * 0.08 or abs(hi) * 0.05 or 0.5
        lo, hi = lo - pad, hi + pad
    elif ylim[1] is None:  # a fixed floor (tau >= 1): head room above the top point for the legend
        hi += (hi - lo) * 0.15 or 0.5
    return lo, hi


def line_chart(
    series: list[Series],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    logx: bool = False,
    ylim: tuple[float | None, float | None] = (None, None),
    hlines: list[HLine] = (),
    xticks: list[tuple[float, str]] | None = None,
) -> str:
    """Lines with a marker at every point; `hlines` are labelled reference levels."""
    points = [(x, y) for s in series for x, y in zip(s.xs, s.ys) if y is not None]
    if not points:
        raise ValueError(f"line_chart {title!r}: no points")  # the caller shows "missing" instead
    xs = [p[0] for p in points]
    ys = [p[1] for p in points] + [h.y for h in hlines]
    ylo, yhi = y_range(ys, ylim)
    yt = nice_ticks(ylo, yhi)
    if ylim[0] is None:
        ylo = min(ylo, yt[0])
    if ylim[1] is None:
        yhi = max(yhi, yt[-1])
    frame = Frame(min(xs), max(xs), ylo, yhi, logx=logx)
    if xticks is None:
        xticks = (
            [(x, fmt_num(x)) for x in nice_ticks(min(xs), max(xs), 6) if min(xs) <= x <= max(xs)]
            if not logx
            else [(x, fmt_num(x)) for x in sorted(set(xs))]
        )
    out = open_svg("line", title) + axes(frame, xticks, yt, xlabel, ylabel)
    items = []
    for i, s in enumerate(series):
        color = s.color or PALETTE[i % len(PALETTE)]
        dash = ' stroke-dasharray="5 3"' if s.dashed else ""
        pts = [
            (frame.px(x), frame.py(y), x, y, (s.labels[k] if k < len(s.labels) else ""))
            for k, (x, y) in enumerate(zip(s.xs, s.ys))
            if y is not None
        ]
        if len(pts) > 1:
            path = " ".join(f"{px:.1f},{py:.1f}" for px, py, *_ in pts)
            out.append(
                f'<polyline class="series" data-series="{escape(s.name)}" fill="none" stroke="{color}" '
                f'stroke-width="2"{dash} points="{path}"/>'
            )
        radius = 3 if len(pts) <= 60 else 1.6
        # Long curves (a training log of thousands of steps) keep their line and their end points only.
        marked = pts if len(pts) <= MAX_MARKERS else [pts[0], pts[-1]]
        for px, py, x, y, label in marked:
            tip = f"{s.name}: {fmt_num(x)} → {y:.4g}" + (f" ({label})" if label else "")
            out.append(
                f'<circle class="point" cx="{px:.1f}" cy="{py:.1f}" r="{radius}" fill="{color}">'
                f"<title>{escape(tip)}</title></circle>"
            )
        items.append((s.name, color, s.dashed))
    for h in hlines:
        py = frame.py(h.y)
        out.append(
            f'<line class="hline" x1="{LEFT}" x2="{W - RIGHT}" y1="{py:.1f}" y2="{py:.1f}" stroke="{h.color}" '
            f'stroke-dasharray="2 3"><title>{escape(h.name)}: {h.y:.4g}</title></line>'
        )
        items.append((f"{h.name} {h.y:.3g}", h.color, True))
    out += legend(items)
    out.append("</svg>")
    return "\n".join(out)


def bar_chart(
    groups: list[str],
    series: list[Series],
    *,
    title: str,
    ylabel: str,
    xlabel: str = "",
    ylim: tuple[float | None, float | None] = (0, None),
    value_labels: bool = True,
) -> str:
    """Grouped bars: one group per entry of `groups`, one bar per series (its ys indexed by group)."""
    values = [y for s in series for y in s.ys if y is not None]
    if not values or not groups:
        raise ValueError(f"bar_chart {title!r}: no values")
    lo = ylim[0] if ylim[0] is not None else min(0.0, min(values))
    hi = ylim[1] if ylim[1] is not None else max(values) * 1.12 or 1.0
    yt = nice_ticks(lo, hi)
    if ylim[1] is None:
        hi = max(hi, yt[-1])
    frame = Frame(-0.5, len(groups) - 0.5, lo, hi)
    slot = (W - LEFT - RIGHT) / len(groups)
    width = slot * 0.8 / max(len(series), 1)
    rotate = len(groups) > 8
    out = open_svg("bar", title) + axes(frame, [], yt, xlabel, ylabel)
    for i, g in enumerate(groups):
        px = frame.px(i)
        if rotate:  # many groups: small slanted labels under the axis
            out.append(
                f'<text class="tick" x="{px:.1f}" y="{H - BOTTOM + 12}" text-anchor="end" font-size="8" '
                f'transform="rotate(-35 {px:.1f} {H - BOTTOM + 12})">{escape(g[:24])}</text>'
            )
            continue
        lines = wrap(g, max(int(slot / 6), 6))
        spans = "".join(
            f'<tspan x="{px:.1f}" dy="{0 if k == 0 else 11}">{escape(line)}</tspan>' for k, line in enumerate(lines)
        )
        top = H - BOTTOM + (14 if len(lines) == 1 else 11)
        out.append(f'<text class="tick" x="{px:.1f}" y="{top}" text-anchor="middle">{spans}</text>')
    items = []
    for k, s in enumerate(series):
        color = s.color or PALETTE[k % len(PALETTE)]
        for i, y in enumerate(s.ys):
            if y is None or i >= len(groups):
                continue
            x0 = frame.px(i) - slot * 0.4 + k * width
            y0, y1 = frame.py(max(y, lo)), frame.py(lo)
            label = s.labels[i] if i < len(s.labels) else ""
            tip = f"{s.name}, {groups[i]}: {y:.4g}" + (f" ({label})" if label else "")
            out.append(
                f'<rect class="bar" data-series="{escape(s.name)}" x="{x0:.1f}" y="{y0:.1f}" '
                f'width="{max(width - 1, 1):.1f}" height="{max(y1 - y0, 0.5):.1f}" fill="{color}">'
                f"<title>{escape(tip)}</title></rect>"
            )
            if value_labels and len(groups) * len(series) <= 24:
                out.append(
                    f'<text class="value" x="{x0 + width / 2:.1f}" y="{y0 - 3:.1f}" text-anchor="middle">'
                    f"{fmt_num(y)}</text>"
                )
        items.append((s.name, color, False))
    if len(series) > 1 or series[0].name:
        out += legend(items)
    out.append("</svg>")
    return "\n".join(out)
