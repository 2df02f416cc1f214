"""The generate stage on several devices of one host: one worker process per device (data parallel).

`eaglekit generate --devices cuda:0,cuda:1 ...` splits the prompts round-robin (prompt k of each
split goes to worker k mod N), starts one `eaglekit generate --worker i/N` process per device, each
a plain resumable generate run into its own folder, and once every worker has finished copies their
shards into the output folder as one generate folder with one manifest:

    OUT/run.json                what the folder is made from (as for one process, plus the worker count)
    OUT/workers/<i>/            worker i's own generate folder (run.json, shards, skipped, manifest)
    OUT/workers/launches.json   the devices each worker ran on, launch by launch
    OUT/conversations-*.jsonl   the workers' shards, renumbered in worker order
    OUT/skipped.jsonl           the workers' skipped prompts (only when there are any)
    OUT/manifest.json           counts of the whole, and of each worker with its devices

Resume: rerun the same command. Finished workers are not started again; the others resume their
own folders. The split depends only on the number of devices, so a rerun may use other devices but
not another number of them (refused). A CUDA worker sees only its GPU (CUDA_VISIBLE_DEVICES), and a
worker dies with its parent (it watches the parent's pid), so a killed parent leaves no writer.
Greedy answers do not depend on the number of workers; sampled ones do (every worker draws from
the same seed).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import torch

from eaglekit.artifacts import (
    CONVERSATION_SHARDS,
    MANIFEST,
    atomic_path,
    read_json,
    read_manifest,
    write_json,
    write_manifest,
)
from eaglekit.data.options import GenerateOptions
from eaglekit.data.regenerate import GenerateConfig, conversation_counts, generate_folder, load_prompts
from eaglekit.errors import EaglekitError

log = logging.getLogger(__name__)
PARENT_PID_ENV = "EAGLEKIT_GENERATE_PARENT_PID"  # set for workers: they exit when this process is gone
DEVICE = re.compile(r"^(cpu|cuda:\d+)$")
DEVICES_HINT = "e.g. --devices cuda:0,cuda:1 (one worker per GPU), or --devices cpu,cpu to try it on CPU"
TAIL_LINES = 20


def parse_devices(values: list[str]) -> list[str]:
    """Device names from `--devices` values (comma lists, the flag repeatable): one worker each.

    Raises:
        EaglekitError: an empty list, a name other than cpu / cuda:N, a GPU named twice, or a GPU
            this host does not have.
    """
    devices = [d.strip() for v in values for d in v.split(",")]
    if not devices or any(not d for d in devices):
        raise EaglekitError(f"--devices {','.join(values)!r} names an empty device", hint=DEVICES_HINT)
    bad = [d for d in devices if not DEVICE.match(d)]
    if bad:
        raise EaglekitError(f"--devices: {bad[0]!r} is not cpu or cuda:N", hint=DEVICES_HINT)
    gpus = [d for d in devices if d != "cpu"]
    if len(set(gpus)) < len(gpus):
        raise EaglekitError(
            f"--devices names a GPU twice: {','.join(devices)}",
            hint="one worker per GPU; raise --batch-size to use a GPU more",
        )
    if gpus:
        available = torch.cuda.device_count() if torch.cuda.is_available() else 0
        missing = [d for d in gpus if int(d.split(":")[1]) >= available]
        if missing:
            raise EaglekitError(
                f"--devices {missing[0]}: this host has {available} CUDA device(s)",
                hint=f"name GPUs from cuda:0 to cuda:{available - 1}" if available else DEVICES_HINT,
            )
    return devices


def parse_worker(value: str) -> tuple[int, int]:
    """`--worker I/N` -> (I, N) with 0 <= I < N."""
    match = re.fullmatch(r"(\d+)/(\d+)", value.strip())
    if not match or not int(match[1]) < int(match[2]):
        raise EaglekitError(
            f"--worker {value!r} is not I/N with 0 <= I < N",
            hint="e.g. --worker 0/2; `--devices` starts the workers for you",
        )
    return int(match[1]), int(match[2])


def check_device_flag(device: str, devices: list[str]) -> None:
    """`--device` beside `--devices` may only repeat their kind (a recipe passes `--device cuda`)."""
    if device != "auto" and any(d.split(":")[0] != device for d in devices):
        raise EaglekitError(
            f"--device {device} disagrees with --devices {','.join(devices)}",
            hint="drop --device: each worker runs on its own device from --devices",
        )


def worker_dir(out: Path, index: int) -> Path:
    return out / "workers" / str(index)


@dataclass
class Worker:
    """One worker process and the last lines it wrote (for the error report)."""

    index: int
    device: str
    proc: subprocess.Popen
    tail: deque = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    reader: threading.Thread | None = None

    def describe(self) -> str:
        code = self.proc.returncode
        how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
        lines = [line for line in self.tail if line.strip()][-8:]
        return f"worker {self.index} on {self.device} {how}; its last lines:\n    " + "\n    ".join(lines)


def generate_parallel(
    prompts: str,
    out: str | Path,
    *,
    devices: list[str],
    worker_argv: list[str],
    target_fp: dict,
    config: GenerateConfig,
    shard_size: int = GenerateOptions.shard_size,
    overwrite: bool = False,
) -> dict:
    """Answer every prompt with one worker process per device; return the merged manifest.

    Args:
        prompts: an `eaglekit prompts` folder, or one prompt file.
        out: the output folder (created, or resumed when it holds an unfinished run of the same config).
        devices: one device per worker (`parse_devices`).
        worker_argv: `eaglekit` arguments of a worker (`eaglekit <worker_argv> --device D --worker I/N
            --out DIR`): the same content settings as `config` and `shard_size`.
        target_fp: the target's fingerprint (each worker's manifest must carry the same).
        config: the settings that decide the content.
        shard_size: conversations per shard (as the workers write them).
        overwrite: delete an existing output folder first.

    Raises:
        EaglekitError: a worker failed (which, how, its last lines); the folder stays resumable.
    """
    out = Path(out)
    _, inputs = load_prompts(prompts, config.splits, config.limit)  # bad prompts fail here, before any worker
    identity = {
        "target": target_fp,
        "config": config.to_json(),
        "inputs": inputs,
        "data_parallel": {"workers": len(devices)},
    }
    with generate_folder(out, identity, overwrite) as finished:
        if finished is not None:
            return finished
        start = time.perf_counter()
        todo = [i for i in range(len(devices)) if not (worker_dir(out, i) / MANIFEST).is_file()]
        if len(todo) < len(devices):
            log.info("workers %s finished earlier", sorted(set(range(len(devices))) - set(todo)))
        run_workers(out, [(i, devices[i]) for i in todo], worker_argv, num_workers=len(devices))
        return merge_workers(out, identity, devices, shard_size, time.perf_counter() - start, launched=todo)


def run_workers(out: Path, jobs: list[tuple[int, str]], worker_argv: list[str], *, num_workers: int) -> None:
    """Start a worker per (index, device), forward their output, wait for all; raise if any failed."""
    if not jobs:
        return
    record_launches(out, jobs)
    workers: list[Worker] = []
    try:
        for index, device in jobs:
            workers.append(start_worker(out, index, device, worker_argv, num_workers))
        for w in workers:
            w.proc.wait()
            w.reader.join()
            if w.proc.returncode != 0:
                log.error("worker %d on %s failed (status %d)", w.index, w.device, w.proc.returncode)
    finally:
        for w in workers:  # the parent stops (an error, Ctrl-C): so do its workers; their folders resume
            if w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait()
    failed = [w for w in workers if w.proc.returncode != 0]
    if failed:
        raise EaglekitError(
            f"{len(failed)} of {len(workers)} generate workers failed:\n  " + "\n  ".join(w.describe() for w in failed),
            hint="fix the cause and rerun the same command: finished workers are kept, "
            "the others resume where they stopped",
        )


def start_worker(out: Path, index: int, device: str, worker_argv: list[str], num_workers: int) -> Worker:
    """`python -m eaglekit <worker_argv> --device D --worker I/N --out OUT/workers/I`, pinned to its device."""
    env = dict(os.environ, **{PARENT_PID_ENV: str(os.getpid())})
    if device == "cpu":
        flag = "cpu"
        if "OMP_NUM_THREADS" not in os.environ:  # N workers on one CPU share its cores
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // num_workers))
    else:
        # The worker sees only its GPU (as cuda:0): CUDA graphs and compile use the current device.
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpu = int(device.split(":")[1])
        env["CUDA_VISIBLE_DEVICES"] = visible.split(",")[gpu].strip() if visible else str(gpu)
        flag = "cuda"
    cmd = [
        sys.executable,
        "-m",
        "eaglekit",
        *worker_argv,
        "--device",
        flag,
        "--worker",
        f"{index}/{num_workers}",
        "--out",
        str(worker_dir(out, index)),
    ]
    log.info("worker %d on %s: %s", index, device, " ".join(cmd[3:]))
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    worker = Worker(index, device, proc)
    worker.reader = threading.Thread(target=forward_output, args=(worker,), daemon=True)
    worker.reader.start()
    return worker


def forward_output(worker: Worker) -> None:
    """Copy a worker's output lines to our stderr, prefixed with the worker, and keep the last ones."""
    for raw in worker.proc.stdout:
        line = raw.decode(errors="replace").rstrip("\n")
        worker.tail.append(line)
        sys.stderr.write(f"[worker {worker.index} {worker.device}] {line}\n")
        sys.stderr.flush()


