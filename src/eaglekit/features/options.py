"""`eaglekit features`' options, declared once (`eaglekit.options`): its flags, the recipe keys of the
`features` section and the capture's defaults. No torch here."""

from __future__ import annotations

from dataclasses import dataclass

from eaglekit.options import int_tuple, option
from eaglekit.targets.options import target_option

BACKENDS = ("hf", "vllm")
GROUPS = {"main": None, "vllm": "vllm backend"}


@dataclass(frozen=True, kw_only=True)
class FeaturesOptions:
    target: str = target_option()
    data: str = option(help="conversations folder (eaglekit generate) or a .jsonl file", group="main", required=True)
    out: str = option(help="output folder", group="main", required=True)
    aux_layer_ids: tuple[int, ...] | None = option(
        None, "comma-separated ids, output of 0-based layer i (default [1, N//2-1, N-4])", group="main", parse=int_tuple
    )
    teacher_topk: int = option(32, "teacher entries per token", group="main")
    max_length: int = option(2048, "truncate conversations to this many tokens", group="main")
    shard_tokens: int = option(262144, "tokens per shard file", group="main")
    batch_tokens: int = option(8192, "rows x padded length per target forward", group="main")
    device: str = option("auto", "auto, cpu, cuda, cuda:1", group="main")
    dtype: str = option(
        "auto", "target dtype: auto (bf16 on GPU, fp32 on CPU; the vllm backend too), float32, bfloat16", group="main"
    )
    device_map: str | None = option(
        None, "shard a target too large for one GPU over all GPUs (e.g. auto; transformers/accelerate)", group="main"
    )
    backend: str = option(
        "hf",
        "hf: transformers forward hooks; vllm: the target runs in vLLM (offline "
        "LLM, --tensor-parallel-size GPUs), same shards (docs/vllm-backends.md)",
        group="main",
        choices=BACKENDS,
    )
    tensor_parallel_size: int = option(1, "vllm backend: GPUs the target is split over", group="vllm")
    gpu_memory_utilization: float | None = option(
        None,
        "vllm backend: share of GPU memory vLLM may take (on its CPU build: of RAM for the KV cache)",
        group="vllm",
    )
    overwrite: bool = option(False, "replace features made with other settings", group="main")
    progress: bool = option(True, "no progress bar", group="main")
