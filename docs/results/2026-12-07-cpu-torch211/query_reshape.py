"""The grouped query's reshape before the verify's bmm, five forms, counted as kernel_counts.py counts
(Triton code written on a CPU, nothing run). From the repo root, in a venv with triton importable:
    python docs/results/2026-12-07-cpu-torch211/query_reshape.py now split bmm3 contig tokfirst
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts" / "gpu"))
import kernel_counts as kc  # noqa: E402

written = kc.triton_codegen_on_cpu()
B, T, nh, h, d, L = 1, 6, 9, 3, 64, 512
g = nh // h
def rot(x):
    return torch.where(torch.arange(d) < d // 2, -x.roll(d // 2, -1), x.roll(d // 2, -1))
def variant(name):
    def fn(qkv, cos, sin, k):
        q = qkv[..., : nh * d].view(B, T, nh, d).transpose(1, 2)
        q = q * cos + rot(q) * sin
        if name == "now":
            q = q.reshape(B, h, g * T, d)
            s = torch.matmul(q, k.transpose(-1, -2))
        elif name == "split":
            q = q.reshape(B, h, g, T, d).reshape(B, h, g * T, d)
            s = torch.matmul(q, k.transpose(-1, -2))
        elif name == "bmm3":
            q = q.reshape(B * h, g * T, d)
            s = torch.bmm(q, k.reshape(B * h, L, d).transpose(1, 2))
        elif name == "contig":
            q = q.contiguous().view(B * h, g * T, d)
            s = torch.bmm(q, k.reshape(B * h, L, d).transpose(1, 2))
        elif name == "tokfirst":  # rows t*g + j: rope in [B, T, h, g, d], one permute
            q = qkv[..., : nh * d].view(B, T, h, g, d)
            q = q * cos.view(B, T, 1, 1, d) + rot(q) * sin.view(B, T, 1, 1, d)
            q = q.permute(0, 2, 1, 3, 4).reshape(B * h, T * g, d)
            s = torch.bmm(q, k.reshape(B * h, L, d).transpose(1, 2))
        return s.float().softmax(-1)
    return fn
args = (torch.randn(B, T, 960, dtype=torch.bfloat16), torch.randn(B, 1, T, d, dtype=torch.bfloat16),
        torch.randn(B, 1, T, d, dtype=torch.bfloat16), torch.randn(B, h, L, d, dtype=torch.bfloat16))
for name in sys.argv[1:]:
    c = kc.launches(variant(name), args, written)
    print(name, sum(c.values()), dict(c))
