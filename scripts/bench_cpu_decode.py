"""What a CPU step costs: the batch decoder's step (generation) and, with a draft, the engine's plain
step against one speculative cycle. Side by side in one process, the product's own classes.

    python scripts/bench_cpu_decode.py --target runs/quick/target --batch-sizes 16,64 --context 140 \
        --draft runs/quick/draft --out docs/results/2026-12-01-cpu-generate

Batch part: every row holds a `--context`-token prompt. The step is timed with attention over all
the cache's slots ("full") and over the slots the rows use ("trimmed", the eager CPU default,
`BatchDecoder.trim`). Draft part: `Engine.decode` against `Engine.cycle` (chain of `--k`), each
replayed on the state a real generation left. Writes OUT/bench_cpu_decode.json and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from eaglekit.data.batch_decoder import BatchDecoder, Request, batch_runner  # noqa: E402
from eaglekit.engine import DraftRunner, Engine, SpecConfig  # noqa: E402
from eaglekit.engine.profile import replay_ms  # noqa: E402
from eaglekit.formats.load import load_draft_for  # noqa: E402
from eaglekit.runtime import Sampling, make_target_runner  # noqa: E402
from eaglekit.targets.chat import prompt_ids  # noqa: E402
from eaglekit.targets.load import load_target  # noqa: E402
from eaglekit.targets.source import DEFAULT_TARGET  # noqa: E402


def batch_step_ms(model, batch: int, context: int, slots: int, trim: bool, steps: int) -> float:
    decoder = BatchDecoder(
        batch_runner(model, max_len=slots, batch_size=batch), sampling=Sampling(), graphs=False, compile=False
    )
    decoder.trim = trim
    decoder.refill(list(range(batch)), [Request(list(range(100, 100 + context)), slots - context)] * batch)
    return replay_ms(decoder.step, decoder.device, steps)


def cycle_vs_step(target, draft_dir: str, k: int, new_tokens: int) -> dict:
    draft = load_draft_for(draft_dir, target, "cpu")
    spec, L = SpecConfig(mode="chain", k=k), 512
    runner = make_target_runner(target.model, max_len=L, aux_layer_ids=list(draft.config.aux_layer_ids))
    engine = Engine(
        runner,
        drafter=DraftRunner(draft, spec=spec, sampling=Sampling(), max_len=L),
        spec=spec,
        stop_token_ids=target.stop_token_ids,
    )
    ids = prompt_ids(target.tokenizer, [{"role": "user", "content": "Write a story about a dragon who paints."}])
    plain = engine.generate(ids, new_tokens, speculative=False)
    spec_gen = engine.generate(ids, new_tokens)
    step, cycle = replay_ms(engine.decode, engine.device, 10), replay_ms(engine.cycle, engine.device, 10)
    return {
        "k": k,
        "plain_tok_s": round(len(plain.tokens) / plain.seconds, 2),
        "spec_tok_s": round(len(spec_gen.tokens) / spec_gen.seconds, 2),
        "tau": round(spec_gen.tau, 3),
        "decode_step_ms": round(step, 1),
        "cycle_ms": round(cycle, 1),
        "proposal_ms": round(replay_ms(engine.proposal, engine.device, 10), 1),
        "cycle_in_plain_steps": round(cycle / step, 2),
    }


@torch.no_grad()
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--batch-sizes", default="16,64")
    p.add_argument("--context", type=int, default=140, help="prompt tokens in every row")
    p.add_argument(
        "--cache-slots",
        "--slots",
        dest="slots",
        type=int,
        default=512,
        help="cache slots a row (the generate stage's first size)",
    )
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--draft", help="a draft folder: its cycle against a plain step")
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--out", default=os.environ.get("OUT", "runs/bench_cpu_decode"))
    args = p.parse_args()
    target = load_target(args.target, device="cpu")
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "argv": sys.argv[1:],
        "batch": [],
    }
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        row = {"batch": batch, "context": args.context, "slots": args.slots}
        for trim in (False, True):
            ms = batch_step_ms(target.model, batch, args.context, args.slots, trim, args.steps)
            row["trimmed_ms" if trim else "full_ms"] = round(ms, 1)
            row["trimmed_tok_s" if trim else "full_tok_s"] = round(1000 * batch / ms, 1)
        result["batch"].append(row)
        print(json.dumps(row), flush=True)
    if args.draft:
        result["speculation"] = cycle_vs_step(target, args.draft, args.k, args.new_tokens)
        print(json.dumps(result["speculation"]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_cpu_decode.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
