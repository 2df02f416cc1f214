"""Answer conversations through any OpenAI-compatible server (vLLM, SGLang, llama.cpp server).

Each conversation is one task on a thread pool: its turns are sent one after another to
`POST /v1/chat/completions`, each with the history the target itself wrote. Up to `concurrency`
conversations are in flight, so the server batches them. Connection errors, timeouts, 429 and
5xx are retried with exponential backoff; other errors stop the run with the server's message.

The server renders the chat template itself, so its `usage.prompt_tokens` is compared with the
length of the same prompt rendered locally with the target's tokenizer: a server running another
tokenizer or template is refused instead of quietly producing data for the wrong model. A server
that reports no `usage` gets a warning (once): its answers' token counts come from re-encoding the
text with the target's tokenizer, and each answer records which way it was counted (`counted_by`).
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import logging
import threading
import time
import urllib.parse
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Iterable, Iterator

from eaglekit.data.records import Answer, Conversation
from eaglekit.errors import EaglekitError
from eaglekit.runtime.sampling import Sampling
from eaglekit.targets.chat import prompt_ids

log = logging.getLogger(__name__)

# Servers' finish reasons: a stop token / stop string, or the max_tokens limit.
FINISH_REASONS = {"stop": "stop", "eos": "stop", "eos_token": "stop", "length": "length"}
RETRY_STATUS = {408, 429, 500, 502, 503, 504}
CONTEXT_WORDS = (
    "context length",
    "maximum context",
    "context_length",
    "too long",
    "max_model_len",
    "exceeds",
    "maximum model length",
)


def redact_url(url: str) -> str:
    """The URL with any `user:password@` replaced by `***@`, for logs and errors."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"***@{host}"))


class ServerError(Exception):
    def __init__(self, status: int, body: str):
        super().__init__(f"HTTP {status}: {body[:500]}")
        self.status, self.body = status, body