def record_launches(out: Path, jobs: list[tuple[int, str]]) -> None:
    """Append this launch's device of each worker to OUT/workers/launches.json (for the manifest)."""
    path = out / "workers" / "launches.json"
    launches = read_json(path, what="launch record") if path.is_file() else {}
    for index, device in jobs:
        launches.setdefault(str(index), []).append(device)
    write_json(path, launches)


def merge_workers(
    out: Path, identity: dict, devices: list[str], shard_size: int, seconds: float, *, launched: list[int]
) -> dict:
    """Copy the finished workers' shards into `out` (renumbered, worker order) and write its manifest."""
    manifests = [read_manifest(worker_dir(out, i), stage="generate") for i in range(len(devices))]
    for i, manifest in enumerate(manifests):
        if manifest["target"] != identity["target"]:
            raise EaglekitError(
                f"worker {i} recorded target {manifest['target']}, not {identity['target']}",
                hint="the target changed during the run: pass --overwrite to start over",
            )
    num_shards = 0
    skipped: list[bytes] = []
    for i in range(len(devices)):
        for shard in sorted(worker_dir(out, i).glob(f"{CONVERSATION_SHARDS}-*.jsonl")):
            with atomic_path(out / f"{CONVERSATION_SHARDS}-{num_shards:05d}.jsonl") as tmp:
                shutil.copyfile(shard, tmp)
            num_shards += 1
        if (worker_dir(out, i) / "skipped.jsonl").is_file():
            skipped.append((worker_dir(out, i) / "skipped.jsonl").read_bytes())
    if any(skipped):
        with atomic_path(out / "skipped.jsonl") as tmp:
            tmp.write_bytes(b"".join(skipped))
    counts = conversation_counts(out, shard_size)  # reads every shard: ids unique across workers
    launches = read_json(out / "workers" / "launches.json", what="launch record")
    counts["workers"] = [
        {
            "worker": i,
            "devices": launches.get(str(i), []),
            **{k: m["counts"][k] for k in ("conversations", "skipped", "answer_tokens")},
        }
        for i, m in enumerate(manifests)
    ]
    this_run = [manifests[i]["throughput_last_run"] for i in launched]
    prompts, tokens = sum(t["prompts"] for t in this_run), sum(t["tokens"] for t in this_run)
    speed = {
        "seconds": round(seconds, 3),
        "prompts": prompts,
        "tokens": tokens,
        "prompts_per_s": round(prompts / max(seconds, 1e-9), 3),
        "tokens_per_s": round(tokens / max(seconds, 1e-9), 1),
    }
    config = identity["config"] | {
        "backend": manifests[0]["config"]["backend"],
        "model": None,
        "resumed_from": sum(m["config"]["resumed_from"] for m in manifests),
        "data_parallel": {
            "workers": len(devices),
            "devices": devices,
            "split": "round-robin: prompt k of a split to worker k mod N",
        },
    }
    manifest = write_manifest(
        out,
        stage="generate",
        config=config,
        target=identity["target"],
        inputs=identity["inputs"],
        counts=counts,
        extra={"throughput_last_run": speed},
    )
    log.info(
        "wrote %s: %d conversations from %d workers (%s), %d skipped, %d answer tokens; "
        "this run %.1f prompts/s, %.0f tokens/s",
        out,
        counts["conversations"],
        len(devices),
        ", ".join(f"{w['conversations']} on {'/'.join(w['devices'])}" for w in counts["workers"]),
        counts["skipped"],
        counts["answer_tokens"],
        speed["prompts_per_s"],
        speed["tokens_per_s"],
    )
    return manifest


def exit_with_parent() -> None:
    """In a worker started by `generate_parallel`: die (as by SIGKILL) once the parent is gone.

    A killed parent cannot stop its workers; they would keep writing (and holding their folders'
    locks) while a rerun starts new ones. A thread polls the parent pid; without the variable
    (a worker started by hand) nothing is watched.
    """
    parent = os.environ.get(PARENT_PID_ENV)
    if parent is None:
        return

    def watch() -> None:
        while os.getppid() == int(parent):
            time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)  # what a kill does: the shards are made to survive it

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()
