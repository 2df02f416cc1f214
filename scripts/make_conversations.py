"""Write a small conversations folder whose answers the target wrote itself (greedy HF generate).

For CPU evidence runs and GPU benchmarks: prompts are synthesized here from templates x topics
(nothing is read from ../shared/data), answers are the target's greedy continuation, and the folder
has the shape the generate stage writes (`conversations-*.jsonl` + manifest with the target
fingerprint), so `eaglekit features` / `eaglekit train` accept it.

    python scripts/make_conversations.py --target /tmp/ek-smollm2 --num 400 --out /tmp/ek-evidence/conv
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import time
from pathlib import Path

import torch

TOPICS = """the moon, volcanoes, honey bees, the French revolution, photosynthesis, black holes, the internet,
coffee, the Roman empire, rainbows, electric cars, penguins, the human heart, chess, the Great Wall of China,
climate change, vaccines, the printing press, deserts, octopuses, jazz music, recycling, earthquakes, the Olympic
games, sleep, tea, airplanes, the ocean tides, dinosaurs, bread baking, the Amazon rainforest, solar panels,
mountains, friendship, the piano, glaciers, the stock market, rivers, ancient Egypt, robots, gardening, the sun,
bicycles, snow, libraries, whales, time zones, the brain, volcanoes on Mars, the number zero, cooking pasta,
the water cycle, magnets, the pyramids, hurricanes, spiders, the telephone, vitamins, origami, lighthouses,
comets, bamboo, the violin, soccer, trains, fossils, the desert fox, memory, maps, paper money, the compass,
wind turbines, caves, mushrooms, the heartbeat of a bird, marathons, kites, pirates, castles, submarines,
rain forests, yoga, the alphabet, batteries, thunder, owls, tomatoes, the metric system, windmills""".replace("\n", " ")
TEMPLATES = [
    "Explain {t} to a ten year old in a few sentences.",
    "Write a short poem about {t}.",
    "Give me three interesting facts about {t}.",
    "What is the most important thing to know about {t}?",
    "Write a short story that involves {t}.",
    "Summarize the history of {t} in one paragraph.",
    "What are the pros and cons of {t}?",
    "Describe {t} using simple words.",
    "Why do people find {t} interesting?",
    "Write a haiku about {t}.",
    "Tell me a fun fact about {t}.",
    "How would you teach a friend about {t}?",
]
MATH = ["What is {a} plus {b}?", "What is {a} times {b}?", "If I have {a} apples and eat {b}, how many are left?",
        "Write a Python function that returns the sum of {a} and {b}."]


def synthesize_prompts(n: int, seed: int = 0) -> list[str]:
    topics = [t.strip() for t in TOPICS.split(",") if t.strip()]
    rng = random.Random(seed)
    pool = [tpl.format(t=t) for tpl, t in itertools.product(TEMPLATES, topics)]
    seen = set(pool)
    target = max(n, len(pool) + 100)   # some arithmetic always; as much as needed beyond the topics
    while len(pool) < target:
        prompt = rng.choice(MATH).format(a=rng.randint(2, 999), b=rng.randint(2, 99))
        if prompt not in seen:
            seen.add(prompt)
            pool.append(prompt)
    rng.shuffle(pool)
    return pool[:n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--num", type=int, default=400)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    generate(args.target, Path(args.out), num=args.num, max_new_tokens=args.max_new_tokens, batch=args.batch,
             device=args.device, seed=args.seed)


@torch.no_grad()
def generate(target_spec: str, out: Path, *, num: int, max_new_tokens: int, batch: int, device: str = "auto",
             seed: int = 0) -> Path:
    """Answer `num` synthesized prompts greedily with the target; write a generate-style folder."""
    from eaglekit.artifacts import write_manifest
    from eaglekit.targets.chat import prompt_ids
    from eaglekit.targets.load import load_target

    device = "cuda" if device == "auto" and torch.cuda.is_available() else ("cpu" if device == "auto" else device)
    target = load_target(target_spec, device=device)
    tok = target.tokenizer
    stops = sorted(set(target.stop_token_ids))
    pad = tok.pad_token_id if tok.pad_token_id is not None else stops[0]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    prompts = synthesize_prompts(num, seed)
    rows, started, new_tokens = [], time.perf_counter(), 0
    for start in range(0, len(prompts), batch):
        chunk = prompts[start:start + batch]
        ids = [prompt_ids(tok, [{"role": "user", "content": p}]) for p in chunk]
        width = max(len(x) for x in ids)
        input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids], device=device)
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids], device=device)
        gen = target.model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                    do_sample=False, pad_token_id=pad, eos_token_id=stops)
        for i, prompt in enumerate(chunk):
            new = gen[i, width:].tolist()
            cut = next((k for k, t in enumerate(new) if t in stops), len(new))
            new_tokens += cut
            answer = tok.decode(new[:cut], skip_special_tokens=True).strip()
            if answer:
                rows.append({"id": f"synth-{start + i:05d}", "source": "synthetic-templates",
                             "messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]})
        print(f"{start + len(chunk)}/{len(prompts)} prompts, {new_tokens / (time.perf_counter() - started):.1f} new tok/s",
              flush=True)
    (out / "conversations-00000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_manifest(out, stage="generate", config={"max_new_tokens": max_new_tokens, "greedy": True,
                                                  "prompts": "synthesized from templates (scripts/make_conversations.py)"},
                   target=target.fingerprint(), counts={"conversations": len(rows), "new_tokens": new_tokens})
    print(f"wrote {len(rows)} conversations to {out}")
    return out


if __name__ == "__main__":
    main()
