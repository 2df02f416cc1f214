"""`eaglekit generate`'s options, declared once (`eaglekit.options`): they make its flags, the
recipe keys of its stage, the local-generation flags `prompts synthesize` shares, and the command
line of a `--devices` worker. No torch here: `--help` stays fast.

The backends' own kinds are named here as literals: `data.batch_decoder.REFILL_KINDS` and
`runtime.kv.ATTENTION_KINDS` import torch (a test checks that these are among them).
"""

from __future__ import annotations

from dataclasses import dataclass

from eaglekit.errors import EaglekitError
from eaglekit.options import option
from eaglekit.targets.options import target_option

BACKENDS = ("local", "engine", "hf", "openai", "vllm")
LOCAL_BACKENDS = ("local", "engine", "hf")
ATTENTIONS = ("auto", "flex", "sdpa", "matmul")
REFILLS = ("eager", "graphs", "compiled")
# Eager forwards of a graphed refill bucket before its capture: a capture costs about what 4 eager
# forwards lose to replays, so a bucket is captured once it has shown it is reused (ski rental; the
# A/B in BENCHMARKS.md, generation throughput).
REFILL_CAPTURE_AFTER = 4
GROUPS = {"main": None, "local": "local generation", "vllm": "vllm backend", "openai": "openai backend"}
WORKER_SKIPS = ("out", "overwrite", "device")  # the parent's own: each worker gets its own
WORKER_SKIP_GROUPS = ("vllm", "openai")  # --devices refuses these backends


@dataclass(frozen=True, kw_only=True)
class GenerateOptions:
    prompts: str = option(help="an `eaglekit prompts` folder, or one prompt file", group="main", required=True)
    target: str = target_option()
    out: str = option(help="output folder (rerun the same command to resume)", group="main", required=True)
    backend: str = option(
        "local",
        "local (= engine): eaglekit's batch decoder (static KV cache, CUDA graphs); hf: HF "
        "generate; openai: a vLLM/SGLang/llama.cpp server (--server-url); vllm: vLLM's offline "
        "engine in this process (--tensor-parallel-size; --batch-size requests at once)",
        group="main",
        choices=BACKENDS,
    )
    max_new_tokens: int = option(1024, "answer length limit per turn", group="main")
    temperature: float = option(0.0, "0 = greedy", group="main")
    top_p: float = option(1.0, "nucleus sampling: the smallest set of tokens with this much probability", group="main")
    top_k: int = option(0, "sampling from the k most likely tokens only (0 = off)", group="main")
    seed: int = option(0, "seed of the sampling", group="main")
    splits: str = option("train,validation", "splits of a prompts folder to answer", group="main")
    limit: int | None = option(None, "only the first N prompts of each split", group="main")
    shard_size: int = option(10000, "conversations per shard", group="main")
    context_length: int | None = option(None, "prompt + answer limit (default: the target's / server's)", group="main")
    overwrite: bool = option(False, "delete the output folder first", group="main")
    # local generation (also `eaglekit prompts synthesize`'s)
    batch_size: int = option(32, "sequences per generation call", group="local")
    device: str = option("auto", "auto, cpu, cuda, cuda:1", group="local")
    dtype: str = option(
        "auto", "auto (bf16 on GPU, fp32 on CPU; the vllm backend too), float32, bfloat16", group="local"
    )
    attention: str = option(
        "auto",
        "the engine's attention kernel (auto: flex on CUDA, each row reads only its own "
        "cache blocks; sdpa where flex does not compile)",
        group="local",
        choices=ATTENTIONS,
    )
    cache_slots: int | None = option(
        None,
        "KV slots per row of the engine's cache (default: what the first prompts "
        "need, grown when a longer one comes, each growth a rebuild; with flex "
        "attention spare slots cost only memory, so a multi-turn run sets its "
        "context length here)",
        group="local",
    )
    refill: str = option(
        "eager",
        "how the engine prefills the prompts of rows that free up: eager forwards "
        "(launch-bound on a GPU), or graphs: one CUDA graph per bucket of rows x prompt "
        "length, captured on first use (fast runner on CUDA only; faster than eager on a "
        "GPU, so the smollm2-h200 recipe uses it), or compiled: each layer under "
        "torch.compile with dynamic shapes, two graphs (fresh and resumed prompts), nothing "
        "padded to a bucket or captured per shape (fast runner; not yet timed on a GPU, where "
        "the whole forward compiled so ran slower than eager). Figures: BENCHMARKS.md, "
        "generation throughput",
        group="local",
        choices=REFILLS,
    )
    refill_padding: float = option(
        0.0,
        "at most this many padded tokens per prompt token in one refill forward "
        "(split by length where more): a long prompt stops padding short ones "
        "to its length; 0 = the default: 2 for an eager CPU refill, no cap "
        "elsewhere (one forward up to the token budget)",
        group="local",
    )
    refill_capture_after: int = option(
        REFILL_CAPTURE_AFTER,
        "graphed refills: run each bucket's first N forwards eagerly and capture its graph at the "
        "next one (a capture costs several eager forwards, and a bucket that a run uses a few times "
        "never pays it back); 0 = capture on first use",
        group="local",
    )
    stop_loops: int = option(
        0,
        "end an answer once its last N tokens repeat a block of at most N/2 tokens (3 times "
        "or more in a row): a small target often loops until --max-new-tokens, and the rest "
        "of a loop is cheap to draft and has little to teach (finish_reason 'loop'; the "
        "engine only; 0 = off: answers run to their end or the limit)",
        group="local",
    )
    # vllm backend
    tensor_parallel_size: int = option(1, "GPUs the target is split over", group="vllm")
    gpu_memory_utilization: float | None = option(
        None, "share of GPU memory vLLM may take (on its CPU build: of RAM for the KV cache)", group="vllm"
    )
    enforce_eager: bool = option(False, "no torch.compile / CUDA graphs (starts faster, decodes slower)", group="vllm")
    # openai backend
    server_url: str | None = option(None, "e.g. http://127.0.0.1:8000", group="openai")
    model: str | None = option(None, "served model name (default: the only one listed)", group="openai")
    concurrency: int = option(32, "conversations in flight", group="openai")
    api_key_env: str = option("OPENAI_API_KEY", "environment variable holding the API key", group="openai")
    timeout: float = option(600.0, "seconds per request", group="openai")
    max_retries: int = option(5, "retries of a failed request", group="openai")
    check_template: bool = option(
        True, "do not compare the server's prompt token counts with the target's template", group="openai"
    )

    def __post_init__(self):
        # What the backends refuse only once the model is loaded; `eaglekit run --plan` checks it here.
        for name in ("max_new_tokens", "batch_size", "shard_size", "concurrency"):
            if getattr(self, name) < 1:
                raise EaglekitError(
                    f"--{name.replace('_', '-')} {getattr(self, name)} must be 1 or more",
                    hint="e.g. --max-new-tokens 256 --batch-size 64",
                )
        if self.limit is not None and self.limit < 1:
            raise EaglekitError(f"--limit {self.limit}: no prompt to answer", hint="pass 1 or more, or leave it out")


