"""`eaglekit doctor DRAFT [--target T] [--engine E] [--probe [PROMPTS]] [--json]`."""

from __future__ import annotations

import argparse
import json


def register(sub) -> None:
    doc = sub.add_parser("doctor", help="check a draft folder against a target as an engine would serve it")
    doc.add_argument("draft", help="any draft folder: eaglekit, SGLang, EAGLE, ModelOpt or speculators (vLLM)")
    doc.add_argument("--target", default="smollm2", help="smollm2 (default), an HF model folder or a .gguf file")
    doc.add_argument("--engine", choices=("sglang", "vllm", "eagle"),
                     help="the engine to check for (default: the one the folder's format is made for)")
    doc.add_argument("--probe", nargs="?", const="builtin", metavar="PROMPTS",
                     help="run the live probe on a prompts file (no value: built-in prompts)")
    doc.add_argument("-k", "--k", type=int, default=3, help="draft tokens per step in the probe (default 3; --k as in bench)")
    doc.add_argument("--max-new-tokens", type=int, default=64, help="continuation length per prompt (default 64)")
    doc.add_argument("--num-prompts", type=int, default=6, help="prompts used by the probe (default 6)")
    doc.add_argument("--device", default="auto",
                     help="where the target runs for the probe (default auto: the GPU when there is one)")
    doc.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32", "float16", "bf16", "fp32", "fp16"),
                     help="the dtype the probe runs in: the one you serve in (default bfloat16)")
    doc.add_argument("--diagnose", action="store_true", help="run the diagnosis even when acceptance is fine")
    doc.add_argument("--allow-unfinished", action="store_true",
                     help="check a draft whose training did not finish (refused otherwise; the report says so)")
    doc.add_argument("--json", action="store_true", help="print the report as JSON")
    doc.add_argument("--out", help="also write report.json and manifest.json into this folder")
    doc.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from eaglekit.doctor.run import run_doctor

    report = run_doctor(args.draft, args.target, engine=args.engine, prompts=args.probe,
                        run_probe=args.probe is not None, k=args.k, max_new_tokens=args.max_new_tokens,
                        num_prompts=args.num_prompts, diagnose_always=args.diagnose,
                        device=args.device, dtype=args.dtype, allow_unfinished=args.allow_unfinished)
    if args.out:
        write_report(report, args)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        from eaglekit.doctor.report import print_report

        print_report(report)
    return 0 if report.ok else 1


def write_report(report, args: argparse.Namespace) -> None:
    """The doctor as a pipeline stage: report.json plus a manifest naming the draft and target."""
    from pathlib import Path

    from eaglekit.artifacts import MANIFEST, sha256_json, write_json, write_manifest, writer_lock

    out = Path(args.out)
    data = report.to_dict()
    failed = [c["id"] for c in data["checks"] if c["status"] == "fail"]
    with writer_lock(out, stage="doctor"):
        (out / MANIFEST).unlink(missing_ok=True)  # an earlier report's manifest must not vouch for this one
        write_json(out / "report.json", data)
        write_manifest(out, stage="doctor", config={k: v for k, v in vars(args).items() if k != "func"},
                       target=None, inputs={"draft": str(args.draft), "report": sha256_json(data)},
                       counts={"checks": len(data["checks"]), "failed": len(failed)},
                       extra={"ok": data["ok"], "failed_checks": failed, "unfinished_draft": data["unfinished_draft"]})
