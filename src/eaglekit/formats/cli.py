"""`eaglekit export` and `eaglekit import`."""

from __future__ import annotations

import argparse

from eaglekit.formats.options import GROUPS, ExportOptions, ImportOptions
from eaglekit.options import add_options


def register(sub) -> None:
    exp = sub.add_parser("export", help="write a draft for SGLang, vLLM or EAGLE (verified on reload)")
    exp.add_argument("checkpoint", help="eaglekit draft checkpoint (or any draft folder eaglekit imports)")
    add_options(exp, ExportOptions, GROUPS)
    exp.set_defaults(func=run_export)

    imp = sub.add_parser("import", help="read a SGLang/EAGLE/ModelOpt/speculators draft into a native checkpoint")
    imp.add_argument("draft", help="the draft folder")
    add_options(imp, ImportOptions, GROUPS)
    imp.set_defaults(func=run_import)


def run_export(args: argparse.Namespace) -> int:
    from eaglekit.formats.export import export_draft

    manifest = export_draft(
        args.checkpoint,
        args.format,
        args.out,
        target=args.target,
        dtype=args.dtype,
        speculative_tokens=args.speculative_tokens,
        overwrite=args.overwrite,
        allow_unfinished=args.allow_unfinished,
    )
    ids = manifest["aux_layer_ids"]
    print(
        f"exported {args.checkpoint} -> {args.out} ({args.format}, {args.dtype}, "
        f"{manifest['counts']['tensors']} tensors; aux layers {ids['eaglekit']} written as {ids['written']}); "
        "reload check passed"
    )
    if manifest["unfinished_draft"]:
        print(f"warning: the draft is unfinished ({manifest['unfinished_draft']}); its export says so")
    return 0


def run_import(args: argparse.Namespace) -> int:
    from eaglekit.formats.importer import import_draft

    ids = list(args.aux_layer_ids) if args.aux_layer_ids else None
    manifest = import_draft(args.draft, args.out, target=args.target, aux_layer_ids=ids, overwrite=args.overwrite)
    cfg = manifest["config"]
    print(
        f"imported {args.draft} ({cfg['format']}) -> {args.out}; aux layers {cfg['aux_layer_ids']} "
        f"(from {cfg['aux_source']}); reload check passed"
    )
    return 0