@dataclass(frozen=True, kw_only=True)
class PromptsBuildOptions:
    """`eaglekit prompts build` (and the recipe's `prompts` / `validation` sections)."""

    source: list[str] = option(
        help="a prompt source (repeatable)", group="main", required=True, parse=str, flag={"action": "append"}
    )
    out: str = option(help="output folder", group="main", required=True)
    num_prompts: int | None = option(None, "total prompts in the mix (default: weight x size of each)", group="main")
    validation_fraction: float = option(0.02, "held-out share (hash of the prompt)", group="main")
    min_chars: int = option(1, "drop shorter prompts", group="main")
    max_chars: int | None = option(None, "drop longer prompts", group="main")
    max_tokens: int | None = option(
        None, "drop prompts longer than this in target tokens (needs --target)", group="main"
    )
    max_turns: int | None = option(None, "drop prompts with more user turns", group="main")
    target: str | None = option(None, "target whose tokenizer counts --max-tokens", group="main")
    seed: int = option(0, "seed of the split and of subsets", group="main")
    strict: bool = option(False, "a malformed record is an error (default: skip, report)", group="main")
    overwrite: bool = option(False, "replace an existing output folder", group="main")


@dataclass(frozen=True, kw_only=True)
class SynthesizeOptions:
    """`eaglekit prompts synthesize` (Magpie); its local-generation flags are `GenerateOptions`' own."""

    target: str = target_option()
    out: str = option(help="output folder", group="main", required=True)
    num_prompts: int = option(
        help="prompts wanted in total (with --top-up: existing ones included)", group="main", required=True
    )
    top_up: str | None = option(None, "a prompts folder to complete up to --num-prompts", group="main")
    system: str | None = option(
        None, "system prompt to write the questions under (default: the template's)", group="main"
    )
    temperature: float = option(1.0, "sampling temperature of the questions", group="main")
    top_p: float = option(1.0, "nucleus sampling", group="main")
    top_k: int = option(0, "sampling from the k most likely tokens only (0 = off)", group="main")
    max_new_tokens: int = option(256, "longer questions are dropped", group="main")
    min_chars: int = option(10, "shorter questions are dropped", group="main")
    max_attempts: int | None = option(None, "samples drawn at most (default 4 x wanted)", group="main")
    validation_fraction: float = option(
        PromptsBuildOptions.validation_fraction, "held-out share (hash of the prompt)", group="main"
    )
    seed: int = option(0, "seed of the sampling and of the split", group="main")
    overwrite: bool = option(False, "replace an existing output folder", group="main")
