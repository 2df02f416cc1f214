"""Where a greedy speculative cycle's time goes, as numbers (used by `eaglekit bench` when
speculation is slower than plain decoding, and by scripts/gpu/bench_engine.py part s).

The draft's pieces of a cycle are captured alone and replayed on the state a real cycle left (none
of them advances the committed length, so every replay repeats the same work):

    compaction   the accepted path's KV moved into place (trees; a chain is in place)
    catch_up     the draft over the committed rows
    propose      the draft's next chain or tree (the engine's first-proposal step, compiled as the cycle's is)

`verify` (the target forward and greedy acceptance) is the fused cycle graph minus those pieces:
compiling it alone would cost another minute per engine. `host_ms` is what `generate` spends per
cycle beyond the graph: the chunked host reads and the prefill, spread over the cycles.
"""

from __future__ import annotations

import time

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from eaglekit.engine.generate import Engine
from eaglekit.runtime.graphs import Step, compiled


def replay_ms(fn, device: torch.device, repeats: int = 50) -> float:
    """Mean ms of `repeats` back-to-back calls of fn, one sync at the end (after one warm call)."""
    fn()
    _sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    _sync(device)
    return 1000 * (time.perf_counter() - start) / repeats


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def kernels_per_call(fn, device: torch.device, calls: int = 8) -> float | None:
    """Device kernels launched per call of fn (CUDA graphs are traced kernel by kernel); None off CUDA."""
    profiled = kernel_profile(fn, device, calls)
    return None if profiled is None else profiled["kernels"]


def kernel_profile(fn, device: torch.device, calls: int = 8, top: int = 12, cpu_ops: bool = False) -> dict | None:
    """fn's device kernels per call: their count, their summed time (`busy_ms`; against `wall_ms`,
    the rest is launch gaps) and the `top` ones by time. Off CUDA: None, or with `cpu_ops` the same
    for the CPU's ops (self times, so nested ops are not counted twice)."""
    cuda = device.type == "cuda"
    if not cuda and not cpu_ops:
        return None
    fn()
    _sync(device)
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
        _sync(device)
    wall_ms = 1000 * (time.perf_counter() - start) / calls  # profiled: an upper bound

    def self_us(e):
        return e.self_device_time_total if cuda else e.self_cpu_time_total

    events = [e for e in prof.key_averages() if e.device_type == (DeviceType.CUDA if cuda else DeviceType.CPU)]
    timed = sorted((e for e in events if self_us(e) > 0), key=self_us, reverse=True)
    return {
        "kernels": sum(e.count for e in events) / calls,
        "wall_ms": wall_ms,
        "busy_ms": sum(self_us(e) for e in timed) / calls / 1000,
        "top": [
            {"name": e.key[:120], "per_call": e.count / calls, "us_per_call": self_us(e) / calls} for e in timed[:top]
        ],
    }


@torch.no_grad()
def cycle_profile(engine: Engine, prompt_ids: list[int], max_new_tokens: int) -> dict:
    """Time the pieces of one greedy cycle of `engine` (see the module docstring), in ms.

    Returns cycle_graph_ms, cycle_with_host_ms, host_ms, cycle_kernels, cycle_busy_ms and
    cycle_top_kernels (CUDA only) and pieces {name: {ms, kernels}}, verify included (derived), plus
    `largest`: the costliest piece.
    """
    if engine.drafter is None or not engine.sampling.greedy:
        raise ValueError("cycle_profile needs a greedy speculative engine")
    D = engine.spec.max_depth
    gen = engine.generate(prompt_ids, max_new_tokens, plain_fallback=False)  # compiled, captured; cycles only
    with_host_ms = 1000 * gen.seconds / max(len(gen.accept_lengths), 1)
    engine.generate(prompt_ids, 2 * (D + 1), plain_fallback=False)  # a state with the cache in use
    engine.root.copy_(engine.acc[1:2])  # the proposal drafts from the bonus
    rows = torch.arange(D + 1, device=engine.device)
    count, path = engine.acc[0:1], engine.acc[2:]
    pieces = {}
    if engine.spec.mode == "tree":
        pieces["compaction"] = lambda: engine.target.move_kv(engine.n + path, engine.n + rows)
    if engine.drafter.needs_aux:
        pieces["catch_up"] = lambda: engine.drafter.catch_up(engine._emitted(), engine.aux_rows[path], engine.n, count)
    kernels = kernel_profile(engine.cycle, engine.device)
    out = {
        "cycle_graph_ms": replay_ms(engine.cycle, engine.device),
        "cycle_with_host_ms": with_host_ms,
        "cycle_kernels": kernels and kernels["kernels"],
        "pieces": {},
        # the cycle graph's kernels by time: what to fuse next (busy_ms against the graph's ms: launch gaps)
        "cycle_busy_ms": kernels and kernels["busy_ms"],
        "cycle_top_kernels": kernels and kernels["top"],
    }
    pieces["propose"] = engine._propose_root_step  # compiled here as the cycle's graph holds it
    steps = {
        name: Step(compiled(fn, engine.compile), use_graph=engine.graphs, name=name) for name, fn in pieces.items()
    }
    for step in steps.values():
        step.capture()
    for name, step in steps.items():
        out["pieces"][name] = {"ms": replay_ms(step, engine.device), "kernels": kernels_per_call(step, engine.device)}
    draft_ms = sum(p["ms"] for p in out["pieces"].values())
    kernels = [p["kernels"] for p in out["pieces"].values()]
    out["pieces"]["verify"] = {
        "ms": max(out["cycle_graph_ms"] - draft_ms, 0.0),
        "kernels": None if out["cycle_kernels"] is None else out["cycle_kernels"] - sum(kernels),
    }
    out["host_ms"] = with_host_ms - out["cycle_graph_ms"]
    parts = {**{name: p["ms"] for name, p in out["pieces"].items()}, "host": out["host_ms"]}
    out["largest"] = max(parts, key=parts.get)
    return out
