"""Run an eaglekit command on a CPU while Inductor lowers every graph it compiles as a GPU build would.

What `torch.compile` would build with Inductor is lowered, scheduled and written as Triton code
(`cpu_backend="triton"`: the same scheduler and fusion rules a CUDA build uses), forward and backward
graphs alike; nothing of that code runs: each graph then runs eagerly, so the command goes on to
its next graph. Each graph's outcome is printed (`GRAPH n forward|backward ok|FAILED ...`), with a
summary at the end; the exit status is 1 if any graph failed to lower.

Why: Inductor's failures differ between releases, and the GPU machines run torch 2.11 (the engine's
tree build and the one-graph training unroll each failed there and nowhere else). Run it in a venv
of the GPU's torch (kernel_counts.py's docstring says how) before a GPU session:

    python scripts/gpu/compile_check.py train --data CONV --target T --out /tmp/check --compile \\
        --max-steps 3 --batch-tokens 2048 --ttt-steps 7 --device cpu --init-from NATIVE_DRAFT

(`--init-from` a draft of the recipe's shape keeps its 16k draft vocabulary: sizes change how
Inductor splits reductions). Block sizes are a CPU's choice, not a GPU's. The engine compiles its
steps on CUDA only, so `speculate` and `bench` compile nothing here: kernel_counts.py lowers those.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

import torch
import torch._inductor.config as inductor_config
from torch._inductor.compile_fx import compile_fx, compile_fx_inner
from torch._inductor.output_code import MockFXGraphCacheOutput

sys.path.insert(0, str(Path(__file__).resolve().parent))

# kernel_counts.py writes the Triton code and stops there (and puts the repo's src on the path).
from kernel_counts import reached_codegen, triton_codegen_on_cpu  # noqa: E402


def lower_only(results: list[tuple[str, str]]):
    """An `inner_compile` for compile_fx that lowers a graph to Triton code, records the outcome, and
    returns the graph to run eagerly."""

    def inner(gm, example_inputs, **kw):
        what = "backward" if kw.get("is_backward") else "forward"
        try:
            compile_fx_inner(gm, example_inputs, **kw)
            outcome = "FAILED: compiled without reaching codegen"
        except Exception as err:
            if reached_codegen(err):
                outcome = "ok"
            else:
                outcome = f"FAILED: {type(err).__name__}: {str(err)[:300]}"
                traceback.print_exc()
        results.append((what, outcome))
        print("GRAPH", len(results), what, outcome, flush=True)
        return MockFXGraphCacheOutput(gm=lambda inputs: gm(*inputs))

    return inner


def main() -> int:
    triton_codegen_on_cpu()
    inductor_config.fx_graph_cache = False  # lower every graph, not a cached one
    results: list[tuple[str, str]] = []
    inner = lower_only(results)
    backends = {}  # one backend callable per option set: dynamo recompiles for a new callable
    compile_ = torch.compile

    def checking_compile(model=None, *, backend="inductor", options=None, **kw):
        if backend == "inductor":
            key = tuple(sorted((options or {}).items()))
            if key not in backends:
                patches = dict(options or {})
                backends[key] = lambda gm, ex: compile_fx(gm, ex, inner_compile=inner, config_patches=patches)
            backend = backends[key]
        return compile_(model, backend=backend, **kw)

    torch.compile = checking_compile
    from eaglekit.cli import main as eaglekit_main

    try:
        status = eaglekit_main(sys.argv[1:])
    finally:
        failed = [r for r in results if r[1] != "ok"]
        print(
            f"SUMMARY torch {torch.__version__}: {len(results)} graphs, {len(results) - len(failed)} lowered, failed: {failed}"
        )
    if not results:  # a check that lowered nothing proves nothing
        print(
            "no graph was compiled: the command compiles nothing on a CPU (the engine compiles its steps on CUDA only; kernel_counts.py lowers those)"
        )
        return 1
    return 1 if failed else (status or 0)


if __name__ == "__main__":
    sys.exit(main())
