"""Write a prompt file synthesized from templates x topics (and some arithmetic), for CPU evidence
runs and benchmarks that must not read ../shared/data. The target answers it through the product:

    python scripts/make_prompts.py --num 400 --out /tmp/ek-evidence/prompts.jsonl
    eaglekit generate --target /tmp/ek-smollm2 --prompts /tmp/ek-evidence/prompts.jsonl --out /tmp/ek-evidence/conv

One JSON object per line, `{"id", "source", "turns": [prompt]}` (a prompt file `eaglekit prompts`
and `eaglekit generate` read).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
from pathlib import Path

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
MATH = [
    "What is {a} plus {b}?",
    "What is {a} times {b}?",
    "If I have {a} apples and eat {b}, how many are left?",
    "Write a Python function that returns the sum of {a} and {b}.",
]


def synthesize_prompts(n: int, seed: int = 0) -> list[str]:
    topics = [t.strip() for t in TOPICS.split(",") if t.strip()]
    rng = random.Random(seed)
    pool = [tpl.format(t=t) for tpl, t in itertools.product(TEMPLATES, topics)]
    seen = set(pool)
    target = max(n, len(pool) + 100)  # some arithmetic always; as much as needed beyond the topics
    while len(pool) < target:
        prompt = rng.choice(MATH).format(a=rng.randint(2, 999), b=rng.randint(2, 99))
        if prompt not in seen:
            seen.add(prompt)
            pool.append(prompt)
    rng.shuffle(pool)
    return pool[:n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="the prompt file to write (.jsonl)")
    args = parser.parse_args()
    rows = [
        {"id": f"synth-{i:05d}", "source": "synthetic-templates", "turns": [prompt]}
        for i, prompt in enumerate(synthesize_prompts(args.num, args.seed))
    ]
    Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} prompts to {args.out}")


if __name__ == "__main__":
    main()
