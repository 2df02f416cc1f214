"""`eaglekit generate --devices`: one worker process per device on a tiny target (CPU workers here).
The merged folder equals one process's output, resumes after SIGKILL with nothing lost or repeated,
reports a failed worker and stays resumable, and bad --devices values are refused with a hint."""

from __future__ import annotations

import fcntl
import json
import os

import pytest

from eaglekit.cli import build_parser, main
from eaglekit.data.cli import worker_argv
from eaglekit.data.parallel import check_device_flag, parse_devices
from eaglekit.features.conversations import read_conversations
from eaglekit.pipeline.recipe import to_flags
from eaglekit.targets import load_target
from generate_folders import by_id, generate_argv, make_prompts, read_rows


def test_two_cpu_workers_answer_like_one_process(tmp_path, tiny_target_dir):
    prompts = make_prompts(tmp_path, 12)
    flags = ["--max-new-tokens", "8", "--batch-size", "3", "--shard-size", "4"]
    assert main(generate_argv(prompts, tiny_target_dir, tmp_path / "one", *flags)) == 0
    argv = generate_argv(prompts, tiny_target_dir, tmp_path / "two", *flags, "--devices", "cpu,cpu")
    assert main(argv) == 0
    out = tmp_path / "two"
    rows = read_rows(out)
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)) == 12
    assert by_id(rows) == by_id(read_rows(tmp_path / "one"))  # greedy fp32: the same answers
    # Round-robin within each split: worker i holds prompts i, i + 2, ... of the train and validation files.
    for i in (0, 1):
        want = {
            json.loads(line)["id"]
            for split in ("train", "validation")
            for line in (prompts / f"{split}.jsonl").read_text().splitlines()[i::2]
        }
        assert {r["id"] for r in read_rows(out / "workers" / str(i))} == want
    manifest = json.loads((out / "manifest.json").read_text())
    single = json.loads((tmp_path / "one" / "manifest.json").read_text())
    fingerprint = load_target(tiny_target_dir).fingerprint()
    assert manifest["stage"] == "generate" and manifest["target"] == fingerprint == single["target"]
    assert manifest["inputs"] == single["inputs"] and manifest["config"]["backend"] == "engine"
    assert manifest["config"]["data_parallel"]["devices"] == ["cpu", "cpu"]
    counts = manifest["counts"]
    for key in ("conversations", "by_split", "skipped", "assistant_turns", "answer_tokens", "finish_reason"):
        assert counts[key] == single["counts"][key], key
    assert counts["shards"] == sorted(p.name for p in out.glob("conversations-*.jsonl"))
    assert [(w["worker"], w["devices"]) for w in counts["workers"]] == [(0, ["cpu"]), (1, ["cpu"])]
    assert sum(w["conversations"] for w in counts["workers"]) == 12
    assert sum(w["answer_tokens"] for w in counts["workers"]) == counts["answer_tokens"]
    conversations, _ = read_conversations(out, target_fingerprint=fingerprint)  # what features / train read
    assert len(conversations) == 12
    # A finished folder: the same command does nothing, another number of devices is refused.
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert main(argv) == 0
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert main(argv[:-1] + ["cpu,cpu,cpu"]) == 2


@pytest.mark.parametrize(
    "devices, message",
    [
        ("gpu0", "is not cpu or cuda:N"),
        ("cpu,,cpu", "names an empty device"),
        ("cuda:0,cuda:0", "names a GPU twice"),
        ("cuda", "is not cpu or cuda:N"),
    ],
)
def test_bad_devices_are_refused_with_a_hint(tmp_path, tiny_target_dir, capsys, devices, message):
    argv = generate_argv(tmp_path / "no-prompts", tiny_target_dir, tmp_path / "out", "--devices", devices)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "hint: " in err
    assert not (tmp_path / "out").exists()


