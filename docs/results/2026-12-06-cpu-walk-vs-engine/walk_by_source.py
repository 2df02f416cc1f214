"""Training's validation (the walk: greedy chain decoding replayed over the answers) of one draft on
several conversation sets, the target loaded once: the same code as `Trainer.validate`
(`ttt_unroll`, `ttt_loss(walk=True)`, `metrics_from_stats`), one JSON line per set.

    python walk_by_source.py TARGET DRAFT TTT_STEPS NAME=CONVERSATIONS...

CONVERSATIONS: a generate folder or a .jsonl of conversations; `NAME=PATH:validation` takes only
the rows labelled `split: validation`, grouped by their `source` (one line per source, and NAME for
them all).
"""

import json
import sys

import torch

from eaglekit.draft.checkpoint import load_draft
from eaglekit.draft.vocab import DraftVocab
from eaglekit.features.conversations import read_conversations, tokenize_conversations
from eaglekit.targets.info import default_aux_layer_ids
from eaglekit.targets.load import load_target
from eaglekit.train.data import eval_batches
from eaglekit.train.loop import device_positions
from eaglekit.train.sources import OnlineSource
from eaglekit.metrics import STATS, metrics_from_stats
from eaglekit.train.loss import ttt_loss
from eaglekit.train.ttt import ttt_unroll

torch.set_num_threads(1)   # a shared CPU: one thread each (spinning OpenMP threads of several processes starve each other)
target_path, draft_path, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
target = load_target(target_path, device="cpu", dtype="auto")
emb = target.model.get_input_embeddings().weight.detach().float()
draft = load_draft(draft_path, target_embedding=emb).eval()
vocab = DraftVocab.from_d2t(draft.d2t, draft.t2d.numel())
aux = list(draft.config.aux_layer_ids or default_aux_layer_ids(target.config.num_hidden_layers))


@torch.no_grad()
def walk(rows: list[dict]) -> dict:
    samples, _ = tokenize_conversations(target.tokenizer, rows, max_length=2048)
    val = OnlineSource(target.model, samples, aux, vocab)
    stats = torch.zeros(steps, len(STATS), dtype=torch.float64)
    ones = torch.ones(steps, dtype=torch.float64)
    for indices in eval_batches(val.lengths, batch_tokens=4096, max_batch_size=64):
        batch = val.batch(indices, torch.device("cpu"))
        positions = device_positions(batch, steps)
        logits = ttt_unroll(draft, batch.aux, batch.input_ids, steps, "merged", positions)
        stats += ttt_loss(logits, batch, draft.d2t, draft.t2d, weights=[1.0] * steps, denominators=ones,
                          walk=True, positions=positions).stats
    return {"conversations": len(samples), **metrics_from_stats(stats)}


for arg in sys.argv[4:]:
    name, path = arg.split("=", 1)
    only_validation = path.endswith(":validation")
    rows, _ = read_conversations(path.removesuffix(":validation"))
    groups = {name: rows}
    if only_validation:
        rows = [r for r in rows if r.get("split") == "validation"]
        groups = {name: rows} | {f"{name}/{s}": [r for r in rows if r["source"] == s]
                                 for s in sorted({r["source"] for r in rows})}
    for label, group in groups.items():
        print(json.dumps({"set": label, **walk(group)}), flush=True)
