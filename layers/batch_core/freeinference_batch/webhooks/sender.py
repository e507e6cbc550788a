"""One POST to a checked webhook address, over a socket of our own, within one total deadline.

`requests` (urllib3, http.client) gives each socket operation a fresh timeout: a receiver that
trickles its status line one byte every 9 s holds a 10 s-timeout call for as long as it likes.
Here every operation (connect, the TLS handshake, sending, each read of the status line and
headers) gets what is left of one deadline, so an attempt ends when its time is up, whatever the
receiver does; no thread outlives the deadline, so nothing has to be killed.

It also keeps delivery URLs out of traces: Powertools' tracer patches `requests` and `http.client`
(X-Ray records each call's URL, whose path and query often carry a receiver's token); a raw socket
is not patched.

Only the status line is used: the headers are read to their end (bounded in size), the body never.
"""

from __future__ import annotations

import socket
import ssl
import time
from dataclasses import dataclass
from functools import lru_cache

from requests.utils import requote_uri

from freeinference_batch.webhooks.urls import CheckedUrl

# A status line and headers larger than this are not an answer we wait for.
MAX_HEAD_BYTES = 64 * 1024
# An answer that took longer than this share of the deadline counts as slow: not delivered and
# slow, the endpoint is treated as unreachable (as a receiver answering 500 after 9.9 s would be).
SLOW_SHARE = 0.5


@dataclass(frozen=True)
class Answer:
    """What one attempt got: a status, or the reason there was none (`status` is None)."""

    status: int | None
    failure: str = ""
    # The attempt could not reach the receiver in time (no answer, a refused connection, or an
    # answer that was not a 2xx and came slowly): other deliveries to it should not spend their
    # time finding that out.
    unreachable: bool = False

    @property
    def delivered(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


class _TimeUp(Exception):
    pass


@lru_cache(maxsize=1)
def _tls_context() -> ssl.SSLContext:
    try:  # the same CA bundle `requests` verified with
        import certifi

        return ssl.create_default_context(cafile=certifi.where())
    except ImportError:  # pragma: no cover - certifi comes with requests
        return ssl.create_default_context()


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise _TimeUp
    return left


def _request(target: CheckedUrl, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"POST {requote_uri(target.target)} HTTP/1.1", f"Host: {target.host_header}",
             f"Content-Length: {len(body)}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers.items() if name.lower() not in ("host", "content-length")]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _read_status(sock: socket.socket, deadline: float) -> int | None:
    """The final status of the answer (interim 1xx answers skipped), once its headers ended; None
    if what came is not HTTP."""
    buffer = b""
    while True:
        end = buffer.find(b"\r\n\r\n")
        if end >= 0:
            head, buffer = buffer[:end], buffer[end + 4:]
            parts = head.split(b"\r\n", 1)[0].split(b" ", 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
                return None
            status = int(parts[1])
            if status >= 200 or status < 100:
                return status
            continue  # 100 Continue, 103 Early Hints: the real answer follows
        if len(buffer) > MAX_HEAD_BYTES:
            return None
        sock.settimeout(_left(deadline))
        chunk = sock.recv(4096)
        if not chunk:
            return None
        buffer += chunk


def post(target: CheckedUrl, body: bytes, headers: dict[str, str], timeout: float) -> Answer:
    """POST `body` to the target's address within `timeout` seconds in all; never follows a redirect
    (a 3xx is not delivered)."""
    started = time.monotonic()
    deadline = started + timeout
    try:
        sock = socket.create_connection((target.address, target.port), timeout=_left(deadline))
        try:
            if target.scheme == "https":
                sock.settimeout(_left(deadline))  # CPython bounds the whole handshake by it
                sock = _tls_context().wrap_socket(sock, server_hostname=target.host)
            sock.settimeout(_left(deadline))
            sock.sendall(_request(target, body, headers))  # bounded as a whole since Python 3.5
            status = _read_status(sock, deadline)
        finally:
            sock.close()
    except (_TimeUp, TimeoutError, OSError) as error:
        if isinstance(error, ssl.SSLError) and not isinstance(error, ssl.SSLZeroReturnError):
            return Answer(status=None, failure=f"the TLS connection failed ({type(error).__name__})")
        # One message for every way of not answering: telling a refused connection from a silent
        # one would make the test route a port scanner.
        return Answer(status=None, failure=f"no answer within {timeout:.1f} s, or the connection was refused",
                      unreachable=True)
    if status is None:
        return Answer(status=None, failure="the answer was not HTTP")
    slow = time.monotonic() - started > timeout * SLOW_SHARE
    delivered = 200 <= status < 300
    return Answer(status=status, unreachable=slow and not delivered)
