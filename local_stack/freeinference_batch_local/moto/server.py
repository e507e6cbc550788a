"""moto in server mode on loopback, one request at a time, with the local stack's patches.

moto documents itself as not concurrency-safe, while the local stack calls it from many threads
(API requests, pollers, workers, schedules). So the server handles one request at a time, on one
thread: werkzeug's server without threads, HTTP/1.0 (moto's handler closes each connection), and
a listen queue deep enough for every caller at once. A thread per request, as
`moto.server.ThreadedMotoServer` runs it, would only wait for one lock around moto, and those
threads' parsing and socket work took the GIL from the one thread holding the lock: under the
worker's load moto was busy half the time with dozens of calls waiting for it (bench/README.md).
The app still takes one lock around moto: it keeps the one-at-a-time rule whatever server runs it,
and guards the count of requests served that the stack's stats and the benches read.

Before it serves, it patches moto (`transactions.py`, `serialization.py`, `expressions.py`: moto's
cost made DynamoDB's; `limits.py`: what DynamoDB and SQS refuse and moto does not), and it can
inject AWS's failures into the service's calls (`aws_faults/`, `LOCAL_AWS_FAULTS`).

The local stack runs it in a child process (`process.py`, which runs `main()` here). Importing
this module imports moto's server (flask and every backend's index): only the processes that
serve moto do.
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import BaseWSGIServer

from freeinference_batch_local.aws_faults import injector
from freeinference_batch_local.aws_faults.config import FaultConfig, config_from_env
from freeinference_batch_local.moto import expressions, limits, serialization, transactions

log = logging.getLogger(__name__)


class SerializedWsgiApp:
    """A WSGI app that runs `app` for one request at a time."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self.lock = threading.Lock()
        self.requests = 0

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        body = _read_body(environ)
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        captured: dict[str, Any] = {}
        written: list[bytes] = []

        def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable:
            captured["status"], captured["headers"] = status, headers
            return written.append

        with self.lock:
            self.requests += 1
            result = self.app(environ, capture)
            try:
                chunks = [*written, *result]
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()
        start_response(captured["status"], captured["headers"])
        return chunks


def _read_body(environ: dict[str, Any]) -> bytes:
    stream = environ.get("wsgi.input")
    if stream is None:
        return b""
    length = environ.get("CONTENT_LENGTH")
    if length:
        return stream.read(int(length))
    if environ.get("wsgi.input_terminated"):  # chunked: werkzeug de-chunks and ends the stream
        return stream.read()
    return b""


class RememberedRouting(DomainDispatcherApplication):
    """moto matches a request's host against every service's URL patterns, on every request; a
    host's service never changes, so each is matched once."""

    def __init__(self, create_app: Callable[..., Any]) -> None:
        super().__init__(create_app)
        self.backend_by_host: dict[str | None, Any] = {}

    def get_backend_for_host(self, host: str | None) -> Any:
        if host not in self.backend_by_host:
            self.backend_by_host[host] = super().get_backend_for_host(host)
        return self.backend_by_host[host]


class OneAtATimeServer(BaseWSGIServer):
    # Callers wait in the kernel's accept queue, not on a thread each: room for all of them
    # (werkzeug's default is 128; the kernel caps it at net.core.somaxconn).
    request_queue_size = 4096


class MotoServer:
    """`start()` returns the endpoint URL (http://127.0.0.1:PORT); `stop()` shuts it down.
    `faults`: AWS's failures to inject (`aws_faults/`); none by default."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, faults: FaultConfig | None = None) -> None:
        self.host = host
        self.port = port
        self.faults = faults
        self.app: SerializedWsgiApp | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> str:
        transactions.install()  # O(items touched) transactions instead of O(table size)
        serialization.install()  # attribute values written as they are, not walked
        expressions.install()  # each update expression parsed once
        limits.install()  # refuse what DynamoDB and SQS refuse and moto does not

        # werkzeug logs every request at INFO; the local stack's own logs are what matter.
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        # Inside the lock: the faults' random draws and moto's state follow the one order of requests.
        faults = self.faults if self.faults is not None else FaultConfig()
        self.app = SerializedWsgiApp(injector.wrap(RememberedRouting(create_backend_app), faults))

        self._server = OneAtATimeServer(self.host, self.port, self.app, handler=MotoRequestHandler)
        self.port = self._server.server_port
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, name="moto-server", daemon=True
        )
        self._thread.start()
        log.debug("moto server on %s", self.endpoint_url)
        return self.endpoint_url

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> MotoServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    """The child of `MotoProcess`: serve, print the endpoint, stop when stdin closes."""
    parser = argparse.ArgumentParser(description="moto server, one request at a time; stops when stdin closes")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with MotoServer(host=args.host, port=args.port, faults=config_from_env()) as server:
        print(server.endpoint_url, flush=True)
        # The parent reads only that line: anything moto prints later goes to stderr, or a full
        # pipe would block moto while it holds its lock.
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
        sys.stdin.read()


if __name__ == "__main__":
    main()
