"""The uncompiled cycle is safe to capture in a CUDA graph: it builds no tensor from host data.

`x[0] = True` on a device tensor copies a fresh CPU scalar tensor into it (`aten.lift_fresh`, then a
host-to-device copy), which `torch.cuda.graph` refuses ("Cannot copy between CPU and CUDA tensors
during CUDA graph capture"): `eaglekit bench --no-compile` failed that way on an H100. Under
torch.compile such a value is a constant, so only the eager cycle shows it; a dispatch mode finds it
on the CPU.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from eaglekit.engine import DraftRunner, Engine, SpecConfig
from eaglekit.runtime import Sampling, make_target_runner
from engine_tiny import AUX, PROMPTS, peaked_model, random_draft

L = 96


class HostTensors(TorchDispatchMode):
    """Records every op that turns host data into a tensor."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.lift_fresh.default:
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "spec",
    [SpecConfig(mode="chain", k=3), SpecConfig(mode="tree", depth=3, top_k=3, total_tokens=10)],
    ids=["chain", "tree"],
)
def test_the_eager_cycle_builds_no_tensor_from_host_data(spec):
    model = peaked_model("llama")
    target = make_target_runner(model, max_len=L, aux_layer_ids=AUX)
    draft = DraftRunner(random_draft(model), spec=spec, sampling=Sampling(), max_len=L)
    engine = Engine(target, drafter=draft, spec=spec, compile=False)
    cycle, spy, calls = engine.cycle.fn, HostTensors(), []

    def spied():
        calls.append(1)
        with spy:
            cycle()

    engine.cycle.fn = spied
    engine.generate(PROMPTS[0], 16)
    assert calls, "no speculative cycle ran"
    assert spy.seen == []
