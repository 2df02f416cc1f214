"""The run report as one self-contained HTML page (inline CSS and SVG, no script, no network).

Sections follow the pipeline: stages, training, data scaling, acceptance, speed, doctor. Each
figure is a `<figure data-figure=NAME data-status=STATUS>` whose caption names the files, the exact
command, the device and the date it came from; a figure without data says why ("not run",
"unfinished", ...) in place of the plot. FIGURES lists every figure the page always carries.
"""

from __future__ import annotations

import time
from html import escape
from pathlib import Path

from eaglekit import __version__
from eaglekit.artifacts import atomic_path
from eaglekit.report.collect import Part, RunData, Source, collect
from eaglekit.report.scaling import acc0_chart, tau_chart
from eaglekit.report.svg import PALETTE, HLine, Series, bar_chart, chart_css, fmt_num, line_chart

FIGURES = ("loss", "accuracy", "tau", "scaling-tau", "scaling-acc0", "acceptance", "tau-by-category", "speed")

CSS = (
    """
body { font: 14px/1.45 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #1d2329; margin: 0;
       background: #f6f7f9; }
main { max-width: 1200px; margin: 0 auto; padding: 18px 24px 60px; }
h1 { font-size: 22px; margin: 8px 0 2px; } h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid #d5d9de; }
.meta, figcaption, .note { color: #56606b; font-size: 12px; }
code, pre { font: 12px/1.4 ui-monospace, Menlo, Consolas, monospace; }
pre { background: #fff; border: 1px solid #d5d9de; padding: 8px 10px; white-space: pre-wrap; }
table { border-collapse: collapse; background: #fff; margin: 6px 0 10px; }
th, td { border: 1px solid #d5d9de; padding: 3px 8px; text-align: left; vertical-align: top; font-size: 13px; }
th { background: #eef0f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
td code { word-break: break-all; }
.figures { display: flex; flex-wrap: wrap; gap: 14px; }
figure { margin: 0; background: #fff; border: 1px solid #d5d9de; padding: 8px; width: 566px; }
figure.missing .box { height: 120px; display: flex; align-items: center; justify-content: center;
                      color: #8a939c; background: repeating-linear-gradient(45deg, #fafbfc, #fafbfc 8px, #f0f2f4 8px, #f0f2f4 16px); }
svg.chart { display: block; max-width: 100%; height: auto; }
.badge { display: inline-block; padding: 0 7px; border-radius: 9px; font-size: 12px; font-weight: 600; margin-left: 6px; }
.s-done, .s-pass { background: #d9f2df; color: #1e6b33; } .s-unfinished, .s-stale, .s-warn { background: #fff0c2; color: #7a5b00; }
p.warning { background: #fff8e0; border: 1px solid #e6c85c; padding: 6px 10px; }
.s-failed, .s-fail, .s-unreadable, .s-missing { background: #fadbd8; color: #8e2a20; } .s-not-run, .s-skip { background: #e8eaed; color: #56606b; }
"""
    + chart_css("svg ")
    + "\n"
)


def badge(status: str) -> str:
    return f'<span class="badge s-{escape(status.replace(" ", "-"))}">{escape(status)}</span>'


def source_text(src: Source) -> str:
    bits = []
    if src.files:
        bits.append("from " + ", ".join(f"<code>{escape(f)}</code>" for f in src.files))
    bits.append(f"command <code>{escape(src.command)}</code>" if src.command else "command not recorded")
    bits.append(f"device {escape(str(src.device))}" if src.device else "device not recorded")
    bits.append(f"date {escape(str(src.date))}" if src.date else "date not recorded")
    return " · ".join(bits)


def figure(name: str, part: Part, title: str, svg: str | None, why: str = "", extra: str = "") -> str:
    """A figure, or its place with the reason it is missing."""
    status = part.status if svg is not None or part.status != "done" else "missing"
    label = "" if status == "done" else badge(status)
    caption = f"<figcaption><b>{escape(title)}</b>{label} {extra} {source_text(part.source)}</figcaption>"
    if svg is None:
        reason = why or part.note or status
        return (
            f'<figure class="missing" data-figure="{name}" data-status="{escape(status)}">'
            f'<div class="box">{escape(status)}: {escape(reason)}</div>{caption}</figure>'
        )
    return f'<figure class="plot" data-figure="{name}" data-status="{escape(status)}">{svg}{caption}</figure>'


