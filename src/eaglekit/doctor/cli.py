"""`eaglekit doctor DRAFT [--target T] [--engine E] [--probe [PROMPTS]] [--json [PATH]]`."""

from __future__ import annotations

import argparse
from pathlib import Path

from eaglekit.artifacts import DOCTOR_REPORT, MANIFEST, emit_json, sha256_json, write_json, write_manifest, writer_lock
from eaglekit.doctor.options import GROUPS, DoctorOptions
from eaglekit.errors import EaglekitError
from eaglekit.options import JSON_STDOUT, add_options, options_from_args


def register(sub) -> None:
    doc = sub.add_parser("doctor", help="check a draft folder against a target as an engine would serve it")
    # nargs="?": `doctor --json DRAFT` reads DRAFT as --json's PATH; `run` then says so, not argparse
    doc.add_argument(
        "draft", nargs="?", help="any draft folder: eaglekit, SGLang, EAGLE, ModelOpt or speculators (vLLM)"
    )
    add_options(doc, DoctorOptions, GROUPS)
    doc.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from eaglekit.doctor.run import run_doctor

    if args.draft is None:
        given = f" (`--json {args.json}` took it as the JSON's path)" if args.json not in (None, JSON_STDOUT) else ""
        raise EaglekitError(
            f"doctor needs a draft folder{given}", hint="name the folder first: `eaglekit doctor DRAFT --json [PATH]`"
        )

    options_from_args(DoctorOptions, args)  # the options' own checks (a --limit of 0 and such)
    report = run_doctor(
        args.draft,
        args.target,
        engine=args.engine,
        prompts=args.probe,
        run_probe=args.probe is not None,
        k=args.k,
        max_new_tokens=args.max_new_tokens,
        num_prompts=args.limit,
        diagnose_always=args.diagnose,
        device=args.device,
        dtype=args.dtype,
        allow_unfinished=args.allow_unfinished,
    )
    if args.out:
        write_report(report, args)
    if not emit_json(report.to_dict(), args.json):
        from eaglekit.doctor.report import print_report

        print_report(report)
    return 0 if report.ok else 1


def write_report(report, args: argparse.Namespace) -> None:
    """The doctor as a pipeline stage: report.json plus a manifest naming the draft and target."""
    out = Path(args.out)
    data = report.to_dict()
    failed = [c["id"] for c in data["checks"] if c["status"] == "fail"]
    with writer_lock(out, stage="doctor"):
        (out / MANIFEST).unlink(missing_ok=True)  # an earlier report's manifest must not vouch for this one
        write_json(out / DOCTOR_REPORT, data)
        write_manifest(
            out,
            stage="doctor",
            config={k: v for k, v in vars(args).items() if k != "func"},
            target=None,
            inputs={"draft": str(args.draft), "report": sha256_json(data)},
            counts={"checks": len(data["checks"]), "failed": len(failed)},
            extra={"ok": data["ok"], "failed_checks": failed, "unfinished_draft": data["unfinished_draft"]},
        )
