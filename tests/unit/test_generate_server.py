"""The OpenAI-compatible backend against a real HTTP server on 127.0.0.1 that generates with a tiny
HF model: request building, response parsing, concurrency, retries, the template check, context
refusals and resuming after the server died. (The vLLM test in test_generate_vllm.py is the one
against a production server.)"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from eaglekit.cli import main
from eaglekit.data.openai_backend import OpenAIBackend, OpenAIClient
from eaglekit.data.regenerate import GenerateConfig, generate_conversations
from eaglekit.errors import EaglekitError
from eaglekit.runtime.sampling import Sampling
from eaglekit.targets import load_target
from engine_tiny import one_thread  # noqa: F401 (fixture)

MAX_MODEL_LEN = 256


class TinyServer:
    """/v1/models and /v1/chat/completions, answered by greedy HF generate with the tiny target.

    `faults` is a list of what the next requests get instead of an answer: an HTTP status to send,
    or "drop" to close the connection without a reply. `usage=False` leaves out the `usage` field
    (some servers do).
    """

    def __init__(self, target, *, chat_template: str | None = None, name: str = "tiny", usage: bool = True):
        self.target, self.name, self.requests, self.faults = target, name, [], []
        self.chat_template, self.usage = chat_template, usage
        self.dead = False
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def reply(self, status: int, obj: dict) -> None:
                body = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/v1/models":
                    self.reply(200, {"object": "list", "data": [{"id": server.name, "max_model_len": MAX_MODEL_LEN}]})
                else:
                    self.reply(404, {"error": {"message": "not found"}})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.requests.append(body)
                    fault = server.faults.pop(0) if server.faults else (503 if server.dead else None)
                if fault == "drop":
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if fault is not None:
                    self.reply(fault, {"error": {"message": f"injected {fault}"}})
                    return
                if body.get("model") != server.name:
                    self.reply(404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}})
                    return
                status, obj = server.complete(body)
                self.reply(status, obj)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def complete(self, body: dict) -> tuple[int, dict]:
        tok = self.target.tokenizer
        kwargs = {"chat_template": self.chat_template} if self.chat_template else {}
        text = tok.apply_chat_template(body["messages"], tokenize=False, add_generation_prompt=True, **kwargs)
        ids = tok.encode(text, add_special_tokens=False)
        if len(ids) + body["max_tokens"] > MAX_MODEL_LEN:
            return 400, {
                "error": {
                    "message": f"This model's maximum context length is {MAX_MODEL_LEN} tokens. "
                    f"However, you requested {len(ids) + body['max_tokens']} tokens."
                }
            }
        with self.lock, torch.no_grad():  # one generation at a time (the model is shared)
            out = self.target.model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=body["max_tokens"],
                do_sample=False,
                eos_token_id=self.target.stop_token_ids,
                pad_token_id=self.target.stop_token_ids[0],
            )[0, len(ids) :].tolist()
        stopped = bool(out) and out[-1] in self.target.stop_token_ids
        content = tok.decode(out[:-1] if stopped else out, skip_special_tokens=True)
        reply = {
            "id": "x",
            "object": "chat.completion",
            "model": self.name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop" if stopped else "length",
                }
            ],
        }
        if self.usage:
            reply["usage"] = {
                "prompt_tokens": len(ids),
                "completion_tokens": len(out),
                "total_tokens": len(ids) + len(out),
            }
        return 200, reply

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def tiny(tiny_target_dir):
    return load_target(tiny_target_dir)


def write_prompts(path: Path, n: int) -> Path:
    questions = ["What is the capital of France?", "Count from one to ten.", "Hello!", "Solve 12 * 7."]
    rows = [
        {"id": f"q{i}", "turns": [f"{questions[i % 4]} {i}"] + (["And why?"] if i % 3 == 0 else [])} for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def rows_of(folder: Path) -> dict[str, dict]:
    rows = [json.loads(x) for p in sorted(folder.glob("conversations-*.jsonl")) for x in p.read_text().splitlines()]
    assert len(rows) == len({r["id"] for r in rows})
    return {r["id"]: r for r in rows}


def without_counted_by(meta: dict) -> dict:
    """The answers' meta without how each backend measured them (the token count's source; the loop
    count, which only eaglekit's own backends take)."""
    return meta | {
        "turns": [{k: v for k, v in t.items() if k not in ("counted_by", "loop_tokens")} for t in meta["turns"]]
    }


