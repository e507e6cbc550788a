"""API Gateway HTTP API emulation: HTTP requests -> payload 2.0 events -> the api handler -> HTTP.

What API Gateway does and this does too: route matching (most specific route first, then
`$default`, else 404 `{"message":"Not Found"}`), lowercased comma-joined headers, cookies split
out, comma-joined duplicate query parameters, path parameters, binary bodies (here: compressed
or not UTF-8) passed as base64, `{"message":"Internal Server Error"}` when the handler fails,
and the 2.0 response rules (a dict with `statusCode`, or any other value as a 200 JSON body).
A route's handler is, in the local stack, the function's `EnvironmentPool` (environments.py):
each request is an invocation in an execution environment of its own, and a failed invocation
(an exception, a timeout, a process that died) is the handler raising, so a 500 as here.

It refuses what AWS refuses, as AWS answers it (see `invoke_integration`): a body over HTTP API's
10 MB is a 413 before the body is read; an event over Lambda's 6 MB invoke payload is a 413 and
the handler never runs; a handler response over 6 MB is a 500; a handler still running after
the 30 s integration timeout is a 503 (its thread runs on, as the Lambda would).

What it does not emulate: authorizers, CORS, throttling, the custom domain and stages.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, unquote

from freeinference_batch_local.handlers import (
    LAMBDA_INVOKE_PAYLOAD_BYTES,
    LOCAL_ACCOUNT_ID,
    FunctionSpec,
    LambdaContext,
    invoke_payload_bytes,
)

log = logging.getLogger(__name__)

# HTTP API's payload quota: 10 MB, measured on the request body as received.
MAX_BODY_BYTES = 10 * 1024 * 1024
# HTTP API's integration timeout: at most 30 s (REST APIs: 29 s).
INTEGRATION_TIMEOUT_SECONDS = 30.0
API_ID = "local"
_NOT_FOUND = b'{"message":"Not Found"}'
_INTERNAL_ERROR = b'{"message":"Internal Server Error"}'
# HTTP API answers its own errors as {"message": <the status's reason phrase>}. For a body over
# 10 MB and for an event Lambda refuses as too large (Lambda's RequestEntityTooLargeException,
# HTTP 413) the status is 413; AWS's exact body for HTTP APIs is not documented (REST APIs were
# seen answering {"message": "Request Too Long"}), so this is the reason phrase, as for the others.
_TOO_LARGE = b'{"message":"Request Entity Too Large"}'
# HTTP API answers an integration that outlives its timeout with 503 (REST APIs: 504).
_TIMED_OUT = b'{"message":"Service Unavailable"}'
_JSON = ("Content-Type", "application/json")
_TEXT_ENCODINGS = {"", "identity"}
# Drained after a 413 so the client can read the answer instead of a reset (bounded, then close).
_DRAIN_LIMIT = 1024 * 1024 * 1024
_DRAIN_TIMEOUT = 5.0


@dataclass
class Route:
    """One HTTP API route: `method` (or ANY) and `path` with `{name}` / `{name+}`, or `$default`."""

    method: str
    path: str
    handler: Callable[[dict, Any], Any]
    context_factory: Callable[[], Any] = field(default=lambda: LambdaContext("local-api", 128, 29))
    _pattern: re.Pattern[str] | None = field(default=None, init=False, repr=False)
    _rank: tuple[int, ...] = field(default=(), init=False, repr=False)

    def __post_init__(self) -> None:
        self.method = self.method.upper()
        if self.method in {"*", "X-AMAZON-APIGATEWAY-ANY-METHOD"}:
            self.method = "ANY"
        if self.path == "$default":
            self._rank = (9, 0, 0, 0)
            return
        parts, greedy, variables = [], 0, 0
        for segment in self.path.strip("/").split("/"):
            variable = re.fullmatch(r"\{([^{}+]+)(\+?)\}", segment)
            if variable and variable.group(2):
                parts.append(f"(?P<{_group(variable.group(1))}>.+)")
                greedy += 1
            elif variable:
                parts.append(f"(?P<{_group(variable.group(1))}>[^/]+)")
                variables += 1
            else:
                parts.append(re.escape(segment))
        self._pattern = re.compile("/" + "/".join(parts))
        # API Gateway prefers full matches, then fewer variables, greedy last; a method over ANY.
        self._rank = (greedy, variables, -len(self.path), int(self.method == "ANY"))

    @property
    def route_key(self) -> str:
        return "$default" if self.path == "$default" else f"{self.method} {self.path}"

    def match(self, method: str, path: str) -> dict[str, str] | None:
        if self.method not in {"ANY", method}:
            return None
        if self._pattern is None:
            return {}
        found = self._pattern.fullmatch(path)
        if found is None:
            return None
        return {_ungroup(name): unquote(value) for name, value in found.groupdict().items()}


def _group(name: str) -> str:
    return "p_" + name.encode().hex()


def _ungroup(group: str) -> str:
    return bytes.fromhex(group[2:]).decode()


def select_route(routes: Iterable[Route], method: str, path: str) -> tuple[Route, dict[str, str]] | None:
    best = None
    for route in routes:
        params = route.match(method, path)
        if params is not None and (best is None or route._rank < best[0]._rank):
            best = (route, params)
    return best


def routes_from_functions(
    functions: Iterable[FunctionSpec], invoker: Callable[[FunctionSpec], Callable[[dict, Any], Any]] | None = None
) -> list[Route]:
    """A Route per `HttpApi` event of the template's functions (no Path/Method means `$default`).

    `invoker(function)` is what a route calls: the function's `EnvironmentPool` (each request in
    an execution environment of its own), or by default the handler itself, in this process."""
    routes = []
    for function in functions:
        for properties in function.events("HttpApi").values():
            path = properties.get("Path")
            method = properties.get("Method")
            if not path and not method:
                path, method = "$default", "ANY"
            routes.append(
                Route(
                    method=str(method or "ANY"),
                    path=str(path or "/"),
                    handler=invoker(function) if invoker is not None else function.handler,
                    context_factory=function.context,
                )
            )
    return routes


def build_event(
    *,
    method: str,
    target: str,
    headers: Iterable[tuple[str, str]],
    body: bytes | None,
    route_key: str,
    path_parameters: dict[str, str] | None = None,
    source_ip: str = "127.0.0.1",
    protocol: str = "HTTP/1.1",
    domain_name: str = "127.0.0.1",
    request_id: str | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """The HTTP API payload 2.0 event for one request (`target` is the request line's path?query)."""
    raw_path, _, raw_query = target.partition("?")
    now = time.time() if now is None else now
    joined: dict[str, str] = {}
    cookies: list[str] = []
    for name, value in headers:
        name = name.lower()
        if name == "cookie":
            cookies.extend(part.strip() for part in value.split(";") if part.strip())
            continue
        joined[name] = f"{joined[name]},{value}" if name in joined else value
    joined.setdefault("x-forwarded-for", source_ip)
    joined.setdefault("x-forwarded-proto", "http")
    joined.setdefault("x-amzn-trace-id", f"Root=1-{int(now):08x}-{uuid.uuid4().hex[:24]}")
    request_id = request_id or base64.b64encode(uuid.uuid4().bytes[:11]).decode().rstrip("=") + "="
    event: dict[str, Any] = {
        "version": "2.0",
        "routeKey": route_key,
        "rawPath": raw_path,
        "rawQueryString": raw_query,
    }
    if cookies:
        event["cookies"] = cookies
    event["headers"] = joined
    if raw_query:
        query: dict[str, str] = {}
        for name, value in parse_qsl(raw_query, keep_blank_values=True):
            query[name] = f"{query[name]},{value}" if name in query else value
        event["queryStringParameters"] = query
    event["requestContext"] = {
        "accountId": LOCAL_ACCOUNT_ID,
        "apiId": API_ID,
        "domainName": domain_name,
        "domainPrefix": domain_name.split(".")[0].split(":")[0],
        "http": {
            "method": method,
            "path": unquote(raw_path),
            "protocol": protocol,
            "sourceIp": source_ip,
            "userAgent": joined.get("user-agent", ""),
        },
        "requestId": request_id,
        "routeKey": route_key,
        "stage": "$default",
        "time": dt.datetime.fromtimestamp(now, dt.UTC).strftime("%d/%b/%Y:%H:%M:%S +0000"),
        "timeEpoch": int(now * 1000),
    }
    if path_parameters:
        event["pathParameters"] = path_parameters
    if body:
        if joined.get("content-encoding", "").strip().lower() not in _TEXT_ENCODINGS:
            event["body"], event["isBase64Encoded"] = base64.b64encode(body).decode("ascii"), True
        else:
            try:
                event["body"], event["isBase64Encoded"] = body.decode("utf-8"), False
            except UnicodeDecodeError:
                event["body"], event["isBase64Encoded"] = base64.b64encode(body).decode("ascii"), True
    else:
        event["isBase64Encoded"] = False
    return event


def http_response(result: Any) -> tuple[int, list[tuple[str, str]], bytes]:
    """A handler's return value as API Gateway (payload 2.0) answers it: status, headers, body."""
    if isinstance(result, dict) and "statusCode" in result:
        status = int(result["statusCode"])
        if not 100 <= status <= 599:
            raise ValueError(f"statusCode {status} out of range")
        headers = [(str(name), _header_value(value)) for name, value in (result.get("headers") or {}).items()]
        headers += [("Set-Cookie", str(cookie)) for cookie in result.get("cookies") or ()]
        body = result.get("body")
        if body is None:
            payload = b""
        elif result.get("isBase64Encoded"):
            payload = base64.b64decode(body, validate=False)
        elif isinstance(body, str):
            payload = body.encode("utf-8")
        else:
            payload = json.dumps(body).encode("utf-8")
        return status, headers, payload
    # Any other value is a 200 whose body is that value as JSON (a string is sent as-is).
    payload = (result if isinstance(result, str) else json.dumps(result)).encode("utf-8")
    return 200, [("Content-Type", "application/json")], payload


GatewayAnswer = tuple[int, list[tuple[str, str]], bytes]


def refuse_oversized_body(body_length: int, max_body_bytes: int = MAX_BODY_BYTES) -> GatewayAnswer | None:
    """HTTP API's answer to a body over its payload quota, or None if the body may pass."""
    if body_length > max_body_bytes:
        return 413, [_JSON], _TOO_LARGE
    return None


def invoke_integration(
    handler: Callable[[dict, Any], Any],
    event: dict[str, Any],
    context: Any,
    *,
    timeout_seconds: float = INTEGRATION_TIMEOUT_SECONDS,
) -> GatewayAnswer:
    """Invoke a Lambda integration as HTTP API does, with Lambda's and HTTP API's limits.

    - the event over Lambda's invoke payload: Lambda refuses the invoke (413), the handler never
      runs, and the client gets 413 `{"message":"Request Entity Too Large"}`;
    - the handler raises, or answers something that is not a valid 2.0 response, or answers
      more than the invoke payload allows (Lambda's `Function.ResponseSizeTooLarge`): HTTP API
      answers 500 `{"message":"Internal Server Error"}`;
    - the handler has not answered after `timeout_seconds`: 503 `{"message":"Service
      Unavailable"}`; the handler's thread runs on, as the Lambda invocation would.
    """
    request_bytes = invoke_payload_bytes(event)
    if request_bytes > LAMBDA_INVOKE_PAYLOAD_BYTES:
        log.warning("event of %d bytes is over Lambda's invoke payload: 413, the handler did not run", request_bytes)
        return 413, [_JSON], _TOO_LARGE
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            outcome["result"] = handler(event, context)
        except Exception as error:  # whatever the handler raises, the client gets a 500
            outcome["error"] = error
        finally:
            done.set()

    # A daemon thread, not an executor: a handler that never returns must not keep the
    # process from exiting.
    threading.Thread(target=run, name="api-invocation", daemon=True).start()
    if not done.wait(timeout_seconds):
        log.error("the handler did not answer within the %.1f s integration timeout: 503", timeout_seconds)
        return 503, [_JSON], _TIMED_OUT
    if "error" in outcome:
        error = outcome["error"]
        log.error("the handler failed: 500", exc_info=(type(error), error, error.__traceback__))
        return 500, [_JSON], _INTERNAL_ERROR
    result = outcome["result"]
    response_bytes = invoke_payload_bytes(result)
    if response_bytes > LAMBDA_INVOKE_PAYLOAD_BYTES:
        log.error("the handler's response of %d bytes is over Lambda's invoke payload: 500", response_bytes)
        return 500, [_JSON], _INTERNAL_ERROR
    try:
        return http_response(result)
    except (ValueError, TypeError):
        log.exception("the handler's response is not a valid payload 2.0 response: 500")
        return 500, [_JSON], _INTERNAL_ERROR


def _header_value(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ",".join(str(item) for item in value)
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


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
        self._send(413, [_JSON, ("Connection", "close")], _TOO_LARGE)
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


__all__ = [
    "INTEGRATION_TIMEOUT_SECONDS",
    "LAMBDA_INVOKE_PAYLOAD_BYTES",
    "MAX_BODY_BYTES",
    "ApiGatewayServer",
    "Route",
    "build_event",
    "http_response",
    "invoke_integration",
    "invoke_payload_bytes",
    "refuse_oversized_body",
    "routes_from_functions",
    "select_route",
]
