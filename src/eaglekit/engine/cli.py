"""`eaglekit speculate`: answer one prompt with speculative decoding and print the text and tau,
beside plain decoding of the same prompt. Its options: `eaglekit.engine.options`."""

from __future__ import annotations

import argparse

from eaglekit.engine.options import GROUPS, SpeculateOptions
from eaglekit.options import add_options, options_from_args


def register(sub) -> None:
    p = sub.add_parser("speculate", help="answer one prompt with speculative decoding (prints text, tau, tok/s)")
    p.add_argument("prompt", help="the user message")
    add_options(p, SpeculateOptions, GROUPS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from eaglekit.engine import DraftRunner, Engine, make_target_runner
    from eaglekit.formats.load import load_draft_for, random_draft_for, read_draft_folder
    from eaglekit.targets.chat import prompt_ids
    from eaglekit.targets.load import load_target, resolve_device

    opts = options_from_args(SpeculateOptions, args)
    # Bad options, a wrong path or an unfinished draft fail before the target loads.
    spec, sampling = opts.spec_config(), opts.sampling()
    folder = None if opts.draft == "random" else read_draft_folder(opts.draft, allow_unfinished=opts.allow_unfinished,
                                                                     stand_ins=("random",))
    device = resolve_device(opts.device)
    target = load_target(opts.target, device=device, dtype=opts.dtype)
    if folder is None:
        draft = random_draft_for(target.model, device)
    else:
        draft = load_draft_for(folder, target, device)
    ids = prompt_ids(target.tokenizer, [{"role": "user", "content": args.prompt}])
    max_len = opts.cache_slots or -(-(len(ids) + opts.max_new_tokens + spec.headroom) // 128) * 128
    runner = make_target_runner(target.model, max_len=max_len, aux_layer_ids=list(draft.config.aux_layer_ids),
                                runner=opts.runner)
    engine = Engine(runner, drafter=DraftRunner(draft, spec=spec, sampling=sampling, max_len=max_len), spec=spec,
                    sampling=sampling, stop_token_ids=target.stop_token_ids, graphs=opts.graphs, compile=opts.compile)
    engine.warmup(speculative=True)    # compile and capture apart from the timings (no-op without graphs)
    engine.warmup(speculative=False)
    gen = engine.generate(ids, opts.max_new_tokens, seed=opts.seed)
    print(target.tokenizer.decode(gen.tokens, skip_special_tokens=True))
    print(f"\n[{len(gen.tokens)} tokens, {len(gen.tokens) / gen.seconds:.1f} tok/s, tau {gen.tau:.2f}, "
          f"{spec.label()}, {runner.kind} runner, {gen.finish_reason}]")
    if not opts.no_plain:   # the same prompt decoded plainly, so the gain (or loss) is in plain sight
        plain = engine.generate(ids, opts.max_new_tokens, speculative=False, seed=opts.seed)
        plain_tok_s, spec_tok_s = len(plain.tokens) / plain.seconds, len(gen.tokens) / gen.seconds
        same = "same tokens" if plain.tokens == gen.tokens else "other tokens (sampling, or bf16 near-ties)"
        print(f"[plain decoding: {len(plain.tokens)} tokens, {plain_tok_s:.1f} tok/s; speculation "
              f"{spec_tok_s / plain_tok_s:.2f}x ({same}; one prompt, one run each: `eaglekit bench` measures)]")
    if folder is not None and folder.unfinished:
        print(f"[unfinished draft: {folder.unfinished}]")
    return 0