def test_server_answers_equal_local_answers(tmp_path, tiny_target_dir, tiny):
    prompts = write_prompts(tmp_path / "p.jsonl", 9)
    with TinyServer(tiny) as server:
        assert (
            main(
                [
                    "generate",
                    "--prompts",
                    str(prompts),
                    "--target",
                    str(tiny_target_dir),
                    "--out",
                    str(tmp_path / "srv"),
                    "--backend",
                    "openai",
                    "--server-url",
                    server.url + "/v1",
                    "--concurrency",
                    "4",
                    "--max-new-tokens",
                    "10",
                ]
            )
            == 0
        )
    assert (
        main(
            [
                "generate",
                "--prompts",
                str(prompts),
                "--target",
                str(tiny_target_dir),
                "--out",
                str(tmp_path / "local"),
                "--backend",
                "hf",
                "--batch-size",
                "1",
                "--max-new-tokens",
                "10",
            ]
        )
        == 0
    )
    served, local = rows_of(tmp_path / "srv"), rows_of(tmp_path / "local")
    assert served.keys() == local.keys() and len(served) == 9
    for key in served:
        assert served[key]["messages"] == local[key]["messages"]
        assert without_counted_by(served[key]["meta"]) == without_counted_by(local[key]["meta"])
    manifest = json.loads((tmp_path / "srv" / "manifest.json").read_text())
    assert manifest["target"] == tiny.fingerprint() and manifest["config"]["backend"] == "openai"
    assert manifest["config"]["model"] == "tiny" and manifest["counts"]["assistant_turns"] == 9 + 3
    assert manifest["counts"]["counted_by"] == {"server": 9 + 3}
    assert json.loads((tmp_path / "local" / "manifest.json").read_text())["counts"]["counted_by"] == {"generator": 12}
    # What was sent: the sampling settings, a per-request seed, and turn 2 after the target's own turn 1.
    assert all(r["max_tokens"] == 10 and r["temperature"] == 0.0 and r["top_p"] == 1.0 for r in server.requests)
    assert all("top_k" not in r and isinstance(r["seed"], int) for r in server.requests)
    second = [r for r in server.requests if len(r["messages"]) == 3]
    assert len(second) == 3
    for r in second:
        conv = next(c for c in served.values() if c["messages"][0] == r["messages"][0])
        assert r["messages"] == conv["messages"][:3]


def backend_for(server, tiny, **kwargs) -> OpenAIBackend:
    client = OpenAIClient(server.url, max_retries=kwargs.pop("max_retries", 4), backoff=0.01, timeout=30)
    return OpenAIBackend(
        client,
        model=kwargs.pop("model", None),
        tokenizer=tiny.tokenizer,
        max_new_tokens=kwargs.pop("max_new_tokens", 8),
        sampling=Sampling(),
        **kwargs,
    )


def test_transient_failures_are_retried(tmp_path, tiny):
    prompts = write_prompts(tmp_path / "p.jsonl", 4)
    with TinyServer(tiny) as server:
        server.faults = [503, "drop", 429, 500]
        generate_conversations(
            str(prompts),
            tmp_path / "out",
            backend=backend_for(server, tiny, concurrency=2),
            target_fp=tiny.fingerprint(),
            config=GenerateConfig(max_new_tokens=8),
        )
        assert len(server.requests) == 4 + 6  # 4 faults, 6 turns answered (q0 and q3 have two)
        assert len(rows_of(tmp_path / "out")) == 4
        server.faults = [503] * 3
        with pytest.raises(EaglekitError, match="failed 3 times: HTTP 503"):
            generate_conversations(
                str(prompts),
                tmp_path / "out2",
                backend=backend_for(server, tiny, concurrency=1, max_retries=2),
                target_fp=tiny.fingerprint(),
                config=GenerateConfig(max_new_tokens=8),
            )


def test_request_seeds_follow_the_seed(tmp_path, tiny):
    prompts = write_prompts(tmp_path / "p.jsonl", 2)
    sent = {}
    with TinyServer(tiny) as server:
        for run, seed in enumerate((1, 1, 2)):
            server.requests.clear()
            generate_conversations(
                str(prompts),
                tmp_path / f"out{run}",
                backend=backend_for(server, tiny, seed=seed),
                target_fp=tiny.fingerprint(),
                config=GenerateConfig(max_new_tokens=4, seed=seed),
            )
            sent.setdefault(seed, []).append(sorted(r["seed"] for r in server.requests))
    assert sent[1][0] == sent[1][1] != sent[2][0]
    assert len(set(sent[1][0])) == len(sent[1][0])  # one seed per conversation and turn


def test_without_usage_tokens_are_counted_with_the_tokenizer_and_said_so(tmp_path, tiny, caplog):
    prompts = write_prompts(tmp_path / "p.jsonl", 6)
    with TinyServer(tiny) as server:
        generate_conversations(
            str(prompts),
            tmp_path / "usage",
            backend=backend_for(server, tiny, concurrency=3),
            target_fp=tiny.fingerprint(),
            config=GenerateConfig(max_new_tokens=8),
        )
    with TinyServer(tiny, usage=False) as server, caplog.at_level("WARNING", logger="eaglekit.data.openai_backend"):
        manifest = generate_conversations(
            str(prompts),
            tmp_path / "bare",
            backend=backend_for(server, tiny, concurrency=3),
            target_fp=tiny.fingerprint(),
            config=GenerateConfig(max_new_tokens=8),
        )
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert sum("no usage.completion_tokens" in w for w in warnings) == 1  # once, not once per answer
    assert sum("no usage.prompt_tokens" in w for w in warnings) == 1  # the template check could not run
    assert manifest["counts"]["counted_by"] == {"tokenizer": 6 + 2}
    with_usage, bare = rows_of(tmp_path / "usage"), rows_of(tmp_path / "bare")
    assert all(t["counted_by"] == "tokenizer" for r in bare.values() for t in r["meta"]["turns"])
    for key, row in bare.items():
        assert row["messages"] == with_usage[key]["messages"]
        for turn, answer in zip(row["meta"]["turns"], row["messages"][1::2]):  # [user, assistant, ...]
            ids = tiny.tokenizer.encode(answer["content"], add_special_tokens=False)
            assert turn["num_tokens"] == len(ids) + (turn["finish_reason"] == "stop")


