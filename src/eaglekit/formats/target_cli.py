"""`eaglekit target info|prepare`.

The command lives here, above targets/, because `target info` reports the default aux layer ids in
every format's convention as well as eaglekit's, and only the formats' registry knows those
conventions (targets/ sits below formats/ and knows eaglekit's convention alone).
"""

from __future__ import annotations

import argparse

from eaglekit.artifacts import emit_json
from eaglekit.formats.registry import FORMATS
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


def with_format_ids(info: dict) -> dict:
    """A target's info with its aux layer ids, after eaglekit's, as each format's config writes them
    (`aux_layer_ids_sglang`, `aux_layer_ids_vllm`; EAGLE's layers are hard-coded, so it writes none)."""
    out = {}
    for key, value in info.items():
        out[key] = value
        if key == "aux_layer_ids":
            out.update({f"aux_layer_ids_{f.name}": f.engine_ids(value) for f in FORMATS.values() if f.aux_field})
    return out


def run_info(args: argparse.Namespace) -> int:
    from eaglekit.targets.info import target_info

    info = with_format_ids(target_info(args.target).to_dict())
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
