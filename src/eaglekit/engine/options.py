"""The engine's options, declared once (`eaglekit.options`): the speculation shape, sampling and
runtime flags that `eaglekit speculate` and `eaglekit bench` share (bench's own options extend them in
`eaglekit.bench.options`). No torch here: `--help` stays fast.

The speculation shape's defaults are `SpecConfig`'s; an unset --mode / --k follows the device
(`spec_config`).
"""

from __future__ import annotations

from dataclasses import dataclass

from eaglekit.engine.spec import MODES, SpecConfig
from eaglekit.errors import EaglekitError
from eaglekit.options import option
from eaglekit.targets.options import target_option

GROUPS = {"main": None, "speculation": "speculation", "generation": "generation", "runtime": "runtime"}
RUNNERS = ("auto", "fast", "generic")
CPU_CHAIN_K = 2  # see spec_config


@dataclass(frozen=True, kw_only=True)
class EngineOptions:
    target: str = target_option()
    seed: int = option(0, "seed of the sampling", group="main")
    mode: str | None = option(
        None,
        "chain of k drafts or EAGLE-2 tree (default: tree on CUDA, chain on a CPU)",
        group="speculation",
        choices=MODES,
    )
    k: int | None = option(
        None, f"chain: drafts per cycle (default: {SpecConfig.k} on CUDA, {CPU_CHAIN_K} on a CPU)", group="speculation"
    )
    depth: int = option(SpecConfig.depth, "tree: levels (most drafts accepted per cycle)", group="speculation")
    tree_top_k: int = option(
        SpecConfig.top_k, "tree: children per expanded node and frontier width", group="speculation"
    )
    total_tokens: int = option(
        SpecConfig.total_tokens, "tree: nodes verified per cycle, root included", group="speculation"
    )
    plain_fallback: bool = option(
        True,
        "speculate throughout: no plain decoding steps when the recent cycles commit "
        "fewer tokens than a cycle costs in plain steps",
        group="speculation",
    )
    max_new_tokens: int = option(256, "answer length limit per turn", group="generation")
    temperature: float = option(0.0, "0 = greedy", group="generation")
    top_p: float = option(1.0, "sampling: nucleus", group="generation")
    top_k: int = option(
        0, "sampling: keep the k most likely tokens (0 = off), as in `eaglekit generate`", group="generation"
    )
    device: str = option("auto", "auto (cuda if available), cpu, cuda, cuda:1", group="runtime")
    dtype: str = option("auto", "auto (bf16 on GPU, fp32 on CPU), float32, bfloat16, float16", group="runtime")
    runner: str = option(
        "auto",
        "target runner: fast (lean Llama-family decoder) or generic (the HF model)",
        group="runtime",
        choices=RUNNERS,
    )
    no_graphs: bool = option(False, "no CUDA graphs", group="runtime")
    no_compile: bool = option(False, "no torch.compile", group="runtime")
    cache_slots: int | None = option(
        None,
        "KV cache slots, as generate's --cache-slots (default: from the prompts and max tokens)",
        group="runtime",
        aliases=("--max-len",),
    )

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise EaglekitError(
                f"--max-new-tokens {self.max_new_tokens}: nothing to generate", hint="ask for at least one token a turn"
            )
        if self.k is not None and self.k < 1:  # 0 once read as unset and ran the device's default chain
            raise EaglekitError(
                f"--k {self.k}: a chain drafts at least one token a cycle",
                hint="pass --k 1 or more, or leave it out for the device's default",
            )

    @property
    def graphs(self) -> bool | None:
        """False when switched off, else None: the engine decides (graphs on CUDA)."""
        return False if self.no_graphs else None

    @property
    def compile(self) -> bool | None:
        return False if self.no_compile else None

    def spec_config(self) -> SpecConfig:
        """The speculation shape; an unset --mode / --k follows the device. On a CPU every verified
        row and draft step is real compute: a tree's cycle costs more plain steps than a short chain's
        (docs/results/2026-12-01-cpu), so a CPU drafts a short chain, and with a trained draft a chain of
        2 ran fastest (BENCHMARKS.md, docs/results/2026-12-04-cpu-chain-length): the BLAS reads the
        weights once for two rows, not for four. On CUDA a cycle is one graph and a 32-node tree
        verifies for about what a chain does."""
        import torch

        # From the device's name only: the device itself is checked where the target loads.
        cuda = torch.cuda.is_available() if self.device == "auto" else self.device.startswith("cuda")
        return SpecConfig(
            mode=self.mode or ("tree" if cuda else "chain"),
            k=self.k if self.k is not None else (SpecConfig.k if cuda else CPU_CHAIN_K),
            depth=self.depth,
            top_k=self.tree_top_k,
            total_tokens=self.total_tokens,
            plain_fallback=self.plain_fallback,
        )

    def sampling(self):
        from eaglekit.runtime.sampling import Sampling

        if self.top_k and self.temperature == 0:  # --top-k once meant the tree's width (now --tree-top-k)
            raise EaglekitError(
                f"--top-k {self.top_k} is a sampling setting, and decoding is greedy (--temperature 0)",
                hint=f"for the tree's width pass --tree-top-k {self.top_k}; to sample, set --temperature",
            )
        return Sampling(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)


def shape_options(spec: SpecConfig) -> dict:
    """The options that give this speculation shape (a script's `SpecConfig` as bench options)."""
    return {
        "mode": spec.mode,
        "k": spec.k,
        "depth": spec.depth,
        "tree_top_k": spec.top_k,
        "total_tokens": spec.total_tokens,
        "plain_fallback": spec.plain_fallback,
    }


@dataclass(frozen=True, kw_only=True)
class SpeculateOptions(EngineOptions):
    draft: str = option(
        help="a draft folder (eaglekit, SGLang, speculators or EAGLE), or `random`", group="main", required=True
    )
    allow_unfinished: bool = option(
        False, "use a draft whose training did not finish (refused otherwise; the output says so)", group="main"
    )
    no_plain: bool = option(False, "skip the plain decoding run beside speculation", group="main")
