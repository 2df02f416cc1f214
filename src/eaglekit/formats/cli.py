"""`eaglekit export` and `eaglekit import`."""

from __future__ import annotations

import argparse

from eaglekit.formats.names import FORMATS


def register(sub) -> None:
    exp = sub.add_parser("export", help="write a draft for SGLang, vLLM or EAGLE (verified on reload)")
    exp.add_argument("checkpoint", help="eaglekit draft checkpoint (or any draft folder eaglekit imports)")
    exp.add_argument("--format", required=True, choices=sorted(FORMATS), help="the serving format")
    exp.add_argument("--out", required=True, help="output folder")
    exp.add_argument("--target", help="the target (checks it is the draft's; named as vLLM's verifier)")
    exp.add_argument("--dtype", default="bfloat16", help="dtype of the exported weights (default bfloat16)")
    exp.add_argument("--speculative-tokens", type=int, default=3, help="draft tokens per step (vLLM config)")
    exp.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    exp.add_argument("--allow-unfinished", action="store_true",
                     help="export a draft whose training did not finish (refused otherwise; the export says so)")
    exp.set_defaults(func=run_export)

    imp = sub.add_parser("import", help="read a SGLang/EAGLE/ModelOpt/speculators draft into a native checkpoint")
    imp.add_argument("draft", help="the draft folder")
    imp.add_argument("--out", required=True, help="native checkpoint folder to write")
    imp.add_argument("--target", help="the target (needed when the config names no aux layers)")
    imp.add_argument("--aux-layer-ids", help="override, eaglekit convention (output of 0-based layer i), e.g. 1,14,25")
    imp.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    imp.set_defaults(func=run_import)


def run_export(args: argparse.Namespace) -> int:
    from eaglekit.formats.export import export_draft

    manifest = export_draft(args.checkpoint, args.format, args.out, target=args.target, dtype=args.dtype,
                            speculative_tokens=args.speculative_tokens, overwrite=args.overwrite,
                            allow_unfinished=args.allow_unfinished)
    ids = manifest["aux_layer_ids"]
    print(f"exported {args.checkpoint} -> {args.out} ({args.format}, {args.dtype}, "
          f"{manifest['counts']['tensors']} tensors; aux layers {ids['eaglekit']} written as {ids['written']}); "
          "reload check passed")
    if manifest["unfinished_draft"]:
        print(f"warning: the draft is unfinished ({manifest['unfinished_draft']}); its export says so")
    return 0


def run_import(args: argparse.Namespace) -> int:
    from eaglekit.formats.importer import import_draft

    ids = [int(i) for i in args.aux_layer_ids.split(",")] if args.aux_layer_ids else None
    manifest = import_draft(args.draft, args.out, target=args.target, aux_layer_ids=ids, overwrite=args.overwrite)
    cfg = manifest["config"]
    print(f"imported {args.draft} ({cfg['format']}) -> {args.out}; aux layers {cfg['aux_layer_ids']} "
          f"(from {cfg['aux_source']}); reload check passed")
    return 0
