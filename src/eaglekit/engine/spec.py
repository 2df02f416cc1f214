"""The shape of one speculation cycle: a chain of k drafts or an EAGLE-2 dynamic tree."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from eaglekit.errors import EaglekitError

MODES = ("chain", "tree")


@dataclass(frozen=True)
class SpecConfig:
    """How much is drafted per cycle.

    chain: `k` drafts, one per draft forward.
    tree:  EAGLE-2 dynamic tree with `depth` levels (the most drafts one cycle can accept; EAGLE's
           code calls depth - 1 its `depth`), `top_k` children per expanded node and frontier
           width, and `total_tokens` nodes verified per cycle, root included (EAGLE's total_token).
    plain_fallback: when the recent cycles commit fewer tokens than a cycle costs in plain steps,
           decode plainly for a while, then probe again (generate.py, "Plain fallback"). Off here,
           so a script's fixed shape measures the cycle alone; `eaglekit speculate` / `bench` turn
           it on (engine/options.py).
    """

    # The defaults of `speculate` / `bench` on CUDA (their flags read them here): EAGLE's papers use
    # top_k 10 and 60 tokens on 7-8B targets; for SmolLM2 a 32-node tree verified for what a chain does.
    mode: str = "tree"
    k: int = 5
    depth: int = 6
    top_k: int = 8
    total_tokens: int = 32
    plain_fallback: bool = False

    def __post_init__(self):
        if self.mode not in MODES:
            raise EaglekitError(f"unknown speculation mode {self.mode!r}", hint=f"use one of {MODES}")
        if min(self.k, self.depth, self.top_k) < 1 or self.total_tokens < 2:
            raise EaglekitError(f"bad speculation shape {self}", hint="k, depth, top_k >= 1 and total_tokens >= 2")

    @property
    def max_depth(self) -> int:
        """The most drafts one cycle can accept."""
        return self.k if self.mode == "chain" else self.depth

    @property
    def num_candidates(self) -> int:
        """Tree: candidates recorded while drafting (K + (depth - 1) K^2)."""
        return self.top_k + (self.depth - 1) * self.top_k**2

    @property
    def num_nodes(self) -> int:
        """Tokens in one verify forward, root included."""
        if self.mode == "chain":
            return self.k + 1
        return min(self.total_tokens, 1 + self.num_candidates)

    @property
    def draft_region(self) -> int:
        """Draft-cache slots used past the committed prefix while drafting."""
        return self.k - 1 if self.mode == "chain" else (self.depth - 1) * self.top_k

    @property
    def headroom(self) -> int:
        """Cache slots a cycle may touch past the committed length (target and draft)."""
        return max(self.num_nodes, self.draft_region) + self.max_depth + 2

    def to_dict(self) -> dict:
        """The shape (the fallback is an engine option, recorded with the options)."""
        if self.mode == "chain":
            return {"mode": "chain", "k": self.k}
        return {k: v for k, v in asdict(self).items() if k not in ("k", "plain_fallback")}

    def label(self) -> str:
        if self.mode == "chain":
            return f"chain k={self.k}"
        return f"tree d={self.depth} topk={self.top_k} n={self.num_nodes}"

    def short(self) -> str:
        """The shape as `parse` reads it: chain:K or tree:DEPTH/TOP_K/TOTAL_TOKENS."""
        return f"chain:{self.k}" if self.mode == "chain" else f"tree:{self.depth}/{self.top_k}/{self.total_tokens}"

    @classmethod
    def parse(cls, text: str) -> SpecConfig:
        """ "chain:5" -> a chain of 5 drafts; "tree:6/4/16" -> a tree of depth 6, top-k 4, 16 nodes."""
        mode, _, numbers = text.strip().partition(":")
        try:
            values = [int(x) for x in numbers.split("/")]
        except ValueError:
            values = []
        if mode == "chain" and len(values) == 1:
            return cls(mode="chain", k=values[0])
        if mode == "tree" and len(values) == 3:
            return cls(mode="tree", depth=values[0], top_k=values[1], total_tokens=values[2])
        raise EaglekitError(
            f"{text!r} is not a speculation shape",
            hint="write chain:K (e.g. chain:5) or tree:DEPTH/TOP_K/TOTAL_TOKENS (e.g. tree:4/4/16)",
        )
