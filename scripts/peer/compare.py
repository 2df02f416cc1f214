"""Bench drafts side by side in eaglekit's engine, each beside the doctor's live probe; print one table.

    python scripts/peer/compare.py --target T --out DIR LABEL=DRAFT [LABEL=DRAFT ...]

Each draft gets the same `eaglekit bench` command (same prompts, mode, k, tokens) and the same
`eaglekit doctor --probe`; DIR/LABEL/ holds their results.json / report.json, DIR/table.md the table.
Nothing is measured here: the numbers are the two commands' own.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

DEFAULT_BENCH = "--mode chain --k 2 --max-new-tokens 48 --no-hf --device cpu"
# vLLM reads every field both drafts use (SGLang ignores norm_before_residual, which speculators sets)
DEFAULT_PROBE = "--engine vllm --k 2 --max-new-tokens 32 --limit 3 --device cpu"


def run(cmd: list[str], *, check: bool = True) -> int:
    print("+ " + shlex.join(cmd), file=sys.stderr, flush=True)
    return subprocess.run(cmd, check=check).returncode


def fmt_positions(values) -> str:
    return "[" + ", ".join(f"{v:.2f}" for v in values) + "]" if values else "-"


def train_note(draft: Path) -> str:
    """What the draft's own manifest says of its training (steps), where it has one."""
    manifest = draft / "manifest.json"
    if not manifest.is_file():
        return "-"
    m = json.loads(manifest.read_text())
    steps = (m.get("steps") or {}).get("done")
    source = (m.get("config") or {}).get("format")
    return f"{steps} steps" if steps is not None else (f"imported ({source})" if source else m.get("stage", "-"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("drafts", nargs="+", help="LABEL=DRAFT_FOLDER")
    p.add_argument("--target", required=True)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--bench-args", default=DEFAULT_BENCH, help=f"for `eaglekit bench` (default: {DEFAULT_BENCH})")
    p.add_argument(
        "--probe-args", default=DEFAULT_PROBE, help=f"for `eaglekit doctor --probe` (default: {DEFAULT_PROBE})"
    )
    args = p.parse_args(argv)
    rows = []
    for item in args.drafts:
        label, _, draft = item.partition("=")
        if not draft:
            p.error(f"{item!r} is not LABEL=DRAFT")
        out = args.out / label
        out.mkdir(parents=True, exist_ok=True)
        run(
            [
                sys.executable,
                "-m",
                "eaglekit",
                "bench",
                "--target",
                args.target,
                "--draft",
                draft,
                *shlex.split(args.bench_args),
                "--out",
                str(out / "bench"),
                "--overwrite",
                "--allow-unfinished",
            ]
        )
        bench = json.loads((out / "bench" / "results.json").read_text())["summary"]
        run(
            [
                sys.executable,
                "-m",
                "eaglekit",
                "doctor",
                draft,
                "--target",
                args.target,
                "--probe",
                *shlex.split(args.probe_args),
                "--allow-unfinished",
                "--json",
                str(out / "doctor.json"),
            ],
            check=False,
        )  # 1: a check failed
        doctor = json.loads((out / "doctor.json").read_text())
        probe = dict(doctor.get("probe") or {}, ok=doctor.get("ok"))
        rows.append((label, draft, train_note(Path(draft)), bench, probe))
    # the draft's own tau is the run speculating throughout (`summary.throughout`, run beside the
    # fallback's by default); the fallback's tau counts only the cycles it let run
    lines = [
        "| draft | training | bench tau (speculating throughout) | per position | tau with the plain fallback | "
        "speedup | plain / spec tok/s | probe tau | probe per position | doctor |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, draft, note, b, pr in rows:
        own = b.get("throughout") or b  # absent: the bench speculated throughout already (--no-plain-fallback)
        lines.append(
            f"| {label} (`{draft}`) | {note} | **{own['tau']:.2f}** | {fmt_positions(own['per_position_acceptance'])} | "
            f"{b['tau']:.2f}{'' if b.get('plain_fallback') else ' (off)'} | "
            f"{b['speedup']:.2f}x | {b['baseline_tok_s']:.1f} / {b['spec_tok_s']:.1f} | "
            f"{pr.get('tau', float('nan')):.2f} | {fmt_positions(pr.get('per_position'))} | "
            f"{'pass' if pr.get('ok') else 'fail'} |"
        )
    table = "\n".join(lines)
    (args.out / "table.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
