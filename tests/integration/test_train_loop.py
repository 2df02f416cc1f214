"""`eaglekit train` on a tiny target, the long runs: exact resume after SIGKILL, DDP against one process,
and the walk's accept length against the engine's."""

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eaglekit.targets.load import load_target
from eaglekit.train.loop import train
from train_tiny import (
    ENV,
    config,
    train_args,
    train_data,  # noqa: F401 (fixture `data`)
)

torch.set_num_threads(1)


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    latest = json.loads((out / "trainer_state" / "latest.json").read_text())
    return load_file(str(out / "trainer_state" / latest["dir"] / "draft.safetensors"))


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_resume_after_sigkill_is_bit_identical(data, tmp_path, optimizer):
    steps = 40
    reference = tmp_path / "ref"
    train(config(data, reference, max_steps=steps, optimizer=optimizer))
    out = tmp_path / "killed"
    cmd = [
        sys.executable,
        "-m",
        "eaglekit",
        *train_args(data, out, "--max-steps", str(steps), "--save-every", "4", "--val-every", "6", "--log-every", "2"),
        "--optimizer",
        optimizer,
    ]
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    latest = out / "trainer_state" / "latest.json"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if latest.is_file() and json.loads(latest.read_text())["step"] >= 8:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    killed_at = json.loads(latest.read_text())["step"]
    assert 8 <= killed_at < steps
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "eaglekit",
            *train_args(
                data,
                out,
                "--max-steps",
                str(steps),
                "--save-every",
                "4",
                "--val-every",
                "6",
                "--log-every",
                "2",
                "--resume",
                "--optimizer",
                optimizer,
            ),
        ],
        env=ENV,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    a, b = final_weights(reference), final_weights(out)
    assert set(a) == set(b)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    log = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in log if x["event"] == "train"] == list(range(2, steps + 1, 2))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_ddp_two_processes_equal_one_process_with_accumulation(data, tmp_path, optimizer):
    """Each rank steps its own optimizers on the gradients DDP averaged: Muon needs no sharding here."""
    single = tmp_path / "single"
    train(config(data, single, max_steps=6, grad_accum=2, val_every=6, save_every=6, optimizer=optimizer))
    ddp = tmp_path / "ddp"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        "-m",
        "eaglekit",
        *train_args(data, ddp, "--max-steps", "6", "--val-every", "6", "--save-every", "6", "--log-every", "2"),
        "--optimizer",
        optimizer,
    ]
    run = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    a, b = final_weights(single), final_weights(ddp)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-6, msg=name)
    m = json.loads((ddp / "manifest.json").read_text())
    assert m["world_size"] == 2 and m["config"]["optimizer"] == optimizer
    single_val = json.loads((single / "manifest.json").read_text())["history"][-1]
    assert m["history"][-1]["positions"] == single_val["positions"]  # all validation data seen once


@pytest.mark.slow
def test_walk_accept_length_predicts_the_engine(data, tmp_path):
    """The held-out accept length training reports is what eaglekit's engine then measures."""
    from eaglekit.engine import DraftRunner, Engine, SpecConfig
    from eaglekit.formats.load import load_draft_for
    from eaglekit.runtime import Sampling, make_target_runner
    from eaglekit.targets.chat import prompt_ids
    from tiny_conversations import prompts

    manifest = train(
        config(data, tmp_path / "run", max_steps=80, val_every=80, val_data=data["feat"], val_fraction=0.0)
    )
    val = manifest["history"][-1]
    target = load_target(data["target"])
    draft = load_draft_for(tmp_path / "run", target, "cpu")
    runner = make_target_runner(target.model, max_len=128, aux_layer_ids=[1, 3, 4], runner="auto")

    def engine_tau(k: int) -> float:
        spec, sampling = SpecConfig(mode="chain", k=k), Sampling()
        engine = Engine(
            runner,
            drafter=DraftRunner(draft, spec=spec, sampling=sampling, max_len=128),
            spec=spec,
            sampling=sampling,
            stop_token_ids=[],
            graphs=False,
            compile=False,
        )
        tokens = cycles = 0
        for text in prompts(64, 0):  # the prompts of the greedy samples behind data["feat"]
            gen = engine.generate(prompt_ids(target.tokenizer, [{"role": "user", "content": text}]), 40)
            tokens += sum(a + 1 for a in gen.accept_lengths)
            cycles += len(gen.accept_lengths)
        return tokens / cycles

    measured = engine_tau(3)
    assert measured > 1.1  # the draft is accepted at all
    assert abs(val["walk_accept_length"] - measured) < 0.03, (val, measured)
    assert val["walk_accept_length_by_k"][2] == val["walk_accept_length"]
    # the per-position formula overstates it: cycles start more often where drafts fail
    assert val["sim_accept_length"] > measured + 0.05
    # a served chain shorter than ttt_steps: the walk capped at k predicts it too
    shorter = engine_tau(2)
    assert abs(val["walk_accept_length_by_k"][1] - shorter) < 0.03, (val, shorter)
