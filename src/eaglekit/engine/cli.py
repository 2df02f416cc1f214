"""`eaglekit speculate`: answer one prompt with speculative decoding and print the text and tau.

Also holds the engine options shared with `eaglekit bench`.
"""

from __future__ import annotations

import argparse


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Speculation shape, sampling and runtime options (shared by `speculate` and `bench`); the shape's
    defaults are `SpecConfig`'s."""
    from eaglekit.engine.spec import SpecConfig

    g = p.add_argument_group("speculation")
    g.add_argument("--mode", choices=("chain", "tree"),
                   help="chain of k drafts or EAGLE-2 tree (default: tree on CUDA, chain on a CPU)")
    g.add_argument("--k", type=int, help=f"chain: drafts per cycle (default: {SpecConfig.k} on CUDA, 3 on a CPU)")
    g.add_argument("--depth", type=int, default=SpecConfig.depth, help="tree: levels (most drafts accepted per cycle)")
    g.add_argument("--tree-top-k", type=int, default=SpecConfig.top_k,
                   help="tree: children per expanded node and frontier width")
    g.add_argument("--total-tokens", type=int, default=SpecConfig.total_tokens,
                   help="tree: nodes verified per cycle, root included")
    g = p.add_argument_group("generation")
    g.add_argument("--max-new-tokens", type=int, default=256)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-p", type=float, default=1.0, help="sampling: nucleus")
    g.add_argument("--top-k", type=int, default=0,
                   help="sampling: keep the k most likely tokens (0 = off), as in `eaglekit generate`")
    g = p.add_argument_group("runtime")
    g.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1")
    g.add_argument("--dtype", default="auto", help="auto (bf16 on GPU, fp32 on CPU), float32, bfloat16, float16")
    g.add_argument("--runner", choices=("auto", "fast", "generic"), default="auto",
                   help="target runner: fast (lean Llama-family decoder) or generic (the HF model)")
    g.add_argument("--no-graphs", dest="graphs", action="store_false", default=None, help="no CUDA graphs")
    g.add_argument("--no-compile", dest="compile", action="store_false", default=None, help="no torch.compile")
    g.add_argument("--max-len", type=int, help="KV cache slots (default: from the prompts and max tokens)")


def spec_from(args):
    """The flags' speculation shape; an unset --mode / --k follows the device. On a CPU every verified
    row and draft step is real compute: on a quiet 2-core machine (docs/results/2026-12-01-cpu, SmolLM2
    fp32, random draft) a chain-3 cycle cost 2.44 plain steps and a 16-node tree 3.37, so a CPU drafts
    a short chain.
    On CUDA a cycle is one graph and a 32-node tree verifies for about what a chain does."""
    import torch

    from eaglekit.engine.spec import SpecConfig

    # From the device's name only: the device itself is checked where the target loads.
    cuda = torch.cuda.is_available() if args.device == "auto" else args.device.startswith("cuda")
    mode = args.mode or ("tree" if cuda else "chain")
    k = args.k or (SpecConfig.k if cuda else 3)
    return SpecConfig(mode=mode, k=k, depth=args.depth, top_k=args.tree_top_k, total_tokens=args.total_tokens)


def sampling_from(args):
    from eaglekit.engine.sampling import Sampling
    from eaglekit.errors import EaglekitError

    if args.top_k and args.temperature == 0:   # --top-k was the tree's width here before 2026-12-01
        raise EaglekitError(f"--top-k {args.top_k} is a sampling setting, and decoding is greedy (--temperature 0)",
                            hint=f"for the tree's width pass --tree-top-k {args.top_k}; to sample, set --temperature")
    return Sampling(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)


def register(sub) -> None:
    p = sub.add_parser("speculate", help="answer one prompt with speculative decoding (prints text, tau, tok/s)")
    p.add_argument("prompt", help="the user message")
    p.add_argument("--target", default="smollm2", help="smollm2, an HF model folder or a .gguf file")
    p.add_argument("--draft", required=True, help="a draft folder (eaglekit, SGLang, speculators or EAGLE), or `random`")
    p.add_argument("--allow-unfinished", action="store_true",
                   help="use a draft whose training did not finish (refused otherwise; the output says so)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-plain", action="store_true", help="skip the plain decoding run beside speculation")
    add_engine_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from eaglekit.engine import DraftRunner, Engine, make_target_runner
    from eaglekit.formats.load import load_draft_for, random_draft_for, read_draft_folder
    from eaglekit.targets.chat import prompt_ids
    from eaglekit.targets.load import load_target, resolve_device

    # Bad options, a wrong path or an unfinished draft fail before the target loads.
    spec, sampling = spec_from(args), sampling_from(args)
    folder = None if args.draft == "random" else read_draft_folder(args.draft, allow_unfinished=args.allow_unfinished)
    device = resolve_device(args.device)
    target = load_target(args.target, device=device, dtype=args.dtype)
    if folder is None:
        draft = random_draft_for(target.model, device)
    else:
        draft = load_draft_for(folder, target, device)
    ids = prompt_ids(target.tokenizer, [{"role": "user", "content": args.prompt}])
    max_len = args.max_len or -(-(len(ids) + args.max_new_tokens + spec.headroom) // 128) * 128
    runner = make_target_runner(target.model, max_len=max_len, aux_layer_ids=list(draft.config.aux_layer_ids),
                                runner=args.runner)
    engine = Engine(runner, drafter=DraftRunner(draft, spec=spec, sampling=sampling, max_len=max_len), spec=spec,
                    sampling=sampling, stop_token_ids=target.stop_token_ids, graphs=args.graphs, compile=args.compile)
    engine.warmup(speculative=True)    # compile and capture apart from the timings (no-op without graphs)
    engine.warmup(speculative=False)
    gen = engine.generate(ids, args.max_new_tokens, seed=args.seed)
    print(target.tokenizer.decode(gen.tokens, skip_special_tokens=True))
    print(f"\n[{len(gen.tokens)} tokens, {len(gen.tokens) / gen.seconds:.1f} tok/s, tau {gen.tau:.2f}, "
          f"{spec.label()}, {runner.kind} runner, {gen.finish_reason}]")
    if not args.no_plain:   # the same prompt decoded plainly, so the gain (or loss) is in plain sight
        plain = engine.generate(ids, args.max_new_tokens, speculative=False, seed=args.seed)
        plain_tok_s, spec_tok_s = len(plain.tokens) / plain.seconds, len(gen.tokens) / gen.seconds
        same = "same tokens" if plain.tokens == gen.tokens else "other tokens (sampling, or bf16 near-ties)"
        print(f"[plain decoding: {len(plain.tokens)} tokens, {plain_tok_s:.1f} tok/s; speculation "
              f"{spec_tok_s / plain_tok_s:.2f}x ({same}; one prompt, one run each: `eaglekit bench` measures)]")
    if folder is not None and folder.unfinished:
        print(f"[unfinished draft: {folder.unfinished}]")
    return 0
