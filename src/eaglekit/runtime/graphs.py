"""Fixed-shape steps: compiled with torch.compile and captured into CUDA graphs on GPU.

A step is a function of no arguments that reads and writes only tensors living as long as the
engine (caches, static input/output buffers). On CUDA it is warmed up on a side stream (which also
triggers compilation), captured once into a `torch.cuda.CUDAGraph` and then replayed: one launch
per step, no Python or per-kernel launch cost. Elsewhere (CPU tests) it simply runs.

Warmup and capture execute the step, so they change the engine's state; the engine captures its
steps at construction on dummy inputs, and every generation starts by setting all of its state.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from typing import Callable

import torch
from torch.utils._triton import has_triton

from eaglekit.errors import EaglekitError

log = logging.getLogger(__name__)
COMPILE_MODE = "default"  # the graphs are ours; Inductor fuses (max-autotune took minutes a step: docs/notes/engine.md)
# Inductor skips a fusion that saves under `score_fusion_memory_threshold` bytes of traffic (default 10). At
# batch 1 a step is its launches, and K's and V's cache writes share only the slot index: fused, one launch
# fewer per layer (docs/notes/engine.md, "Launches counted without a GPU").
# torch 2.11's Inductor (the GPU image's) also stores a pointwise result read more than
# `realize_reads_threshold` (4) times, and the query's rope reads 5: stored, it is one more launch a
# layer before the attention's scores; at 5 it fuses into them, as torch 2.13 does by itself.
ENGINE_INDUCTOR_OPTIONS = {"score_fusion_memory_threshold": 1, "realize_reads_threshold": 5}


def compiled(fn: Callable, enabled: bool, mode: str = COMPILE_MODE, dynamic: bool = False) -> Callable:
    """torch.compile(fn) when enabled: static shapes (every step has fixed shapes), or `dynamic`
    (one graph for every size but 0 and 1, which dynamo always specializes)."""
    if not enabled:
        return fn
    import torch._dynamo  # seconds to import: only where something compiles

    # Every engine compiles its own steps; raise the per-function cache so sweeps stay compiled.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, 512)
    import torch._inductor  # a mode is a set of options; torch.compile takes one or the other

    options = {**torch._inductor.list_mode_options(mode, dynamic), **ENGINE_INDUCTOR_OPTIONS}
    return torch.compile(fn, options=options, dynamic=dynamic)


def check_inductor(device: torch.device, what: str) -> None:
    """Refuse `what` (a flag that compiles with inductor) where inductor cannot build kernels."""
    if device.type == "cuda":
        if not has_triton():
            raise EaglekitError(
                f"{what} on GPU needs triton, which this environment lacks",
                hint=f"install triton (it ships with the CUDA wheels of torch), or drop {what}",
            )
    elif device.type == "cpu":
        if not any(shutil.which(c) for c in (os.environ.get("CXX", "g++"), "g++", "clang++")):
            raise EaglekitError(
                f"{what} on CPU needs a C++ compiler (inductor builds its kernels with it)",
                hint=f"install g++, or drop {what}",
            )
    else:
        raise EaglekitError(f"{what} is not supported on {device.type}", hint=f"drop {what}")


class Step:
    """A fixed-shape engine step, replayed from a CUDA graph once captured."""

    def __init__(self, fn: Callable[[], None], *, use_graph: bool, name: str, pool=None):
        """pool: a `torch.cuda.graph_pool_handle()` shared with steps that never run at the same time."""
        self.fn, self.use_graph, self.name, self.pool = fn, use_graph, name, pool
        self.graph: torch.cuda.CUDAGraph | None = None

    def capture(self, warmup: int = 3, quiet: bool = False) -> None:
        if not self.use_graph:
            return
        start = time.perf_counter()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                self.fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                self.fn()
        except RuntimeError as err:
            raise EaglekitError(
                f"capturing the {self.name} step in a CUDA graph failed: {err}",
                hint="the step's code syncs with the host (e.g. MoE routing in the HF code, or an op whose output "
                "size depends on the data); use --no-graphs, or the fast runner if the target is a "
                "Llama-family model",
            ) from err
        torch.cuda.synchronize()
        self.graph = graph
        (log.debug if quiet else log.info)(
            "captured %s in %.1f s (compile included)", self.name, time.perf_counter() - start
        )

    def __call__(self) -> None:
        if not self.use_graph:
            self.fn()
        elif self.graph is None:
            raise EaglekitError(f"step {self.name} was not captured", hint="call Engine.warmup() first")
        else:
            self.graph.replay()
