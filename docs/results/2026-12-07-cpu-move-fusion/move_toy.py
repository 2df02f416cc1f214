"""A 30-layer toy: launches of the layers' KV moves (cache[dst] = cache[src]) in one compiled graph, by
where the slots come from (PYTHONPATH=/tmp/tritonpkg python docs/results/2026-12-07-cpu-move-fusion/move_toy.py)."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "scripts/gpu"))
sys.path.insert(0, str(REPO / "src"))
import kernel_counts as kc  # noqa: E402
import torch  # noqa: E402

from eaglekit.runtime.kv import move_slots  # noqa: E402

written = kc.triton_codegen_on_cpu()
layers, L, h, d = 30, 512, 3, 64


class Toy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("index", torch.zeros(10, dtype=torch.long))
        for i in range(layers):
            self.register_buffer(f"k{i}", torch.zeros(1, h, L, d, dtype=torch.bfloat16))
            self.register_buffer(f"v{i}", torch.zeros(1, h, L, d, dtype=torch.bfloat16))

    def forward(self, x, slots, n, path, slots_from):
        out = x
        for i in range(layers):  # each layer writes its cache and reads it, as a verify does
            k, v = getattr(self, f"k{i}"), getattr(self, f"v{i}")
            k.index_copy_(2, slots, out * 1.5 + 1)
            v.index_copy_(2, slots, out * 2)
            out = out + k[:, :, :6].float().mean()
        src, dst = n + path, n + torch.arange(5)  # the engine's compaction: the accepted path to n .. n+4
        if slots_from == "inputs":
            src, dst = slots[:5], slots[1:]
        elif slots_from == "buffer":
            self.index.copy_(torch.cat([src, dst]))
            src, dst = self.index[:5], self.index[5:]
        for i in range(layers):
            move_slots(getattr(self, f"k{i}"), src, dst)
            move_slots(getattr(self, f"v{i}"), src, dst)
        return out


x = torch.randn(1, h, 6, d, dtype=torch.bfloat16)
slots, n, path = torch.arange(100, 106), torch.tensor([100]), torch.tensor([0, 3, 4, 4, 4])
toy = Toy()
for slots_from in ("computed", "inputs", "buffer"):
    c = kc.launches(lambda *a, s=slots_from: toy(*a, slots_from=s), (x, slots, n, path), written)
    print(f"slots {slots_from}: {sum(c.values())} launches {dict(c)}")
