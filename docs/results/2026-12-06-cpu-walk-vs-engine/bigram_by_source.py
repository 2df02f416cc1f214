"""Training's data-only baseline (`train.baselines.baseline_accuracy`: the next answer token a bigram
table of the training answers predicts) on each source's held-out conversations: how predictable each
source's answers are, with no draft at all.

    python bigram_by_source.py TARGET CONVERSATIONS.jsonl
"""

import json
import sys

from eaglekit.features.conversations import read_conversations, tokenize_conversations
from eaglekit.targets.load import load_target
from eaglekit.train.baselines import baseline_accuracy

target = load_target(sys.argv[1], device="cpu")
rows, _ = read_conversations(sys.argv[2])
samples, _ = tokenize_conversations(target.tokenizer, rows, max_length=2048)
source = {r["id"]: r["source"] for r in rows}
train = [(s.input_ids, s.loss_mask) for s in samples if not s.held_out]
val = [s for s in samples if s.held_out]
groups = {"all held out": val} | {name: [s for s in val if source[s.id] == name]
                                  for name in sorted({source[s.id] for s in val})}
for name, group in groups.items():
    print(json.dumps({"set": name, "conversations": len(group),
                      **baseline_accuracy(train, [(s.input_ids, s.loss_mask) for s in group])}))
