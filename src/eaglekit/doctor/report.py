"""The doctor's text report: one table a person can act on (status, check, finding, fix)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from eaglekit.doctor.run import Report

STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red"}


def print_report(report: Report, console: Console | None = None) -> None:
    console = console or Console()
    console.print(f"[bold]eaglekit doctor[/bold] {escape(report.draft)}  ({escape(report.format)})")
    console.print(f"target {escape(report.target)}, read as [bold]{report.engine}[/bold] reads it")
    table = Table(show_lines=True)
    table.add_column("status", no_wrap=True)
    table.add_column("check", no_wrap=True)
    table.add_column("finding")
    table.add_column("fix")
    for check in report.checks:
        table.add_row(
            f"[{STYLE[check.status]}]{check.status.upper()}[/]", check.id, escape(check.message), escape(check.hint)
        )
    console.print(table)
    probe = report.probe
    if probe and probe.get("dtype"):
        console.print(
            f"probe: {probe['prompts']} prompts, k={probe['k']}, measured in [bold]{probe['dtype']}[/bold] "
            f"on {probe.get('device')}"
        )
    if probe and probe.get("diagnosis"):
        diag = Table(title="diagnosis: re-probed with one misreading corrected at a time")
        for col in ("correction", "tau", "per position", "restores"):
            diag.add_column(col)
        diag.add_row(f"(none: as {report.engine} reads it)", str(probe["tau"]), escape(str(probe["per_position"])), "")
        for tried in probe["diagnosis"]["tried"]:
            diag.add_row(
                escape(tried["label"]),
                escape(str(tried["tau"] if tried["tau"] is not None else tried["error"])),
                escape(str(tried["per_position"])),
                "yes" if tried["restores"] else "",
            )
        diag.add_row("(random weights)", str(probe["diagnosis"]["random_weights_tau"]), "", "")
        console.print(diag)
    for note in report.notes:
        console.print(f"note: {escape(note)}")
    verdict = "[green]OK[/green]" if report.ok else "[bold red]FAILED[/bold red]"
    console.print(
        f"{verdict}: {sum(c.status == 'fail' for c in report.checks)} failed, "
        f"{sum(c.status == 'warn' for c in report.checks)} warnings"
    )