def test_client_errors_stop_the_run_with_the_servers_message(tmp_path, tiny):
    with TinyServer(tiny) as server:
        with pytest.raises(EaglekitError, match="does not serve 'other'"):
            backend_for(server, tiny, model="other")
        server.faults = [401]
        prompts = write_prompts(tmp_path / "p.jsonl", 1)
        with pytest.raises(EaglekitError, match="refused a request for prompt 'q0': HTTP 401"):
            generate_conversations(
                str(prompts),
                tmp_path / "out",
                backend=backend_for(server, tiny),
                target_fp=tiny.fingerprint(),
                config=GenerateConfig(max_new_tokens=8),
            )


def test_a_server_with_another_chat_template_is_refused(tmp_path, tiny):
    other = tiny.tokenizer.chat_template.replace(
        "'<|im_start|>' + message['role']", "'<|im_start|>' + message['role'] + ' x'"
    )
    assert other != tiny.tokenizer.chat_template
    prompts = write_prompts(tmp_path / "p.jsonl", 2)
    with TinyServer(tiny, chat_template=other) as server:
        with pytest.raises(EaglekitError, match="another tokenizer or chat template"):
            generate_conversations(
                str(prompts),
                tmp_path / "out",
                backend=backend_for(server, tiny),
                target_fp=tiny.fingerprint(),
                config=GenerateConfig(max_new_tokens=8),
            )
        generate_conversations(
            str(prompts),
            tmp_path / "out2",
            backend=backend_for(server, tiny, check_template=False),
            target_fp=tiny.fingerprint(),
            config=GenerateConfig(max_new_tokens=8),
        )


def test_context_refusals_are_skipped_and_recorded(tmp_path, tiny):
    path = tmp_path / "p.jsonl"
    path.write_text(
        json.dumps({"id": "ok", "turns": ["Hello!"]})
        + "\n"
        + json.dumps({"id": "huge", "turns": ["The quick brown fox jumps. " * 40]})
        + "\n"
    )
    with TinyServer(tiny) as server:
        # context_length above the server's: the server itself refuses the long prompt (HTTP 400).
        backend = backend_for(server, tiny, context_length=4096)
        generate_conversations(
            str(path),
            tmp_path / "out",
            backend=backend,
            target_fp=tiny.fingerprint(),
            config=GenerateConfig(max_new_tokens=8),
        )
        assert list(rows_of(tmp_path / "out")) == ["ok"]
        (skip,) = [json.loads(x) for x in (tmp_path / "out" / "skipped.jsonl").read_text().splitlines()]
        assert skip["id"] == "huge" and "maximum context length" in skip["reason"]
        # By default the server's max_model_len is known, so the prompt is not even sent.
        sent = len(server.requests)
        generate_conversations(
            str(path),
            tmp_path / "out2",
            backend=backend_for(server, tiny),
            target_fp=tiny.fingerprint(),
            config=GenerateConfig(max_new_tokens=8),
        )
        assert len(server.requests) == sent + 1


def test_resume_after_the_server_died(tmp_path, tiny):
    prompts = write_prompts(tmp_path / "p.jsonl", 12)
    with TinyServer(tiny) as server:
        server.dead = True  # every request fails ...
        server.faults = [None] * 6  # ... after the first six answers
        with pytest.raises(EaglekitError, match="HTTP 503"):
            generate_conversations(
                str(prompts),
                tmp_path / "out",
                backend=backend_for(server, tiny, concurrency=3, max_retries=1),
                target_fp=tiny.fingerprint(),
                config=GenerateConfig(max_new_tokens=8),
            )
        partial = rows_of(tmp_path / "out")
        assert 0 < len(partial) < 12 and not (tmp_path / "out" / "manifest.json").exists()
        server.dead, server.faults = False, []
        generate_conversations(
            str(prompts),
            tmp_path / "out",
            backend=backend_for(server, tiny, concurrency=3),
            target_fp=tiny.fingerprint(),
            config=GenerateConfig(max_new_tokens=8),
        )
    rows = rows_of(tmp_path / "out")
    assert sorted(rows) == sorted(f"q{i}" for i in range(12))
    assert all(rows[k] == v for k, v in partial.items())