class OpenAIClient:
    """A minimal JSON client with one keep-alive connection per thread.

    Args:
        base_url: e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted).
        api_key: sent as a bearer token when given.
        timeout: seconds per request.
        max_retries: retries of a request that failed for a transient reason.
        backoff: seconds before the first retry; doubled for each next one (at most 10 s).
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 600.0,
        max_retries: int = 5,
        backoff: float = 0.5,
    ):
        url = urllib.parse.urlsplit(base_url.rstrip("/"))
        if url.scheme not in ("http", "https") or not url.hostname:
            raise EaglekitError(f"bad server URL {redact_url(base_url)!r}", hint="e.g. http://127.0.0.1:8000")
        self.scheme, self.host, self.port = url.scheme, url.hostname, url.port
        self.prefix = url.path[:-3] if url.path.endswith("/v1") else url.path
        self.api_key, self.timeout, self.max_retries, self.backoff = api_key, timeout, max_retries, backoff
        # Credentials in the URL are sent as HTTP basic auth (an API key wins) and never printed.
        self.basic_auth = (
            base64.b64encode(
                f"{urllib.parse.unquote(url.username)}:{urllib.parse.unquote(url.password or '')}".encode()
            ).decode()
            if url.username
            else None
        )
        self.base_url = redact_url(base_url)  # for messages only
        self._local = threading.local()

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
            conn = self._local.conn = cls(self.host, self.port, timeout=self.timeout)
        return conn

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def request(self, method: str, path: str, body: dict | None = None) -> dict:
        """Send one request, retrying transient failures; return the JSON response."""
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        elif self.basic_auth:
            headers["Authorization"] = f"Basic {self.basic_auth}"
        payload = None if body is None else json.dumps(body).encode()
        for attempt in range(self.max_retries + 1):
            try:
                conn = self._connection()
                conn.request(method, self.prefix + path, body=payload, headers=headers)
                response = conn.getresponse()
                text = response.read().decode("utf-8", errors="replace")
                if response.status == 200:
                    return json.loads(text)
                if response.status not in RETRY_STATUS:
                    raise ServerError(response.status, text)
                problem = f"HTTP {response.status}: {text[:200]}"
            except (OSError, http.client.HTTPException, json.JSONDecodeError) as err:
                self._drop_connection()
                problem = f"{type(err).__name__}: {err}"
            if attempt < self.max_retries:
                delay = min(self.backoff * 2**attempt, 10.0)
                log.warning(
                    "%s %s failed (%s); retry %d/%d in %.1f s",
                    method,
                    path,
                    problem,
                    attempt + 1,
                    self.max_retries,
                    delay,
                )
                time.sleep(delay)
        raise EaglekitError(
            f"the server at {self.base_url} failed {self.max_retries + 1} times: {problem}",
            hint="is the server up and reachable? (check its log; --max-retries, --timeout)",
        )

    def models(self) -> list[dict]:
        try:
            return self.request("GET", "/v1/models").get("data", [])
        except ServerError as err:
            raise EaglekitError(
                f"the server at {self.base_url} refused GET /v1/models: {err}",
                hint="is it an OpenAI-compatible server? pass --model NAME",
            ) from err


class OpenAIBackend:
    """Chat-level backend over an OpenAI-compatible chat completions endpoint.

    Args:
        client: the HTTP client.
        model: the served model name (None: the only model the server lists).
        tokenizer: the target's tokenizer, to check the server's prompt lengths and the context.
        max_new_tokens: answer length limit per turn.
        sampling: sampling settings (sent as temperature / top_p / top_k).
        seed: base of the per-request seeds (one per conversation and turn).
        concurrency: conversations in flight.
        context_length: None: the server's `max_model_len` when it reports one.
        check_template: compare the server's prompt token counts with the local template's.
    """

    def __init__(
        self,
        client: OpenAIClient,
        *,
        model: str | None,
        tokenizer,
        max_new_tokens: int,
        sampling: Sampling,
        seed: int = 0,
        concurrency: int = 32,
        context_length: int | None = None,
        check_template: bool = True,
        template_kwargs: dict | None = None,
    ):
        if concurrency < 1:
            raise EaglekitError(f"concurrency {concurrency} < 1", hint="e.g. --concurrency 64")
        self.client, self.tokenizer, self.sampling, self.seed = client, tokenizer, sampling, seed
        self.max_new_tokens, self.concurrency, self.check_template = max_new_tokens, concurrency, check_template
        self.template_kwargs = template_kwargs or {}
        self._warned: set[str] = set()
        self._warn_lock = threading.Lock()
        served = client.models()
        names = [m.get("id") for m in served]
        if model is None:
            if len(names) != 1:
                raise EaglekitError(
                    f"the server lists models {names}; which one is the target?", hint="pass --model NAME"
                )
            model = names[0]
        elif names and model not in names:
            raise EaglekitError(f"the server does not serve {model!r} (it lists {names})", hint="fix --model")
        self.model = model
        info = next((m for m in served if m.get("id") == model), {})
        self.context_length = context_length or info.get("max_model_len")
        self.name = "openai"

    def run(self, conversations: Iterable[Conversation]) -> Iterator[list[Conversation]]:
        """Yield each conversation as soon as all its turns are answered (or it was skipped)."""
        source = iter(conversations)
        stop = threading.Event()
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="eaglekit-openai") as pool:
            in_flight: set[Future] = set()
            try:
                while True:
                    for conv in source:
                        in_flight.add(pool.submit(self._converse, conv, stop))
                        if len(in_flight) >= self.concurrency * 2:
                            break
                    if not in_flight:
                        return
                    done, in_flight = wait(in_flight, return_when=FIRST_COMPLETED)
                    failed = [f for f in done if f.exception() is not None]
                    finished = [f.result() for f in done if f.exception() is None]
                    if finished:
                        yield finished  # written before a failure of another one is raised
                    if failed:
                        raise failed[0].exception()
            finally:
                stop.set()  # a failure (or a closed generator) stops the other conversations soon
                for future in in_flight:
                    future.cancel()

    def _converse(self, conv: Conversation, stop: threading.Event) -> Conversation:
        while not conv.done and not stop.is_set():
            messages = conv.next_messages()
            n_prompt = len(prompt_ids(self.tokenizer, messages, **self.template_kwargs))
            budget = self.max_new_tokens
            if self.context_length:
                budget = min(budget, self.context_length - n_prompt)
            if budget < 1:
                conv.skipped = f"prompt of {n_prompt} tokens leaves no room in the context of {self.context_length}"
                break
            try:
                answer = self._complete(conv, messages, budget)
            except ServerError as err:
                if err.status == 400 and any(w in err.body.lower() for w in CONTEXT_WORDS):
                    conv.skipped = f"server refused the prompt: {err.body[:300]}"
                    break
                raise EaglekitError(
                    f"the server refused a request for prompt {conv.prompt.id!r}: {err}",
                    hint="check --model and the server's log",
                ) from err
            if self.check_template and answer.prompt_tokens is not None and answer.prompt_tokens != n_prompt:
                raise EaglekitError(
                    f"the server counts {answer.prompt_tokens} prompt tokens for {conv.prompt.id!r} where the "
                    f"target's own chat template gives {n_prompt}: it serves another tokenizer or chat template",
                    hint="serve the same model folder as --target (or pass --no-check-template if the "
                    "difference is known, e.g. a BOS token added by llama.cpp)",
                )
            answer.prompt_tokens = n_prompt
            conv.answers.append(answer)
        return conv

    def _complete(self, conv: Conversation, messages: list[dict], max_tokens: int) -> Answer:
        s = self.sampling
        # One seed per (conversation, turn): repeats of a prompt still get different samples.
        seed_src = f"{self.seed}:{conv.prompt.id}:{len(conv.answers)}".encode()
        body = {
            "model": self.model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "seed": int.from_bytes(hashlib.sha256(seed_src).digest()[:4], "big"),
            "n": 1,
            "stream": False,
        }
        if s.top_k:
            body["top_k"] = s.top_k  # an extension vLLM, SGLang and llama.cpp all accept
        data = self.client.request("POST", "/v1/chat/completions", body)
        try:
            choice = data["choices"][0]
            text = choice["message"].get("content") or ""
            finish = choice.get("finish_reason")
        except (KeyError, IndexError, TypeError, AttributeError) as err:
            raise EaglekitError(
                f"unexpected chat completion response: {str(data)[:300]}",
                hint="is it an OpenAI-compatible chat completions endpoint?",
            ) from err
        if finish not in FINISH_REASONS:
            raise EaglekitError(
                f"the server ended an answer to {conv.prompt.id!r} with finish_reason {finish!r}",
                hint="an aborted request: check the server's log, then rerun (finished prompts are kept)",
            )
        finish = FINISH_REASONS[finish]
        usage = data.get("usage") or {}
        if self.check_template and usage.get("prompt_tokens") is None:
            self._warn_once(
                "prompt_tokens",
                "the server at %s reports no usage.prompt_tokens: its chat template "
                "cannot be checked against the target's",
                self.client.base_url,
            )
        num_tokens, counted_by = usage.get("completion_tokens"), "server"
        if num_tokens is None:
            self._warn_once(
                "completion_tokens",
                "the server at %s reports no usage.completion_tokens: answer token "
                "counts are estimated by re-encoding the text with the target's tokenizer (recorded as "
                "counted_by 'tokenizer' in the conversations and the manifest)",
                self.client.base_url,
            )
            # The text lacks the end-of-turn token, which num_tokens counts.
            num_tokens = len(self.tokenizer.encode(text, add_special_tokens=False)) + (finish == "stop")
            counted_by = "tokenizer"
        return Answer(
            text=text,
            finish_reason=finish,
            num_tokens=int(num_tokens),
            counted_by=counted_by,
            prompt_tokens=usage.get("prompt_tokens"),
        )

    def _warn_once(self, key: str, message: str, *args) -> None:
        with self._warn_lock:
            if key in self._warned:
                return
            self._warned.add(key)
        log.warning(message, *args)
