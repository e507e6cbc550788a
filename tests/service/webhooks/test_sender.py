"""One webhook attempt against receivers that misbehave on purpose (webhooks/sender.py through
delivery.attempt), on loopback without AWS: the attempt's deadline is total, whatever a receiver
trickles; a slow answer that is not a 2xx counts as unreachable; nothing goes through the HTTP
modules X-Ray's tracer patches (they would record the URL, a receiver's token in it)."""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from freeinference_batch.core.settings import Settings
from freeinference_batch.store.webhook_endpoints import EndpointRecord
from freeinference_batch.webhooks import delivery

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


def settings(timeout: float = 1.0) -> Settings:
    return Settings(WEBHOOK_SIGNING_KEY="k" * 32, WEBHOOK_ALLOW_LOOPBACK_HTTP="true",
                    WEBHOOK_LOOPBACK_PORTS="1024-65535", WEBHOOK_TIMEOUT_SECONDS=timeout)


def endpoint(url: str) -> EndpointRecord:
    return EndpointRecord(id="we_1", account_id="a", url=url, name="n", event_types=["batch.completed"],
                          created_at=1, updated_at=1, secret_nonce="00", secret_hint="h")


@pytest.fixture
def receiver() -> Iterator[Callable[[Callable[[socket.socket], None]], str]]:
    """A raw TCP receiver on loopback; each connection's request is read, then `answer(conn)` runs."""
    servers: list[socket.socket] = []

    def start(answer: Callable[[socket.socket], None]) -> str:
        server = socket.create_server(("127.0.0.1", 0))
        servers.append(server)

        def serve() -> None:
            while True:
                try:
                    conn, _ = server.accept()
                except OSError:
                    return
                with conn:
                    conn.recv(65536)
                    with contextlib.suppress(OSError):
                        answer(conn)

        threading.Thread(target=serve, daemon=True).start()
        return f"http://127.0.0.1:{server.getsockname()[1]}/hook?token=secret-token"

    yield start
    for server in servers:
        server.close()


def attempt(url: str, timeout: float = 1.0) -> tuple[delivery.sender.Answer, float]:
    started = time.monotonic()
    answer = delivery.attempt(settings(timeout), endpoint(url), "evt_1", b"{}")
    return answer, time.monotonic() - started


def test_a_receiver_trickling_its_answer_is_cut_off_at_the_total_deadline(receiver) -> None:
    def trickle(conn: socket.socket) -> None:
        for byte in ANSWER:  # a byte every 0.2 s: each read is well inside a 1 s timeout
            conn.sendall(bytes([byte]))
            time.sleep(0.2)

    answer, took = attempt(receiver(trickle))
    assert answer.status is None and answer.unreachable, answer
    assert took < 1.6, f"held {took:.1f} s past a 1 s deadline"


def test_a_slow_answer_that_is_not_a_2xx_counts_as_unreachable_and_a_quick_one_does_not(receiver) -> None:
    def slow_500(conn: socket.socket) -> None:
        time.sleep(0.7)
        conn.sendall(b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n")

    answer, _ = attempt(receiver(slow_500))
    assert answer.status == 500 and answer.unreachable
    answer, _ = attempt(receiver(lambda conn: conn.sendall(b"HTTP/1.1 500 Oops\r\n\r\n")))
    assert answer.status == 500 and not answer.unreachable
    answer, _ = attempt(receiver(lambda conn: conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n" + ANSWER)))
    assert answer.status == 200 and answer.delivered


def test_a_delivery_goes_through_no_module_the_tracer_patches(receiver, monkeypatch) -> None:
    # X-Ray's patches of requests and http.client record each call's URL (its query: a token)
    seen: list[str] = []
    real = http.client.HTTPConnection.putrequest

    def recording(self, method: str, url: str, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(url)
        return real(self, method, url, *args, **kwargs)

    monkeypatch.setattr(http.client.HTTPConnection, "putrequest", recording)
    answer, _ = attempt(receiver(lambda conn: conn.sendall(ANSWER)))
    assert answer.delivered
    assert seen == []
