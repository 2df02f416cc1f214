"""A real server: vLLM's CPU build serves SmolLM2 on 127.0.0.1 and `eaglekit generate --backend
openai` regenerates a few prompts through it (multi-turn, a system prompt, concurrent requests).

The vLLM venv is made by scripts/install_vllm_cpu.sh (${EAGLEKIT_VLLM_VENV:-~/.cache/eaglekit/vllm-venv}).
Run alone: python -m pytest -m vllm tests/interop/test_generate_vllm.py (~2 min on 2 cores: server start
~1 min with --enforce-eager, plus the local reference generation).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from eaglekit.cli import main
from tiny_conversations import CHAT_PROMPTS as PROMPTS

VENV = Path(os.environ.get("EAGLEKIT_VLLM_VENV", Path.home() / ".cache/eaglekit/vllm-venv"))


def vllm_python() -> Path:
    python = VENV / "bin" / "python"
    if not python.is_file() or not (VENV / "bin" / "vllm").is_file():
        pytest.skip(f"no vLLM CPU venv at {VENV}: run scripts/install_vllm_cpu.sh (or set EAGLEKIT_VLLM_VENV)")
    return python


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def vllm_server(smollm2_dir, tmp_path):
    """`vllm serve` (its OpenAI server module: the `vllm` console script of vllm-cpu cannot find
    its own package metadata) on 127.0.0.1; stopped with its whole process group afterwards."""
    python = vllm_python()
    port = free_port()
    log = tmp_path / "vllm.log"
    cmd = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(smollm2_dir),
        "--served-model-name",
        "smollm2",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "1024",
        "--dtype",
        "float32",
        "--enforce-eager",
        "--gpu-memory-utilization",
        "0.3",
    ]
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu")
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 900
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(url + "/v1/models", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                pytest.fail(f"vLLM did not start in 900 s:\n{log.read_text()[-4000:]}")
            time.sleep(2)
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def rows(folder: Path) -> dict[str, dict]:
    found = [json.loads(x) for p in sorted(folder.glob("conversations-*.jsonl")) for x in p.read_text().splitlines()]
    assert len(found) == len({r["id"] for r in found})
    return {r["id"]: r for r in found}


@pytest.mark.vllm
@pytest.mark.slow
def test_regenerate_through_vllm(vllm_server, smollm2_dir, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    common = ["--prompts", str(prompts), "--target", str(smollm2_dir), "--max-new-tokens", "24"]
    # The template check is on: vLLM's prompt token counts must equal our rendering of SmolLM2's template.
    assert (
        main(
            [
                "generate",
                *common,
                "--out",
                str(tmp_path / "vllm"),
                "--backend",
                "openai",
                "--server-url",
                vllm_server,
                "--concurrency",
                "4",
            ]
        )
        == 0
    )
    served = rows(tmp_path / "vllm")
    assert sorted(served) == ["a", "b", "c", "d", "e"]
    manifest = json.loads((tmp_path / "vllm" / "manifest.json").read_text())
    assert manifest["config"]["backend"] == "openai" and manifest["config"]["model"] == "smollm2"
    assert manifest["counts"]["assistant_turns"] == 7 and manifest["target"]["architecture"] == "LlamaForCausalLM"
    assert served["c"]["messages"][0] == {"role": "system", "content": "Answer in one line."}
    for r in served.values():
        assert [m["role"] for m in r["messages"] if m["role"] != "system"] == ["user", "assistant"] * len(
            r["meta"]["turns"]
        )
        assert all(m["content"].strip() for m in r["messages"])
    # Greedy in float32: vLLM's answers are SmolLM2's own, as HF generate writes them here.
    assert main(["generate", *common, "--out", str(tmp_path / "local"), "--backend", "hf", "--batch-size", "1"]) == 0
    local = rows(tmp_path / "local")
    same = [k for k in served if served[k]["messages"] == local[k]["messages"]]
    assert len(same) >= 4, {k: (served[k]["messages"], local[k]["messages"]) for k in served if k not in same}
