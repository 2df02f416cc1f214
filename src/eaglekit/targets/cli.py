"""`eaglekit target info|prepare`."""

from __future__ import annotations

import argparse

from eaglekit.artifacts import emit_json
from eaglekit.options import add_options
from eaglekit.targets.options import GROUPS, TargetInfoOptions, TargetPrepareOptions


def register(sub) -> None:
    target = sub.add_parser("target", help="inspect or prepare a target model")
    tsub = target.add_subparsers(dest="target_command", metavar="ACTION", required=True)

    info = tsub.add_parser("info", help="architecture, sizes, chat template and default aux layer ids")
    add_options(info, TargetInfoOptions, GROUPS)
    info.set_defaults(func=run_info)

    prep = tsub.add_parser("prepare", help="write the target as a plain HF folder (safetensors + tokenizer)")
    add_options(prep, TargetPrepareOptions, GROUPS)
    prep.set_defaults(func=run_prepare)


def run_info(args: argparse.Namespace) -> int:
    from eaglekit.targets.info import target_info

    info = target_info(args.target).to_dict()
    if emit_json(info, args.json):
        return 0
    width = max(len(k) for k in info)
    for key, value in info.items():
        print(f"{key:<{width}}  {value}")
    return 0


def run_prepare(args: argparse.Namespace) -> int:
    from eaglekit.targets.prepare import prepare_target

    manifest = prepare_target(args.target, args.out, dtype=args.dtype, overwrite=args.overwrite)
    print(f"prepared {args.target} -> {args.out} ({manifest['counts']['parameters']:,} parameters)")
    return 0
