"""A 4-layer toy: launches when a compiled graph writes views of a KV store, and also the store itself
(PYTHONPATH=/tmp/tritonpkg python docs/results/2026-12-06-cpu-rope-kernels/alias_toy.py)."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "scripts/gpu"))
sys.path.insert(0, str(REPO / "src"))
import kernel_counts as kc  # noqa: E402
import torch  # noqa: E402

written = kc.triton_codegen_on_cpu()
layers, L = 4, 512


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        store = torch.zeros(2, layers, 1, 3, L, 64, dtype=torch.bfloat16)
        self.register_buffer("store", store)
        self.views = [(store[0, i], store[1, i]) for i in range(layers)]

    def forward(self, x, slots, src, dst, move, base_views):
        out = x
        for i in range(layers):
            k, v = (self.store[0, i], self.store[1, i]) if base_views else self.views[i]
            k.index_copy_(2, slots, out)
            v.index_copy_(2, slots, out * 2)
            out = out + k[:, :, :6].float().mean()
        if move == "base":
            self.store[:, :, :, :, dst] = self.store[:, :, :, :, src]
        elif move == "views":
            for k, v in self.views:
                k[:, :, dst] = k[:, :, src]
                v[:, :, dst] = v[:, :, src]
        return out


m = M()
x = torch.randn(1, 3, 6, 64, dtype=torch.bfloat16)
slots = torch.arange(100, 106)
src = torch.arange(100, 103)
dst = torch.arange(90, 93)
for move in (False, "base", "views"):
    for base_views in (False,):
        c = kc.launches(
            lambda *a, move=move, base_views=base_views: m(*a, move=move, base_views=base_views),
            (x, slots, src, dst),
            written,
        )
        print("move", move, "views made in the graph" if base_views else "held views", sum(c.values()), dict(c))
