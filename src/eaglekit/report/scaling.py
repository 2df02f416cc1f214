"""The data-scaling curve's charts: tau and step-0 accuracy against the slices' answer tokens.

One source for `eaglekit run`'s scaling.svg and the report's scaling section. The table is
scaling.json as the pipeline's scaling stage writes it (rows with fraction, tokens, walk_tau, ...).
"""

from __future__ import annotations

from eaglekit.report.svg import H, Series, W, chart_css, line_chart


def tau_chart(table: dict, xlabel: str = "answer tokens") -> str | None:
    """Walk, simulated and bench tau against the slices' answer tokens (tau >= 1, so the axis starts
    there: a spread of noise is not drawn as a slope)."""
    done, xs, labels = _points(table)
    series = [
        Series(name, xs, [r.get(key) for r in done], labels=labels)
        for name, key in (("walk tau", "walk_tau"), ("simulated tau", "sim_tau"), ("bench tau", "bench_tau"))
        if any(r.get(key) is not None for r in done)
    ]
    if not series:
        return None
    return line_chart(
        series,
        title=f"tau against data ({table.get('steps')} steps each)",
        xlabel=xlabel,
        ylabel="tau",
        logx=True,
        ylim=(1, None),
    )


def acc0_chart(table: dict, xlabel: str = "answer tokens") -> str | None:
    """Step-0 accuracy against the slices' answer tokens, on the whole 0..1 axis."""
    done, xs, labels = _points(table)
    ys = [r.get("acc0") for r in done]
    if all(v is None for v in ys):
        return None
    return line_chart(
        [Series("step-0 accuracy", xs, ys, labels=labels)],
        title="step-0 accuracy",
        xlabel=xlabel,
        ylabel="acc_0",
        logx=True,
        ylim=(0, 1),
    )


def _points(table: dict) -> tuple[list[dict], list[float], list[str]]:
    done = [r for r in table.get("rows", []) if r.get("tokens") is not None]
    return done, [r["tokens"] for r in done], [f"{r['fraction']:g} of the data" for r in done]


def scaling_svg(table: dict) -> str | None:
    """`tau_chart` and `acc0_chart` side by side in one SVG."""
    left, right = tau_chart(table), acc0_chart(table)
    if left is None or right is None:
        return None
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * W}" height="{H}" viewBox="0 0 {2 * W} {H}">'
        f'<style>svg {{ font-family: sans-serif; }} {chart_css()}</style><rect width="{2 * W}" height="{H}" fill="#ffffff"/>'
        f'<g>{left}</g><g transform="translate({W} 0)">{right}</g></svg>\n'
    )