def test_devices_refused_beside_other_settings(tmp_path, tiny_target_dir, capsys):
    base = generate_argv(tmp_path / "p", tiny_target_dir, tmp_path / "out")
    cases = [
        (["--devices", "cpu,cpu", "--backend", "openai"], "raise --concurrency"),
        (["--devices", "cpu,cpu", "--device", "cuda"], "drop --device"),
        (["--devices", "cpu,cpu", "--worker", "0/2"], "starts the workers itself"),
        (["--worker", "2/2"], "is not I/N with 0 <= I < N"),
    ]
    if not _has_cuda():
        cases.append((["--devices", "cuda:0"], "this host has 0 CUDA device(s)"))
    for extra, hint in cases:
        assert main(base + extra) == 2, extra
        assert hint in capsys.readouterr().err, extra
    assert not (tmp_path / "out").exists()


def test_every_content_flag_reaches_the_workers_and_recipes_can_set_devices():
    parser = build_parser()
    gen = parser._subparsers._group_actions[0].choices["generate"]
    args = parser.parse_args(
        ["generate", "--prompts", "p", "--out", "o", "--limit", "3", "--context-length", "64", "--cache-slots", "256"]
    )
    passed = set(worker_argv(args))
    reached = {a.dest for a in gen._actions if set(a.option_strings) & passed}
    server = {"server_url", "model", "concurrency", "api_key_env", "timeout", "max_retries", "check_template"}
    vllm = {"tensor_parallel_size", "gpu_memory_utilization", "enforce_eager"}  # --backend vllm refuses --devices
    parent = {"help", "devices", "worker", "device", "out", "overwrite"}
    assert {a.dest for a in gen._actions} - server - vllm - parent == reached
    # A recipe's `generate.devices=cuda:0,cuda:1` (or a YAML list) beside its `device: cuda`.
    for value in ("cuda:0,cuda:1", ["cuda:0", "cuda:1"]):
        args = parser.parse_args(
            ["generate", "--prompts", "p", "--out", "o", *to_flags({"devices": value}), "--device", "cuda"]
        )
        assert sum((d.split(",") for d in args.devices), []) == ["cuda:0", "cuda:1"]
        check_device_flag(args.device, ["cuda:0", "cuda:1"])
    assert parse_devices(["cpu, cpu", "cpu"]) == ["cpu", "cpu", "cpu"]


def test_a_failed_worker_is_named_and_the_folder_resumes(tmp_path, tiny_target_dir, capsys):
    prompts = make_prompts(tmp_path, 6)
    out = tmp_path / "gen"
    argv = generate_argv(prompts, tiny_target_dir, out, "--max-new-tokens", "4", "--devices", "cpu,cpu")
    # Both workers fail (a setting only the worker checks): each is reported, nothing is merged.
    assert main(argv + ["--dtype", "float99"]) == 2
    err = capsys.readouterr().err
    assert "2 of 2 generate workers failed" in err and "worker 1 on cpu exited with status 2" in err
    assert "unknown dtype 'float99'" in err and "rerun the same command" in err
    # Worker 1's folder is held by another writer: worker 0 finishes, worker 1 is reported.
    (out / "workers" / "1").mkdir()
    lock = os.open(out / "workers" / "1", os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert main(argv) == 2
    finally:
        os.close(lock)
    err = capsys.readouterr().err
    assert "1 of 2 generate workers failed" in err and "worker 1 on cpu exited with status 2" in err
    assert "another `eaglekit generate` is writing to" in err
    assert (out / "workers" / "0" / "manifest.json").is_file() and not (out / "manifest.json").exists()
    assert main(argv) == 0  # worker 0 is kept, worker 1 runs
    ids = [r["id"] for r in read_rows(out)]
    assert sorted(ids) == sorted(f"p{i}" for i in range(6))
    workers = json.loads((out / "manifest.json").read_text())["counts"]["workers"]
    assert [len(w["devices"]) for w in workers] == [2, 3]  # launches per worker: the finished one is kept


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def test_generate_options_name_the_engine_kinds():
    """data/options.py names the engine's kinds without importing torch: they must be the engine's."""
    from eaglekit.data.batch_decoder import REFILL_KINDS
    from eaglekit.data.options import ATTENTIONS, REFILLS
    from eaglekit.runtime.kv import ATTENTION_KINDS

    assert REFILLS == REFILL_KINDS and set(ATTENTIONS) - {"auto"} <= set(ATTENTION_KINDS)  # reduce: 1-row steps only