def table(header: list[str], rows: list[list], num_cols: set[int] = frozenset(), cls: str = "") -> str:
    head = "<tr>" + "".join(f"<th>{escape(h)}</th>" for h in header) + "</tr>" if any(header) else ""
    body = []
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            text = cell if isinstance(cell, Raw) else escape(dash(cell))
            cells.append(f'<td class="num">{text}</td>' if i in num_cols else f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f'<table class="{cls}">{head}{"".join(body)}</table>'


class Raw(str):
    """Table cell HTML that is already escaped."""


def dash(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


# ---- sections -------------------------------------------------------------------------------


def stages_section(data: RunData) -> str:
    out = ["<h2>Stages</h2>"]
    if data.state is None:
        out.append(
            f'<p class="note">no pipeline.json: {escape(data.state_note or "this folder was not written by eaglekit run")}; '
            "the parts below are read from the stage folders alone</p>"
        )
        return "\n".join(out)
    rows = []
    for name, s in data.state["stages"].items():
        status = {"done": "done", "running": "unfinished"}.get(s.get("status"), "failed")
        rows.append(
            [
                name,
                Raw(badge(status)),
                s.get("seconds"),
                s.get("exit_code"),
                Raw(f"<code>{escape(' '.join(['eaglekit', *s['argv']]))}</code>"),
            ]
        )
    out.append(table(["stage", "status", "seconds", "exit", "command"], rows, {2, 3}, "stages"))
    if data.state.get("stopped_before"):
        out.append(
            f'<p class="note">stopped before stage {escape(data.state["stopped_before"])} (--stop-before); '
            "the stages after it are not run</p>"
        )
    if data.state.get("summary"):
        out.append(f"<pre>{escape(data.state['summary'])}</pre>")
    return "\n".join(out)


def weighted_loss(event: dict, decay: float | None, steps: int | None = None) -> float | None:
    """The TTT loss of an event over its first `steps` steps (None: all), so a validation unrolled
    deeper than training (`--val-ttt-steps`) is summed as training's is."""
    ce = (event.get("ce") or [])[:steps]
    if not ce or decay is None:
        return None
    return sum(decay**j * c for j, c in enumerate(ce))


def training_section(data: RunData) -> str:
    part = data.training
    d = part.data
    out = [f"<h2>Training{badge(part.status)}</h2>"]
    if part.note:
        out.append(f'<p class="note">{escape(part.note)}</p>')
    train, val = d.get("train", []), d.get("val", [])
    decay, trained = d.get("step_decay"), d.get("ttt_steps")
    validated = max([len(e.get("acc") or []) for e in val] or [0])  # deeper than trained with --val-ttt-steps
    out.append('<div class="figures">')
    # loss
    series = [
        Series(name, [e["step"] for e in events], [weighted_loss(e, decay, trained) for e in events], dashed=dashed)
        for name, events, dashed in (("train", train, True), ("validation", val, False))
        if events
    ]
    svg = None
    if any(v is not None for s in series for v in s.ys):
        svg = line_chart(series, title=f"loss = Σ_j {decay}^j · ce_j", xlabel="optimizer step", ylabel="loss")
    out.append(
        figure(
            "loss", part, "Loss (TTT, weighted over steps j)", svg, "no training log" if part.status == "done" else ""
        )
    )
    # per-step accuracy
    steps = max([len(e.get("acc") or []) for e in train + val] or [0])
    series = []
    for j in range(steps):
        for name, events, dashed in (("val", val, False), ("train", train, True)):
            ys = [(e.get("acc") or [])[j] if j < len(e.get("acc") or []) else None for e in events]
            if any(y is not None for y in ys):  # training logs no steps past its own (--val-ttt-steps)
                series.append(
                    Series(
                        f"{name} acc_{j}",
                        [e["step"] for e in events],
                        ys,
                        color=PALETTE[j % len(PALETTE)],
                        dashed=dashed,
                    )
                )
    svg = (
        line_chart(
            series,
            title="per-step accuracy acc_j (solid: validation, dashed: training)",
            xlabel="optimizer step",
            ylabel="accuracy",
            ylim=(0, 1),
        )
        if series
        else None
    )
    out.append(
        figure("accuracy", part, "Per-step accuracy acc_j (draft step j matches the target)", svg, "no training log")
    )
    # tau
    series = []
    if val:
        chain = f" (chain {validated})" if trained and validated > trained else ""  # training's sums run to `trained`
        series.append(
            Series(f"val simulated tau{chain}", [e["step"] for e in val], [e.get("sim_accept_length") for e in val])
        )
        series.append(
            Series(f"val walk tau{chain}", [e["step"] for e in val], [e.get("walk_accept_length") for e in val])
        )
    if train:
        series.append(
            Series(
                "train simulated tau",
                [e["step"] for e in train],
                [e.get("sim_accept_length") for e in train],
                dashed=True,
            )
        )
    hlines = []
    probe = (data.doctor.data.get("probe") or {}) if data.doctor.status == "done" else {}
    if probe.get("tau") is not None:
        hlines.append(HLine(f"doctor probe (k={probe.get('k')}, {probe.get('dtype') or '?'})", probe["tau"], "#c8413b"))
    if data.bench.data.get("summary"):
        s = data.bench.data["summary"]
        hlines.append(HLine(f"bench ({s['spec']})", s["tau"], "#5f6b7a"))
    svg = (
        line_chart(
            series,
            title="accept length tau (training's prediction; measured levels dashed)",
            xlabel="optimizer step",
            ylabel="tau (tokens per target forward)",
            hlines=hlines,
        )
        if any(v is not None for s in series for v in s.ys)
        else None
    )
    measured = [f for f in data.doctor.source.files[:1] + data.bench.source.files if hlines]
    extra = (
        ("measured levels from " + ", ".join(f"<code>{escape(f)}</code>" for f in measured) + ";") if measured else ""
    )
    out.append(figure("tau", part, "Simulated and walk tau on validation", svg, "no training log", extra))
    out.append("</div>")
    out.append(training_table(d))
    return "\n".join(out)


def training_table(d: dict) -> str:
    best, counts, steps = d.get("best") or {}, d.get("counts") or {}, d.get("steps") or {}
    if not best and not counts:
        return ""
    base = counts.get("val_baselines") or {}
    rows = [
        ["best step (selected by walk tau)", best.get("step")],
        ["walk tau / simulated tau", f"{dash(best.get('walk_accept_length'))} / {dash(best.get('sim_accept_length'))}"],
        ["acc_j at the best step", ", ".join(f"{a:.3f}" for a in best.get("acc") or []) or None],
        ["steps done / planned", f"{dash(steps.get('done'))} / {dash(steps.get('total'))}"],
        [
            "training samples / tokens",
            f"{dash(counts.get('train_samples'))} / {dash(counts.get('train_tokens', counts.get('tokens')))}",
        ],
        ["validation samples", counts.get("val_samples")],
        [
            "step-0 baselines on validation (unigram / bigram acc)",
            f"{dash(base.get('unigram_acc'))} / {dash(base.get('bigram_acc'))}" if base else None,
        ],
    ]
    if d.get("train_fraction", 1.0) != 1.0:
        rows.append(["share of the training samples (--train-fraction)", d["train_fraction"]])
    return table(["", ""], rows, cls="kv")


def scaling_section(data: RunData) -> str:
    part = data.scaling
    out = [f"<h2>Data scaling{badge(part.status)}</h2>"]
    if part.note:
        out.append(f'<p class="note">{escape(part.note)}</p>')
    rows = part.data.get("rows", [])
    out.append('<div class="figures">')
    svg = tau_chart(part.data, "answer tokens in the training slice (log scale)")
    out.append(figure("scaling-tau", part, "Accept length against training tokens", svg))
    svg = acc0_chart(part.data, "answer tokens (log scale)")
    out.append(figure("scaling-acc0", part, "Step-0 accuracy against training tokens", svg))
    out.append("</div>")
    if rows:
        out.append(
            table(
                [
                    "fraction",
                    "status",
                    "samples",
                    "answer tokens",
                    "steps",
                    "passes",
                    "best step",
                    "walk tau",
                    "sim tau",
                    "acc_0",
                    "bench tau",
                    "speedup",
                    "folder",
                ],
                [
                    [
                        r["fraction"],
                        Raw(badge(r["status"])),
                        r.get("samples"),
                        r.get("tokens"),
                        r.get("steps"),
                        r.get("passes"),
                        r.get("best_step"),
                        r.get("walk_tau"),
                        r.get("sim_tau"),
                        r.get("acc0"),
                        r.get("bench_tau"),
                        r.get("speedup"),
                        Raw(f"<code>{escape(r['folder'])}</code>"),
                    ]
                    for r in rows
                ],
                set(range(2, 12)),
            )
        )
    if part.data.get("verdict"):
        out.append(f"<p><b>{escape(part.data['verdict'])}</b></p>")
    return "\n".join(out)


def acceptance_section(data: RunData) -> str:
    out = ["<h2>Acceptance</h2>", '<div class="figures">']
    best = data.training.data.get("best") or {}
    probe = data.doctor.data.get("probe") or {}
    bench = data.bench.data.get("summary") or {}
    series = []
    if best.get("cum_acc"):
        series.append(("training's prediction (validation, best step)", best["cum_acc"]))
    if probe.get("per_position"):
        series.append((f"doctor probe (k={probe.get('k')})", probe["per_position"]))
    if bench.get("per_position_acceptance"):
        series.append((f"bench ({bench.get('spec')})", bench["per_position_acceptance"]))
    n = max([len(v) for _, v in series] or [0])
    svg = (
        bar_chart(
            [str(i + 1) for i in range(n)],
            [Series(name, list(range(len(v))), list(v)) for name, v in series],
            title="P(first i drafts accepted)",
            xlabel="draft position i",
            ylabel="probability",
            ylim=(0, 1),
        )
        if series
        else None
    )
    merged = Part(
        data.bench.status if bench else (data.doctor.status if probe else data.training.status),
        source=Source(
            files=data.training.source.files[:1] + data.doctor.source.files + data.bench.source.files,
            command=data.bench.source.command,
            device=data.bench.source.device,
            date=data.bench.source.date,
        ),
    )
    out.append(
        figure(
            "acceptance",
            merged,
            "Per-position acceptance: predicted, probed, measured",
            svg,
            "no training, doctor or bench result",
        )
    )
    cats = data.bench.data.get("categories") or []
    svg = None
    if cats and any(c["tau"] is not None for c in cats):
        svg = bar_chart(
            [c["category"] for c in cats],
            [
                Series(
                    "tau",
                    list(range(len(cats))),
                    [c["tau"] for c in cats],
                    labels=[f"{c['prompts']} prompts, {c['cycles']} cycles" for c in cats],
                )
            ],
            title=f"tau by prompt category ({bench.get('spec')})",
            ylabel="tau",
            ylim=(1, None),
        )
    out.append(
        figure(
            "tau-by-category", data.bench, "tau by prompt category (bench)", svg, data.bench.note or "no bench result"
        )
    )
    out.append("</div>")
    if len(cats) > 1:
        out.append(
            "<details><summary>tau and speed per prompt category</summary>"
            + table(
                ["category", "prompts", "tau", "plain tok/s", "spec tok/s", "speedup", "per-prompt median", "range"],
                [
                    [
                        c["category"],
                        c["prompts"],
                        c["tau"],
                        c["plain_tok_s"],
                        c["spec_tok_s"],
                        c["speedup"],
                        c["per_prompt_speedup"]["median"],
                        f"{c['per_prompt_speedup']['min']}-{c['per_prompt_speedup']['max']}",
                    ]
                    for c in cats
                ],
                set(range(1, 7)),
            )
            + "</details>"
        )
    rows = data.bench.data.get("prompts") or []
    if rows:
        out.append(
            "<details><summary>tau and speed per prompt</summary>"
            + table(
                ["prompt", "turns", "tokens", "tau", "cycles", "plain tok/s", "spec tok/s", "speedup", "greedy match"],
                [
                    [
                        r["id"],
                        r["turns"],
                        r["spec"]["tokens"],
                        r["tau"],
                        r["cycles"],
                        r["plain"]["tok_s"],
                        r["spec"]["tok_s"],
                        r["speedup"],
                        r.get("greedy_match"),
                    ]
                    for r in rows
                ],
                set(range(1, 8)),
            )
            + "</details>"
        )
    return "\n".join(out)


def speed_section(data: RunData) -> str:
    part = data.bench
    s = part.data.get("summary") or {}
    out = [f"<h2>Speed{badge(part.status)}</h2>"]
    warning = (s.get("timing") or {}).get("warning")
    if warning:  # the bench's own doubt about its figures, above them
        out.append(f'<p class="warning" data-warning="drift">{badge("warn")} {escape(warning)}</p>')
    out.append('<div class="figures">')
    svg, notes = None, []
    if s:
        groups, values = [], []
        if s.get("hf_tok_s") is not None:
            partial = s.get("hf_prompts", s["prompts"]) < s["prompts"]  # older results have no hf_prompts
            groups.append(f"HF generate (first {s['hf_prompts']} prompts)" if partial else "HF generate")
            values.append(s["hf_tok_s"])
            if partial:
                notes.append(
                    f"HF generate ran on the first {s['hf_prompts']} of {s['prompts']} prompts; "
                    "its ratios compare the methods on those prompts"
                )
        else:
            notes.append("HF generate: not run (the bench ran with --no-hf)")
        groups += ["plain decoding (eaglekit engine)", f"speculative ({s['spec']})"]
        values += [s["baseline_tok_s"], s["spec_tok_s"]]
        svg = bar_chart(
            groups,
            [Series("", list(range(len(groups))), values)],
            title=f"decoding speed, batch 1 ({s.get('device')})",
            ylabel="tokens / s",
        )
    extra = escape("; ".join(notes))
    out.append(figure("speed", part, "Speed against the baselines", svg, part.note or "no bench result", extra))
    out.append("</div>")
    if s:
        spread = s.get("per_prompt_speedup")  # older results have none (their speedup was a ratio of means)
        out.append(
            table(
                ["", ""],
                [
                    [
                        "speedup over plain decoding",
                        f"{fmt_num(s['speedup'])}x" + (" (total tokens over total time)" if spread else ""),
                    ],
                    [
                        "speedup per prompt",
                        f"median {fmt_num(spread['median'])}x, middle half "
                        f"{fmt_num(spread['q1'])}-{fmt_num(spread['q3'])}x, range "
                        f"{fmt_num(spread['min'])}x ({spread['min_id']}) to {fmt_num(spread['max'])}x "
                        f"({spread['max_id']})"
                        if spread
                        else "not recorded",
                    ],
                    [
                        "speedup over HF generate",
                        f"{fmt_num(s['speedup_vs_hf'])}x" if s.get("speedup_vs_hf") else "HF generate not run",
                    ],
                    ["tau", s["tau"]],
                    [
                        "tau speculating throughout (no plain fallback: the draft's own)",
                        f"{s['throughout']['tau']} ({fmt_num(s['throughout']['speedup'])}x)"
                        if s.get("throughout")
                        else "the run above speculated throughout"
                        if not s.get("plain_fallback")
                        else "not run",
                    ],
                    ["greedy output equal to plain decoding", s.get("greedy_match")],
                    ["prompts / turns / cycles", f"{s['prompts']} / {s['turns']} / {s['cycles']}"],
                ],
                cls="kv",
            )
        )
    return "\n".join(out)


def doctor_section(data: RunData) -> str:
    part = data.doctor
    out = [f'<h2 data-part="doctor">Doctor{badge(part.status)}</h2>']
    report = part.data
    if not report:
        out.append(f'<p class="missing" data-part="doctor-table">{escape(part.status)}: {escape(part.note)}</p>')
        return "\n".join(out)
    verdict = "ok: the engine reads the draft as trained" if report.get("ok") else "FAILED"
    out.append(
        f"<p>{escape(report.get('engine', ''))} export <code>{escape(str(report.get('draft')))}</code>: "
        f"<b>{escape(verdict)}</b></p>"
    )
    out.append(
        table(
            ["check", "status", "message", "hint"],
            [[c["id"], Raw(badge(c["status"])), c["message"], c.get("hint") or ""] for c in report["checks"]],
            cls="doctor",
        )
    )
    probe = report.get("probe") or {}
    if probe:
        out.append(
            f'<p class="note">live probe: tau {dash(probe.get("tau"))} (expected {dash(probe.get("expected_tau"))}'
            f" from {escape(str(probe.get('expected_from')))}), {escape(str(probe.get('method')))}, "
            f"{dash(probe.get('prompts'))} prompts, {escape(str(probe.get('dtype') or 'dtype not recorded'))}"
            f" on {escape(str(probe.get('device') or '?'))}</p>"
        )
    out.append(f'<p class="note">{source_text(part.source)}</p>')
    return "\n".join(out)


def render(data: RunData) -> str:
    """The whole page."""
    name = data.run.resolve().name
    body = [
        f"<h1>eaglekit run report: {escape(name)}</h1>",
        f'<p class="meta">run folder <code>{escape(str(data.run))}</code> · written '
        f"{escape(time.strftime('%Y-%m-%d %H:%M:%S'))} by eaglekit {escape(__version__)} from the files the stages "
        "wrote; nothing here is recomputed</p>",
        stages_section(data),
        training_section(data),
        scaling_section(data),
        acceptance_section(data),
        speed_section(data),
        doctor_section(data),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>eaglekit report: {escape(name)}</title>\n<style>{CSS}</style></head>\n<body><main>\n"
        + "\n".join(body)
        + "\n</main></body></html>\n"
    )


def write_report(run: str | Path, out: str | Path | None = None) -> Path:
    """Write the report of run folder `run` to `out` (default RUN/report.html); returns its path."""
    run = Path(run)
    page = render(collect(run))
    out = Path(out) if out else run / "report.html"
    with atomic_path(out) as tmp:
        tmp.write_text(page, encoding="utf-8")
    return out
