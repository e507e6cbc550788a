"""A simulated OpenAI-compatible upstream: `POST /v1/chat/completions` with deterministic text,
real `usage` counts, latency and fault injection.

The local stack runs it when no upstream URL is configured; tests start one per test. Replies
depend only on the model and the messages, so a test can predict them. Directives written
anywhere in any message's text steer one request:

- `[sim:latency=S]`    answer after S seconds (a float);
- `[sim:status=CODE]`  answer every attempt with HTTP CODE and an OpenAI-style error body;
- `[sim:status=CODE until=NAME]`  the same, until the test opens gate NAME (`open_gate`); then
                       answer: a fault that is fixed meanwhile (a batch's failures, then its retry);
- `[sim:fail=CODE*N]`  fail the first N attempts of this request with CODE, then succeed;
- `[sim:hang]`         never answer: hold the connection until the client gives up or the
                       simulator stops;
- `[sim:gate=NAME]`    answer only once the test opens gate NAME (`open_gate`): requests that
                       must all be in flight at once, however long the caller takes to start them;
- `[sim:pad=N]`        add N characters ("é", 6 bytes each once JSON-escaped) to the reply: an
                       answer too big for a page of results (about 1,000,000 is past 6 MB).

"This request" is the `X-FreeInference-Request-Id` header when the caller sends one (the worker
sends "<batch id>:<position>"), else a hash of the body, so retries of the same request share an
attempt counter.

Run standalone: `python -m freeinference_batch_local.upstream_sim --port 8081`.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import ipaddress
import json
import re
import select
import socket
import threading
import time
import uuid
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

CHAT_PATHS = frozenset({"/v1/chat/completions", "/chat/completions"})
REQUEST_ID_HEADER = "X-FreeInference-Request-Id"

_LATENCY = re.compile(r"\[sim:latency=([0-9]*\.?[0-9]+)\]")
_STATUS = re.compile(r"\[sim:status=(\d{3})\]")
_STATUS_UNTIL = re.compile(r"\[sim:status=(\d{3}) until=([A-Za-z0-9_-]+)\]")
_FAIL = re.compile(r"\[sim:fail=(\d{3})\*(\d+)\]")
_HANG = re.compile(r"\[sim:hang\]")
_PAD = re.compile(r"\[sim:pad=(\d+)\]")
_GATE = re.compile(r"\[sim:gate=([A-Za-z0-9_-]+)\]")
_PAD_CHARACTER = "é"
_ANY_DIRECTIVE = re.compile(r"\[sim:[^\]]*\]")

# Reply = prefix + this many words echoed from the last user message.
_ECHO_WORDS = 12
# Per-message overhead in the prompt token count (role, separators), as real tokenizers add.
_MESSAGE_OVERHEAD_TOKENS = 3
# How often a held ([sim:hang]) request checks whether its client left or the server stopped.
_HANG_POLL_SECONDS = 0.25
# A body larger than this is refused (the local stack's own limit is far below).
_MAX_BODY_BYTES = 64 * 1024 * 1024


def _error_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 403:
        return "permission_error"
    if status == 404:
        return "not_found_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def error_body(status: int, message: str, code: str | None = None) -> dict:
    """The error shape OpenAI-compatible servers answer with."""
    if code is None:
        code = {429: "rate_limit_exceeded", 404: "not_found"}.get(status)
        if code is None:
            code = "server_error" if status >= 500 else "invalid_request"
    return {"error": {"message": message, "type": _error_type(status), "code": code}}


def message_text(message: dict) -> str:
    """All text of a message: string content, or the text parts of list content."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return " ".join(parts)
    return ""


def prompt_tokens(messages: list[dict]) -> int:
    """Whitespace-separated words of each message (at least 1) plus a per-message overhead."""
    return sum(max(1, len(message_text(m).split())) + _MESSAGE_OVERHEAD_TOKENS for m in messages)


def reply_for(model: str, messages: list[dict], max_tokens: int | None) -> tuple[str, bool]:
    """The deterministic reply text and whether max_tokens truncated it."""
    canonical = json.dumps({"model": model, "messages": messages}, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:8]
    last_user = next((m for m in reversed(messages) if m.get("role") == "user"), messages[-1])
    echo = _ANY_DIRECTIVE.sub(" ", message_text(last_user)).split()[:_ECHO_WORDS] or ["(empty)"]
    words = ["Simulated", "reply", f"{digest}:", *echo]
    if max_tokens is not None and max_tokens < len(words):
        return " ".join(words[: max(1, max_tokens)]), True
    return " ".join(words), False


