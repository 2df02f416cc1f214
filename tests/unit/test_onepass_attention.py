"""The one-pass attention kernel (`runtime.onepass`) computes what the reduce and matmul forms compute,
run on a CPU by Triton's interpreter (`TRITON_INTERPRET=1`, set before triton loads: a subprocess).

Triton is not a dependency of CPU installs. CI installs its wheel into a folder of its own
(`EAGLEKIT_TRITON_PATH`, put on the subprocess's path only) and sets EAGLEKIT_REQUIRE_TRITON=1, so these
tests run there; elsewhere they skip when triton cannot be imported. On a GPU `tests/gpu` runs the
kernel itself inside compiled, captured engines.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
HELPERS = Path(__file__).resolve().parents[1] / "helpers"


def interpreted(code: str) -> str:
    """Run `code` in a Python with Triton's interpreter on; its stdout."""
    extra = [p for p in (os.environ.get("EAGLEKIT_TRITON_PATH"), str(SRC), str(HELPERS)) if p]
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "PYTHONPATH": os.pathsep.join(extra + [os.environ.get("PYTHONPATH", "")]),
    }
    probe = subprocess.run([sys.executable, "-c", "import triton"], env=env, capture_output=True, text=True)
    if probe.returncode != 0:
        if os.environ.get("EAGLEKIT_REQUIRE_TRITON") == "1":
            pytest.fail(f"EAGLEKIT_REQUIRE_TRITON=1 but triton does not import: {probe.stderr[-500:]}")
        pytest.skip("triton is not installed (pip install --no-deps --target DIR triton; EAGLEKIT_TRITON_PATH=DIR)")
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_kernel_equals_the_reduce_form_on_masks_the_engine_builds():
    """Decode (1 token, grouped heads), a chain's verify, a tree's verify with its ancestor mask, two
    sequences; blocks no row sees (skipped), a row that sees one slot, a row that sees none (zeros);
    float32 to reordering, bfloat16 to one rounding of the output."""
    out = interpreted(
        """
        import torch
        from eaglekit.runtime.kv import attend_reduce, cache_mask, causal_block, group_mask
        from eaglekit.runtime.onepass import onepass_attention, onepass_runs

        torch.manual_seed(0)
        cases = 0
        for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2 ** -7)):
            for B, h, g, T, L, d, n in ((1, 3, 3, 1, 200, 64, 130), (1, 3, 3, 6, 200, 64, 70), (2, 2, 2, 5, 96, 32, 9)):
                q = torch.randn(B, h, g * T, d, dtype=dtype)
                k, v = torch.randn(B, h, L, d, dtype=dtype), torch.randn(B, h, L, d, dtype=dtype)
                assert onepass_runs(q)
                block = causal_block(T)
                if T > 2:  # a tree's rows see their ancestors only
                    block[T - 1, 1] = False
                mask = group_mask(cache_mask(block, n, n, L), g).clone()
                if B == 2:
                    mask[..., 0, :] = False  # a row that sees nothing
                    mask[..., 1, :] = False
                    mask[..., 1, L - 1] = True  # one slot, in the last block
                got = onepass_attention(q, k, v, mask)
                want = attend_reduce(q, k, v, mask)
                if B == 2:
                    assert got[:, :, 0].abs().max() == 0
                    got, want = got[:, :, 1:], want[:, :, 1:]
                err = ((got.float() - want.float()).abs() / want.float().abs().clamp_min(1)).max().item()
                assert err <= tol, (dtype, B, h, g, T, L, d, err)
                cases += 1
        print("cases", cases)
        """
    )
    assert "cases 6" in out


def test_an_engine_on_the_onepass_kind_gives_the_reduce_engines_tokens():
    """The kind as the engine uses it: the target runner and the draft runner with attention="onepass"
    (eager, each attention one interpreted kernel) give the same greedy tokens, plain and speculative."""
    out = interpreted(
        """
        import torch
        from eaglekit.engine import Engine
        from eaglekit.engine.draft_runner import DraftRunner
        from eaglekit.engine.spec import SpecConfig
        from eaglekit.runtime import Sampling, make_target_runner
        from engine_tiny import AUX, PROMPTS, peaked_model, random_draft

        torch.set_num_threads(1)
        model = peaked_model("llama")
        spec = SpecConfig(mode="chain", k=3)

        def tokens(kind):
            target = make_target_runner(model, max_len=64, aux_layer_ids=AUX, attention=kind)
            draft = DraftRunner(random_draft(model), spec=spec, sampling=Sampling(), max_len=64, attention=kind)
            engine = Engine(target, drafter=draft, spec=spec)
            return [engine.generate(p, 8, speculative=s).tokens for p in PROMPTS[:2] for s in (False, True)]

        assert tokens("onepass") == tokens("reduce")
        print("equal")
        """
    )
    assert "equal" in out
