"""A draft whose acceptance is known without training: the "repeat" oracle, for doctor and format tests.

Its fc selects the output of the target's last layer (aux slot 3) through a permutation P, attention
and MLP add nothing, and its norm and lm_head are the target's final norm and head with P undone (fc also scales the state
down, which the norm undoes):

    draft logits at position i = target logits at position i (restricted to the draft vocab)

so it proposes the token the target just produced, which the target accepts exactly when it
repeats a token. P makes the draft depend on the right inputs: fed one post-norm final state
instead of the aux states (fc skipped), or another layer, or other names, its proposals break.

In EAGLE-3.1's layout (`fc_norm=True`) each aux state is normalized first, by random positive
weights w spread over decades that fc undoes (fc = P diag(1/w)): an engine that skips those norms
proposes other tokens (tau 1.02 against 1.62 on `save_repeat_target(seed=4, heads=1)`).
The target's final norm has unit weights, so `norm_output` (the next step reads the normed state)
leaves the proposals as they are.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from eaglekit.draft import DraftConfig, Eagle3Draft


def draft_vocab_ids(vocab: int, draft_vocab: int, must: list[int], seed: int = 0) -> torch.Tensor:
    """Sorted target ids of a draft vocab holding `must` plus random others."""
    chosen = set(must)
    g = torch.Generator().manual_seed(seed)
    for i in torch.randperm(vocab, generator=g).tolist():
        if len(chosen) >= draft_vocab:
            break
        chosen.add(i)
    return torch.tensor(sorted(chosen)[:draft_vocab])


@torch.no_grad()
def repeat_draft(
    model, *, draft_vocab: int, must: list[int] = (), seed: int = 0, fc_norm: bool = False, norm_output: bool = False
) -> Eagle3Draft:
    """The repeat oracle for an HF Llama-style target (aux layers 1, N//2-1 and the last, N-1)."""
    cfg = model.config
    N, H = cfg.num_hidden_layers, cfg.hidden_size
    config = DraftConfig.for_target(cfg, aux_layer_ids=[1, N // 2 - 1, N - 1], draft_vocab_size=draft_vocab)
    draft = Eagle3Draft(replace(config, fc_norm=fc_norm, norm_output=norm_output))
    ids = draft_vocab_ids(cfg.vocab_size, draft_vocab, list(must), seed)
    draft.d2t.copy_(ids - torch.arange(draft_vocab))
    draft.t2d.zero_()
    draft.t2d[ids] = True
    perm = torch.randperm(H, generator=torch.Generator().manual_seed(seed + 1))
    P = torch.eye(H)[perm]  # P @ x permutes x
    fc = torch.zeros(H, 3 * H)
    # Scaled down: the final norm undoes the scale, but random attention/MLP weights (a draft whose
    # layer was not loaded) would drown the state, as they drown a trained draft's.
    fc[:, 2 * H :] = P / 1024
    if fc_norm:
        g = torch.Generator().manual_seed(seed + 2)
        for norm in draft.fc_norm:
            norm.weight.copy_(torch.exp(2 * torch.randn(H, generator=g)))  # [H], spread over decades
        fc[:, 2 * H :] /= draft.fc_norm[2].weight  # P diag(1/w): fc undoes the last state's norm weights
    draft.fc.weight.copy_(fc)
    draft.midlayer.self_attn.o_proj.weight.zero_()
    draft.midlayer.mlp.down_proj.weight.zero_()
    draft.norm.weight.copy_(P @ model.model.norm.weight.float())
    draft.lm_head.weight.copy_(model.lm_head.weight.float()[ids] @ P.T)
    return draft


def save_repeat_target(folder, *, seed: int = 1, last_layer_scale: float = 3.0, heads: int = 4):
    """A tiny Llama target whose greedy answers repeat tokens often and whose last layer dominates.

    The larger last layer makes its output unlike the layer before, so a draft fed the wrong aux
    layer proposes other tokens (the doctor's aux-id diagnosis needs that contrast). `heads=1`
    gives head_dim 64, which vLLM's CPU attention supports (16 is refused).
    """
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    from tiny import tiny_config, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    config = tiny_config("llama", vocab_size=len(tokenizer))
    config.num_attention_heads, config.num_key_value_heads = heads, min(heads, config.num_key_value_heads)
    config.head_dim = config.hidden_size // heads
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():  # as tests/helpers/tiny.py: peaked, varied logits
            if p.dim() >= 2:
                p.normal_(0, 0.1)
        last = model.model.layers[-1]
        last.self_attn.o_proj.weight.mul_(last_layer_scale)
        last.mlp.down_proj.weight.mul_(last_layer_scale)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return Path(folder)


def oracle_checkpoint(
    target_dir,
    out,
    *,
    k: int = 3,
    num_prompts: int = 4,
    max_new_tokens: int = 32,
    prompts: list[list[dict]] | None = None,
    draft_vocab: int = 256,
    **layout,
):
    """The repeat oracle for a target, saved as a native checkpoint with the metrics training records.

    Its draft vocab holds every token of the target's greedy answers to the prompts (default: the
    doctor's built-in ones), and its manifest records the acceptance it really reaches there (per-step conditional
    acceptance, as `eaglekit train` writes it under "best"), so the probe has a prediction to meet.
    """
    from eaglekit.artifacts import write_manifest
    from eaglekit.doctor.probe import ProbeSetup, probe, run_target
    from eaglekit.doctor.run import load_prompts
    from eaglekit.draft.checkpoint import save_draft
    from eaglekit.targets.load import load_target

    target = load_target(str(target_dir))
    runs = [
        run_target(target.model, target.tokenizer, m, max_new_tokens=max_new_tokens, stop_ids=target.stop_token_ids)
        for m in (prompts or load_prompts(None, num_prompts))
    ]
    used = sorted({t for run in runs for t in run.tokens.tolist()})
    draft = repeat_draft(target.model, draft_vocab=draft_vocab, must=used, **layout)
    result = probe(
        ProbeSetup("oracle", draft.config, draft.draft_state_dict()),
        runs,
        target.model.get_input_embeddings().weight.detach(),
        k,
    )
    p = [1.0] + result.per_position
    cond = [p[i + 1] / p[i] if p[i] else 0.0 for i in range(k)]
    save_draft(draft, out)
    write_manifest(
        out,
        stage="train",
        config={},
        target=target.fingerprint(),
        extra={"best": {"cond_acc": cond, "sim_accept_length": result.tau}},
    )
    return out


def oracle_exports(target_dir, root) -> dict:
    """The repeat oracle as a native checkpoint (root/native) and as each engine's export (root/<format>)."""
    from pathlib import Path

    from eaglekit.formats import export_draft

    root = Path(root)
    out = {"native": oracle_checkpoint(target_dir, root / "native")}
    for fmt in ("sglang", "vllm"):
        export_draft(out["native"], fmt, root / fmt, target=str(target_dir))
        out[fmt] = root / fmt
    return out
