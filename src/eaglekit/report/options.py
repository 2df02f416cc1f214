"""`eaglekit report`'s options, declared once (`eaglekit.options`). The run folder is the command's
one positional argument."""

from __future__ import annotations

from dataclasses import dataclass

from eaglekit.options import option

GROUPS = {"main": None}


@dataclass(frozen=True, kw_only=True)
class ReportOptions:
    out: str | None = option(None, "the HTML file to write (default: RUN_DIR/report.html)", group="main")