class _Directives:
    def __init__(self, texts: list[str]) -> None:
        joined = "\n".join(texts)
        latency = _LATENCY.search(joined)
        status = _STATUS.search(joined)
        fail = _FAIL.search(joined)
        self.latency = float(latency.group(1)) if latency else 0.0
        self.status = int(status.group(1)) if status else None
        until = _STATUS_UNTIL.search(joined)
        self.status_until = (int(until.group(1)), until.group(2)) if until else None
        self.fail_status = int(fail.group(1)) if fail else None
        self.fail_count = int(fail.group(2)) if fail else 0
        self.hang = bool(_HANG.search(joined))
        pad = _PAD.search(joined)
        self.pad = int(pad.group(1)) if pad else 0
        gate = _GATE.search(joined)
        self.gate = gate.group(1) if gate else None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 1024
    allow_reuse_address = True

    simulator: UpstreamSimulator


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    server_version = "FreeInferenceUpstreamSim/1.0"

    # -- connection bookkeeping (so stop() can close idle keep-alive connections) --

    def setup(self) -> None:
        super().setup()
        self.server.simulator._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.simulator._track(self.connection, add=False)

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.simulator.verbose:
            super().log_message(format, *args)

    # -- routing --

    def _path(self) -> str:
        return self.path.split("?", 1)[0].rstrip("/") or "/"

    def do_POST(self) -> None:
        body = self._read_body()
        if body is None:
            return
        if self._path() not in CHAT_PATHS:
            self._send_json(404, error_body(404, f"Unknown path {self._path()}"))
            return
        self.server.simulator._serve_chat(self, body)

    def do_GET(self) -> None:
        if self._path() in CHAT_PATHS:
            self._send_json(405, error_body(405, "Use POST", "method_not_allowed"))
        else:
            self._send_json(404, error_body(404, f"Unknown path {self._path()}"))

    do_PUT = do_DELETE = do_PATCH = do_GET

    # -- I/O --

    def _read_body(self) -> bytes | None:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    # Trailer section ends with an empty line.
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > _MAX_BODY_BYTES:
            self.close_connection = True
            self._send_json(400, error_body(400, "Bad Content-Length"))
            return None
        return self.rfile.read(length) if length else b""

    def _send_json(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def client_gone(self) -> bool:
        """True once the client closed its side (a read would answer end-of-file)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True


def _every_interface(host: str) -> bool:
    """Whether `host` is the unspecified address (0.0.0.0, ::), which binds every interface."""
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:  # a name
        return False


class UpstreamSimulator:
    """An OpenAI-compatible chat completions server on a background thread.

    Counters for tests: `attempts_by_request` (request id -> attempts seen), `total_requests`,
    `max_concurrent` (most chat requests being handled at once), `concurrent` (now) and `answered`
    (request id, model, prompt and completion tokens of every 200 sent: what a caller is charged
    for, counted outside it).
    """

    def __init__(self, *, verbose: bool = False) -> None:
        self.verbose = verbose
        self.attempts_by_request: dict[str, int] = defaultdict(int)
        self.answered: list[tuple[str, str, int, int]] = []
        self.total_requests = 0
        self.concurrent = 0
        self.max_concurrent = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._gates: dict[str, threading.Event] = defaultdict(threading.Event)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.base_url = ""

    # -- lifecycle --

    def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Start serving; returns the base URL, e.g. "http://127.0.0.1:PORT/v1"."""
        if self._server is not None:
            raise RuntimeError("simulator already started")
        self._stopping.clear()
        server = _Server((host, port), _Handler)
        server.simulator = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="upstream-sim", daemon=True
        )
        self._thread.start()
        # A server bound to every interface is called on loopback.
        url_host = "127.0.0.1" if not host or _every_interface(host) else host
        self.base_url = f"http://{url_host}:{server.server_address[1]}/v1"
        return self.base_url

    @property
    def port(self) -> int:
        return self._server.server_address[1] if self._server else 0

    def stop(self) -> None:
        """Stop serving: wake held and delayed requests, close open connections."""
        server, self._server = self._server, None
        if server is None:
            return
        self._stopping.set()
        server.shutdown()
        server.server_close()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> UpstreamSimulator:
        if self._server is None:
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def reset_counters(self) -> None:
        with self._lock:
            self.attempts_by_request.clear()
            self.answered.clear()
            self.total_requests = 0
            self.max_concurrent = self.concurrent

    def open_gate(self, name: str) -> None:
        """Let every request held by `[sim:gate=NAME]` answer, now and from now on."""
        self._gate(name).set()

    def _track(self, connection: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(connection)
            else:
                self._connections.discard(connection)

    # -- the endpoint --

    def _serve_chat(self, handler: _Handler, raw: bytes) -> None:
        with self._lock:
            self.total_requests += 1
            self.concurrent += 1
            self.max_concurrent = max(self.max_concurrent, self.concurrent)
        try:
            status, payload = self._answer(handler, raw)
            if status is not None:
                handler._send_json(status, payload)
        finally:
            with self._lock:
                self.concurrent -= 1

    def _answer(self, handler: _Handler, raw: bytes) -> tuple[int | None, dict]:
        """(status, body) to send, or (None, {}) when the request must get no answer."""
        try:
            body = json.loads(raw or b"null")
        except (ValueError, UnicodeDecodeError):
            return 400, error_body(400, "Request body is not valid JSON")
        if not isinstance(body, dict):
            return 400, error_body(400, "Request body must be a JSON object")
        model, messages = body.get("model"), body.get("messages")
        if not isinstance(model, str) or not model:
            return 400, error_body(400, "'model' is required", "missing_model")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            return 400, error_body(400, "'messages' must be a non-empty array of objects", "invalid_messages")
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            return 400, error_body(400, "'max_tokens' must be a positive integer", "invalid_max_tokens")

        request_id = handler.headers.get(REQUEST_ID_HEADER) or hashlib.sha256(raw).hexdigest()[:16]
        with self._lock:
            self.attempts_by_request[request_id] += 1
            attempt = self.attempts_by_request[request_id]

        directives = _Directives([message_text(m) for m in messages])
        if directives.hang:
            self._hold(handler)
            return None, {}
        if directives.gate is not None and not self._hold(handler, self._gate(directives.gate)):
            return None, {}
        if directives.latency and self._stopping.wait(directives.latency):
            handler.close_connection = True
            return None, {}
        if directives.status is not None:
            return directives.status, error_body(directives.status, f"Simulated status {directives.status}")
        if directives.status_until is not None and not self._gate(directives.status_until[1]).is_set():
            code, gate = directives.status_until
            return code, error_body(code, f"Simulated status {code} until gate {gate} opens")
        if directives.fail_status is not None and attempt <= directives.fail_count:
            return directives.fail_status, error_body(
                directives.fail_status,
                f"Simulated failure {attempt} of {directives.fail_count} ({directives.fail_status})",
            )

        text, truncated = reply_for(model, messages, max_tokens)
        completion = len(text.split())
        if directives.pad:
            text += " " + _PAD_CHARACTER * directives.pad
        prompt = prompt_tokens(messages)
        with self._lock:
            self.answered.append((request_id, model, prompt, completion))
        return 200, {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "length" if truncated else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }

    def _gate(self, name: str) -> threading.Event:
        with self._lock:
            return self._gates[name]

    def _hold(self, handler: _Handler, gate: threading.Event | None = None) -> bool:
        """Hold the request, sleeping (no busy loop), until `gate` opens (True), or with no gate
        for ever: False once the server stops or the client leaves first."""
        wake = gate if gate is not None else self._stopping
        while not self._stopping.is_set() and not handler.client_gone():
            if wake.wait(_HANG_POLL_SECONDS) and wake is gate:
                return True
        handler.close_connection = True
        return False


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Simulated OpenAI-compatible upstream")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--verbose", action="store_true", help="log every request")
    args = parser.parse_args(argv)
    simulator = UpstreamSimulator(verbose=args.verbose)
    url = simulator.start(args.host, args.port)
    print(f"Simulated upstream listening at {url}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        simulator.stop()


if __name__ == "__main__":
    main()
