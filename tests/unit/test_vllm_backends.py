"""`--backend vllm` without vLLM: the MoE recipe's plan runs the target only in vLLM, and a missing vLLM is
an error with a hint (the runs in vLLM's venv are in tests/interop/test_vllm_backends.py)."""

from __future__ import annotations

import importlib.util
import io
import json
import re
from contextlib import redirect_stdout

import pytest

from eaglekit.cli import main
from eaglekit.errors import EaglekitError


def test_moe_recipe_plan_runs_the_target_only_in_vllm(tmp_path):
    out = io.StringIO()
    with redirect_stdout(out):
        assert (
            main(
                [
                    "run",
                    "--recipe",
                    "moe-tp8",
                    "target=/models/DeepSeek-V3",
                    "prompts.source=[p.jsonl]",
                    "--plan",
                    "--out",
                    str(tmp_path / "run"),
                ]
            )
            == 0
        )
    lines = out.getvalue().splitlines()
    by_stage = {re.search(r"(?:^|-m )eaglekit (\S+)", line).group(1): line for line in lines}
    assert sorted(by_stage) == ["doctor", "export", "features", "generate", "prompts", "train"]
    assert "target prepare" not in out.getvalue() and "synthesize" not in out.getvalue()
    for stage in ("generate", "features"):
        assert "--backend vllm --tensor-parallel-size 8" in by_stage[stage]
        assert "--target /models/DeepSeek-V3" in by_stage[stage]
    assert "--devices" not in by_stage["generate"]
    assert "torch.distributed.run --standalone --nproc_per_node 8 -m eaglekit train" in by_stage["train"]
    assert f"--features {tmp_path / 'run' / 'features'}" in by_stage["train"]
    exports = [line for line in lines if line.startswith("eaglekit export")]
    assert [x.split("--format ")[1].split()[0] for x in exports] == ["sglang", "vllm"]
    assert "--probe" not in by_stage["doctor"] and f"{tmp_path / 'run' / 'export' / 'vllm'}" in by_stage["doctor"]
    assert not (tmp_path / "run").exists()  # a plan runs and writes nothing


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed in this environment")
def test_missing_vllm_is_an_error_with_a_hint(tiny_target_dir, tmp_path):
    from eaglekit.features.vllm_capture import import_vllm

    with pytest.raises(EaglekitError, match="needs vLLM") as err:
        import_vllm()
    assert "pip install vllm" in err.value.hint
    data = tmp_path / "conv.jsonl"
    data.write_text(
        json.dumps(
            {"id": "x", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
        )
        + "\n"
    )
    assert (
        main(
            [
                "features",
                "--backend",
                "vllm",
                "--target",
                str(tiny_target_dir),
                "--data",
                str(data),
                "--out",
                str(tmp_path / "f"),
            ]
        )
        == 2
    )
    assert not (tmp_path / "f").exists()  # refused before anything is written
