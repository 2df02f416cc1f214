"""Draft runners: propose a chain or a tree each cycle, from a fixed-shape function.

`DraftRunner` runs an EAGLE-3 draft with its own static KV cache (docs/algorithms.md §2, §3):

    catch_up(tokens, aux, start, last)   draft entries for newly committed positions: entry t reads
                                         (token t+1, fc(aux_t)) and is written at cache slot t
    propose(root, n)                     chain (k - 1 steps) or EAGLE-2 tree (depth - 1 expansions)
                                         from the output of the last caught-up entry
    fixed_shape                          a Tree whose parents / depth / anc every proposal repeats
                                         (chains, the oracle), or None where they vary (trees)

`OracleDrafter` replays a known continuation (the target's own greedy output) as a perfect draft,
to measure the engine apart from draft quality. Both return a `Proposal`.

Shapes: T rows, H hidden, Vd draft vocab, K top_k, D depth, N tree nodes, L cache slots.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from eaglekit.draft.model import Eagle3Draft
from eaglekit.engine.spec import SpecConfig
from eaglekit.engine.tree import Tree, chain_tree, select_tree, tree_from_parents
from eaglekit.runtime.kernels import (
    SMALL_ROWS,
    check_small_rows,
    default_kernels,
    kernel_for_rows,
    linear,
    output_projection,
    project_by_heads,
)
from eaglekit.runtime.kv import KVCache, attend, cache_mask, causal_block, group_mask
from eaglekit.runtime.sampling import Sampling, sample, top_k


@dataclass
class Proposal:
    """A drafted tree, and for sampled chains the draft distributions q [k, Vd] it came from."""

    tree: Tree
    q: torch.Tensor | None = None


class DraftRunner(nn.Module):
    """An EAGLE-3 draft behind the drafter interface (catch_up / propose).

    `attention` / `matvec` / `small_rows` / `attention_rows` pick kernels for the draft's few-row
    steps as the fast target runner does (`kernels.default_kernels`; None = what was measured
    fastest there). The draft's q/k/v and gate/up weights are read when the runner is built
    (`Eagle3Draft.fused_weights`): after changing the draft's weights, build a new runner.
    """

    needs_aux = True

    def __init__(
        self,
        draft: Eagle3Draft,
        *,
        spec: SpecConfig,
        sampling: Sampling,
        max_len: int,
        attention: str | None = None,
        matvec: bool | None = None,
        small_rows: int = SMALL_ROWS,
        attention_rows: int | None = None,
    ):
        super().__init__()
        cfg = draft.config
        p = next(draft.parameters())
        self.draft, self.spec, self.sampling, self.max_len = draft, spec, sampling, max_len
        weight_bytes = sum(t.numel() * t.element_size() for t in draft.parameters())
        default_attention, default_matvec = default_kernels(1, weight_bytes)
        self.attention = attention or default_attention
        self.attention_rows = small_rows if attention_rows is None else attention_rows
        self.matvec_rows = check_small_rows(small_rows) if (default_matvec if matvec is None else matvec) else 0
        self.linear = partial(linear, max_rows=self.matvec_rows)
        wqkv, w13 = draft.fused_weights()
        self.register_buffer("wqkv", wqkv, persistent=False)  # [nh*hd + 2*nkv*hd, 2H]
        self.register_buffer("w13", w13, persistent=False)  # [2*I, H]
        self.samples_chain = spec.mode == "chain" and not sampling.greedy  # drafts ~ q, q returned
        self.cache = KVCache(1, cfg.num_key_value_heads, max_len, cfg.head_dim, dtype=p.dtype, device=p.device)
        self.register_buffer(
            "vocab_map", draft.draft_to_target(torch.arange(cfg.draft_vocab_size, device=p.device)), persistent=False
        )  # [Vd] draft id -> target id
        self.register_buffer(
            "last_hidden", torch.zeros(1, cfg.hidden_size, dtype=p.dtype, device=p.device), persistent=False
        )  # [1, H]
        # The tree's fixed bookkeeping, made once: built in every cycle, each piece was a fill kernel.
        if spec.mode == "tree":
            K, D = spec.top_k, spec.depth
            level = torch.cat([torch.zeros(K, dtype=torch.long), torch.arange(1, D).repeat_interleave(K * K)])
            self.register_buffer("cand_depth", (level + 1).to(p.device), persistent=False)  # [C] candidate depth
            self.register_buffer("root_children", torch.full((K,), -1, device=p.device), persistent=False)  # [K]
            self.register_buffer("first_front", torch.arange(K, device=p.device), persistent=False)  # [K]
            self.register_buffer(
                "no_ancestors", torch.zeros(K, spec.draft_region, dtype=torch.bool, device=p.device), persistent=False
            )  # [K, R]

    @property
    def fixed_shape(self) -> Tree | None:
        """A chain's parents, depths and mask never change: the engine writes them once, not each cycle."""
        if self.spec.mode != "chain":
            return None
        return chain_tree(torch.zeros(self.spec.k + 1, dtype=torch.long, device=self.last_hidden.device))

    def step(self, tokens, hidden, positions, slots, mask):
        """One draft forward over T rows: tokens [T], hidden [T, H], positions/slots [T] -> [T, H]."""
        q, k, v, residual = self.draft.attention_pieces(
            tokens[None], hidden[None], positions[None], self.linear, wqkv=self.wqkv
        )
        k_all, v_all = self.cache.write(slots, k, v)
        mask = group_mask(mask, q.shape[1] // k.shape[1])
        kind = kernel_for_rows(self.attention, tokens.shape[0], self.attention_rows)
        # Compiled matvec forms keep gate and up two reductions of one shape: Inductor fuses them with the SwiGLU.
        matvec = torch.compiler.is_compiling() and tokens.shape[0] <= self.matvec_rows
        w13 = None if matvec else self.w13
        by_heads = (
            None
            if matvec or not project_by_heads(tokens.shape[0], q.shape[-1])
            else partial(output_projection, bias=None)
        )
        return self.draft.finish(
            attend(q, k_all, v_all, mask, kind), residual, self.linear, w13=w13, by_heads=by_heads
        )[0]

    def logits(self, hidden):
        """[T, H] draft outputs -> [T, Vd] float32 draft-vocab logits."""
        return self.draft.logits(hidden, self.linear).float()

    def catch_up(self, tokens, aux, start, last):
        """Draft entries for committed positions start .. start+T-1 (rows after `last` are padding).

        Args:
            tokens: [T] the token after each position (the last real one is the new root).
            aux: [T, A] the target's aux states at those positions.
            start: first position (int, or [1] tensor).
            last: index of the last real row ([1] tensor or int).
        """
        T = tokens.shape[0]
        rows = torch.arange(T, device=tokens.device)
        hidden = self.draft.fuse(aux[None], self.linear)[0]
        mask = cache_mask(causal_block(T, tokens.device), start, start, self.max_len)
        out = self.step(tokens, hidden, start + rows, start + rows, mask)
        self.last_hidden.copy_(out.index_select(0, torch.as_tensor(last, device=out.device).view(1)))

    def propose(self, root, n) -> Proposal:
        """Draft from the last caught-up entry. root [1] sits at position n (not yet in any cache)."""
        if self.spec.mode == "chain":
            return self.chain(root, n)
        return Proposal(self.tree(root, n))

    def chain(self, root, n) -> Proposal:
        k, R = self.spec.k, self.spec.draft_region
        hidden = self.last_hidden
        drafts, qs = [], []
        for i in range(k):
            logits = self.logits(hidden)[0]  # [Vd]
            if self.sampling.greedy:
                choice = torch.argmax(logits).view(1)
            else:
                q = (logits / self.sampling.temperature).softmax(-1)
                choice = sample(q).view(1)
                qs.append(q)
            token = self.vocab_map[choice]  # [1] target id
            drafts.append(token)
            if i == k - 1:
                break
            # Draft entry n + i reads the token at position n + i + 1 (drafted) and the last output.
            block = (torch.arange(R, device=root.device) <= i).view(1, R)
            mask = cache_mask(block, n, n, self.max_len)
            where = (n + i) * torch.ones(1, dtype=torch.long, device=root.device)
            hidden = self.step(token, hidden, where, where, mask)
        q = torch.stack(qs) if qs else None
        return Proposal(chain_tree(torch.cat([root.view(1)] + drafts)), q)

    def tree(self, root, n) -> Tree:
        """EAGLE-2 dynamic tree (docs/algorithms.md §3): expand the K best frontier nodes per level."""
        K, D, dev = self.spec.top_k, self.spec.depth, root.device
        value, ids = top_logp(self.logits(self.last_hidden)[0], K)  # [K]
        front_tok, front_val = self.vocab_map[ids], value  # [K]
        front_id = self.first_front  # candidate index
        front_hidden = self.last_hidden.expand(K, -1)  # parent output [K, H]
        front_anc = self.no_ancestors  # visible draft slots [K, R]
        toks, vals = [front_tok], [value]  # every recorded candidate
        parents = [self.root_children]
        recorded = K
        for level in range(1, D):
            base = (level - 1) * K
            front_anc = front_anc.clone()
            front_anc[:, base : base + K] |= torch.eye(K, dtype=torch.bool, device=dev)
            slots = n + base + torch.arange(K, device=dev)
            positions = (n + level - 1) * torch.ones(K, dtype=torch.long, device=dev)
            out = self.step(front_tok, front_hidden, positions, slots, cache_mask(front_anc, n, n, self.max_len))
            child_logp, child_ids = top_logp(self.logits(out), K)  # [K, K]
            cand_val = (front_val.unsqueeze(1) + child_logp).flatten()  # [K*K]
            cand_tok = self.vocab_map[child_ids].flatten()
            toks.append(cand_tok)
            vals.append(cand_val)
            parents.append(front_id.repeat_interleave(K))
            best = torch.topk(cand_val, K).indices  # next frontier, global
            row = best // K
            front_tok, front_val, front_id = cand_tok[best], cand_val[best], recorded + best
            front_hidden, front_anc = out[row], front_anc[row]
            recorded += K * K
        return select_tree(
            root.view(1),
            torch.cat(toks),
            torch.cat(parents),
            torch.cat(vals),
            self.cand_depth,
            self.spec.num_nodes,
            D,
        )


def top_logp(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest log-softmax values of logits [..., Vd] and their ids: top-k of the raw logits less
    their logsumexp, where log_softmax would write and reread all Vd values for k of them."""
    values, ids = top_k(logits, k)
    return values - logits.logsumexp(-1, keepdim=True), ids


class OracleDrafter(nn.Module):
    """A perfect draft for greedy decoding: proposes the known continuation `reference`.

    In tree mode the tree has the full shape (num_nodes) so verification costs what a real tree
    costs: one correct path of `depth` nodes plus wrong siblings, the correct node placed last in
    its level so that compaction moves real data.
    """

    needs_aux = False

    def __init__(self, reference: list[int], *, spec: SpecConfig, vocab_size: int, max_len: int, device):
        super().__init__()
        self.spec, self.vocab_size = spec, vocab_size
        size = max_len + spec.num_nodes + 1
        self.register_buffer(
            "reference", torch.zeros(size, dtype=torch.long, device=device), persistent=False
        )  # [L + N] token by position
        self.set_reference(reference)
        parents, depth, shift = oracle_shape(spec)
        tree = tree_from_parents(torch.zeros(len(parents), dtype=torch.long), torch.tensor(parents), spec.max_depth)
        self.register_buffer("parents", tree.parents.to(device), persistent=False)
        self.register_buffer("depth", torch.tensor(depth, device=device), persistent=False)
        self.register_buffer("shift", torch.tensor(shift, device=device), persistent=False)
        self.register_buffer("anc", tree.anc.to(device), persistent=False)

    @property
    def fixed_shape(self) -> Tree:
        """The oracle's tree is the same every cycle (only its tokens change; these are zeros)."""
        return Tree(tokens=torch.zeros_like(self.shift), parents=self.parents, depth=self.depth, anc=self.anc)

    def set_reference(self, reference: list[int]) -> None:
        """The sequence to replay (prompt + continuation), by position; copied in place (graphs keep it)."""
        ref = torch.zeros(self.reference.shape[0], dtype=torch.long)
        ref[: len(reference)] = torch.tensor(reference[: ref.shape[0]], dtype=torch.long)
        self.reference.copy_(ref)

    def catch_up(self, tokens, aux, start, last):
        pass

    def propose(self, root, n) -> Proposal:
        tokens = (self.reference[n + self.depth] + self.shift) % self.vocab_size
        tokens = torch.cat([root.view(1), tokens[1:]])
        return Proposal(Tree(tokens=tokens, parents=self.parents, depth=self.depth, anc=self.anc))


def oracle_shape(spec: SpecConfig) -> tuple[list[int], list[int], list[int]]:
    """parents, depth and token shift (0 = the reference token) of the oracle's tree, level-major."""
    N, D = spec.num_nodes, spec.max_depth
    path_len = min(D, N - 1)
    extra = [0] * (path_len + 1)
    for i in range(N - 1 - path_len):
        extra[1 + i % path_len] += 1  # siblings round robin
    parents, depth, shift = [-1], [0], [0]
    on_path = 0  # index of the path node
    for d in range(1, path_len + 1):
        for s in range(1, extra[d] + 1):  # wrong siblings first
            parents.append(on_path), depth.append(d), shift.append(s)
        parents.append(on_path), depth.append(d), shift.append(0)
        on_path = len(parents) - 1
    return parents, depth, shift
