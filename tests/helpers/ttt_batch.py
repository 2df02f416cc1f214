"""A tiny seeded draft (`make_draft`) and a random training batch with its teacher (`batch_for`),
shared by the TTT, training-speed and GPU tests."""

import torch

from eaglekit.draft.config import DraftConfig
from eaglekit.draft.model import Eagle3Draft
from eaglekit.draft.vocab import DraftVocab
from eaglekit.features.batch import Batch
from eaglekit.features.teacher import dense_teacher, sparse_teacher, topk_from_logits
from tiny import tiny_config


def make_draft(arch="llama", vocab=120, seed=0):
    cfg = DraftConfig.for_target(tiny_config(arch), aux_layer_ids=[1, 3, 5], draft_vocab_size=vocab)
    torch.manual_seed(seed)
    draft = Eagle3Draft(cfg).eval()
    ids = torch.sort(torch.randperm(cfg.vocab_size)[:vocab]).values
    DraftVocab(draft_ids=ids, vocab_size=cfg.vocab_size).apply_to(draft)
    return draft


def batch_for(draft, T=9, B=2, seed=0, teacher_kind="dense", k=None):
    g = torch.Generator().manual_seed(seed)
    V = draft.config.vocab_size
    ids = torch.randint(3, 300, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[:, :3] = False
    logits = torch.randn(B, T, V, generator=g) * 3
    if teacher_kind == "dense":
        teacher = dense_teacher(logits, draft.t2d.nonzero().squeeze(1))
    else:
        tids, tlogp = topk_from_logits(logits.view(-1, V), k)
        vocab = DraftVocab(draft_ids=draft.t2d.nonzero().squeeze(1), vocab_size=V)
        teacher = sparse_teacher(tids.view(B, T, k), tlogp.view(B, T, k), vocab.target_to_draft)
    aux = torch.randn(B, T, draft.config.fused_width, generator=g)
    return Batch(ids, mask, aux, teacher, torch.full((B,), T)), logits
