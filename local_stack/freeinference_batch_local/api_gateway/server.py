"""HTTP API's front door: an HTTP/1.1 server (keep-alive, chunked bodies) that reads a request,
refuses a body over 10 MB before reading it (and drains it, so the client reads the 413), picks
the route, and answers what the integration answers, with API Gateway's `apigw-requestid`."""

from __future__ import annotations

import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

from freeinference_batch_local.api_gateway.integration import (
    INTEGRATION_TIMEOUT_SECONDS,
    JSON_HEADER,
    MAX_BODY_BYTES,
    TOO_LARGE,
    build_event,
    invoke_integration,
)
from freeinference_batch_local.api_gateway.routes import Route, select_route

log = logging.getLogger(__name__)

_NOT_FOUND = b'{"message":"Not Found"}'
# Drained after a 413 so the client can read the answer instead of a reset (bounded, then close).
_DRAIN_LIMIT = 1024 * 1024 * 1024
_DRAIN_TIMEOUT = 5.0


class _BodyTooLarge(Exception):
    pass


class ApiGatewayHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ApiGatewayServer  # type: ignore[assignment]

    def setup(self) -> None:
        super().setup()
        # Status line, headers and body go out in one write anyway; no Nagle delay on keep-alive.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.client_address[0], *args)

    def handle_expect_100(self) -> bool:
        if self._declared_length() > self.server.max_body_bytes:
            self._refuse_too_large(drain=False)
            return False
        return super().handle_expect_100()

    def do_GET(self) -> None:
        self._serve()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_GET

    def __getattr__(self, name: str) -> Any:
        # Any other method (TRACE, CONNECT, made-up ones) gets API Gateway's answer, a JSON 404
        # from route matching, not http.server's HTML 501.
        if name.startswith("do_"):
            return self._serve
        raise AttributeError(name)

    def _declared_length(self) -> int:
        try:
            return int(self.headers.get("Content-Length") or 0)
        except ValueError:
            return 0

    def _serve(self) -> None:
        started = time.perf_counter()
        if self._declared_length() > self.server.max_body_bytes:
            self._refuse_too_large(drain=True)
            return
        try:
            body = self._read_body()
        except _BodyTooLarge:
            self._refuse_too_large(drain=False)
            return
        except (ValueError, OSError):
            self.close_connection = True
            self._send(400, [("Content-Type", "application/json")], b'{"message":"Bad Request"}')
            return
        path = self.path.partition("?")[0]
        selected = select_route(self.server.routes, self.command, unquote(path))
        if selected is None:
            self._send(404, [("Content-Type", "application/json")], _NOT_FOUND)
            self._log(404, started)
            return
        route, params = selected
        host = self.headers.get("Host") or f"{self.server.server_address[0]}:{self.server.server_port}"
        event = build_event(
            method=self.command,
            target=self.path,
            headers=self.headers.items(),
            body=body,
            route_key=route.route_key,
            path_parameters=params,
            source_ip=self.client_address[0],
            protocol=self.request_version,
            domain_name=host,
        )
        status, headers, payload = invoke_integration(
            route.handler, event, route.context_factory(), timeout_seconds=self.server.integration_timeout_seconds
        )
        headers = [*headers, ("apigw-requestid", event["requestContext"]["requestId"])]
        self._send(status, headers, payload)
        self._log(status, started)

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return self._read_chunked()
        length = self._declared_length()
        return self.rfile.read(length) if length > 0 else b""

    def _read_chunked(self) -> bytes:
        chunks, total = [], 0
        while True:
            size_line = self.rfile.readline(65537)
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(chunks)
            total += size
            if total > self.server.max_body_bytes:
                raise _BodyTooLarge
            chunks.append(self.rfile.read(size))
            self.rfile.readline(65537)

    def _refuse_too_large(self, *, drain: bool) -> None:
        self.close_connection = True
        self._send(413, [JSON_HEADER, ("Connection", "close")], TOO_LARGE)
        if drain:
            # Read (and drop) what the client is still sending, so it gets to read the 413.
            remaining = min(self._declared_length(), _DRAIN_LIMIT)
            try:
                self.connection.settimeout(_DRAIN_TIMEOUT)
                while remaining > 0:
                    chunk = self.rfile.read(min(remaining, 1024 * 1024))
                    if not chunk:
                        break
                    remaining -= len(chunk)
            except OSError:
                pass
        log.info("%s %s -> 413 (body over %d bytes)", self.command, self.path, self.server.max_body_bytes)

    def _send(self, status: int, headers: list[tuple[str, str]], payload: bytes) -> None:
        reason = self.responses.get(status, ("",))[0]
        lines = [f"HTTP/1.1 {status} {reason}"]
        for name, value in headers:
            if name.lower() not in {"content-length", "transfer-encoding", "date"}:
                lines.append(f"{name}: {value}")
        lines.append(f"Content-Length: {len(payload)}")
        lines.append(f"Date: {self.date_time_string()}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace")
        self.wfile.write(head if self.command == "HEAD" else head + payload)
        self.wfile.flush()

    def _log(self, status: int, started: float) -> None:
        log.info(
            '%s "%s %s" %d %.1f ms',
            self.client_address[0],
            self.command,
            self.path,
            status,
            (time.perf_counter() - started) * 1000,
        )


class ApiGatewayServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # Many clients may connect at once (load tests); the default backlog of 5 drops SYNs.
    request_queue_size = 128

    def __init__(
        self,
        routes: list[Route],
        host: str = "127.0.0.1",
        port: int = 8080,
        max_body_bytes: int = MAX_BODY_BYTES,
        integration_timeout_seconds: float = INTEGRATION_TIMEOUT_SECONDS,
    ) -> None:
        self.routes = routes
        self.max_body_bytes = max_body_bytes
        self.integration_timeout_seconds = integration_timeout_seconds
        super().__init__((host, port), ApiGatewayHandler)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """http://HOST:PORT (no trailing slash)."""
        return f"http://{self.server_address[0]}:{self.server_port}"

    def start(self) -> str:
        self._thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.1}, name="apigw", daemon=True
        )
        self._thread.start()
        return self.url

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
