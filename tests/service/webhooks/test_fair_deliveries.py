"""Webhook work that a user's receiver cannot stretch, on moto (webhooks/delivery.py, endpoints.py,
functions/webhook_delivery/app.py): an account's attempts in flight are capped, a slow 500 marks
it unreachable, a record cut off by the invocation's end backs off with a visibility of its own
(and no thread outlives the invocation), and `/test` is rate-limited per endpoint and bounded in
time."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from freeinference_batch.core import aws, clock
from freeinference_batch.core.schemas import WebhookDeliveryMessage
from freeinference_batch.store.webhook_endpoints import WebhookEndpoints
from freeinference_batch.webhooks import delivery
from freeinference_batch_local.api_gateway.integration import build_event, invoke_integration
from freeinference_batch_local.handlers import LambdaContext, load_handler
from freeinference_batch_local.triggers.sqs import sqs_record

OK = b"HTTP/1.1 204 No Content\r\n\r\n"


@pytest.fixture
def receiver() -> Iterator[Callable[[Callable[[socket.socket], None]], tuple[str, list[float]]]]:
    """A raw TCP receiver on loopback: each request is read, then `answer(conn)` runs; the list
    holds when each request came."""
    servers: list[socket.socket] = []

    def start(answer: Callable[[socket.socket], None]) -> tuple[str, list[float]]:
        server, came = socket.create_server(("127.0.0.1", 0)), []
        servers.append(server)

        def one(conn: socket.socket) -> None:
            with conn:
                conn.recv(65536)
                came.append(time.monotonic())
                with contextlib.suppress(OSError):
                    answer(conn)

        def serve() -> None:
            while True:
                try:
                    conn, _ = server.accept()
                except OSError:
                    return
                threading.Thread(target=one, args=(conn,), daemon=True).start()

        threading.Thread(target=serve, daemon=True).start()
        return f"http://127.0.0.1:{server.getsockname()[1]}/hook", came

    yield start
    for server in servers:
        server.close()


def trickle(conn: socket.socket) -> None:
    for byte in OK * 20:  # a byte every 0.3 s, for long
        conn.sendall(bytes([byte]))
        time.sleep(0.3)


def create_endpoint(harness, url: str) -> str:
    status, created = harness.call("POST", "/v1/webhook_endpoints",
                                   {"url": url, "name": "hook", "event_types": ["batch.completed"]})
    assert status == 200, created
    return created["id"]


def message(harness, endpoint_id: str) -> WebhookDeliveryMessage:
    return WebhookDeliveryMessage(event_id="evt_1", event_type="batch.completed", batch_id="batch_1",
                                  endpoint_id=endpoint_id, account_id="acct-1", created_at=1,
                                  queued_at=clock.now(harness.settings.clock_offset_file))


def test_an_account_has_at_most_its_slots_in_flight(harness, receiver) -> None:
    harness.configure(WEBHOOK_ALLOW_LOOPBACK_HTTP="true", WEBHOOK_ACCOUNT_MAX_IN_FLIGHT=1)
    url, came = receiver(lambda conn: conn.sendall(OK))
    endpoint_id = create_endpoint(harness, url)
    store, now = WebhookEndpoints(harness.settings), clock.now(harness.settings.clock_offset_file)
    # Another environment's attempt (to any of the account's endpoints) holds its one slot
    assert store.claim_slot("acct-1", 1, now, now + 30) == 0
    verdict = delivery.deliver(harness.settings, message(harness, endpoint_id), 1)
    assert verdict.why == "account busy" and verdict.delay and not came, verdict
    # Another account's slots are its own
    assert store.claim_slot("acct-2", 1, now, now + 30) == 0
    # Its lease over, the slot is free again; an attempt frees the slot it took
    harness.advance_clock(31)
    for _ in range(2):
        assert delivery.deliver(harness.settings, message(harness, endpoint_id), 1).done
    assert len(came) == 2


def test_a_500_after_most_of_the_deadline_marks_the_endpoint_unreachable(harness, receiver) -> None:
    harness.configure(WEBHOOK_ALLOW_LOOPBACK_HTTP="true", WEBHOOK_TIMEOUT_SECONDS=1)

    def slow_500(conn: socket.socket) -> None:
        time.sleep(0.7)
        conn.sendall(b"HTTP/1.1 500 Busy\r\n\r\n")

    endpoint_id = create_endpoint(harness, receiver(slow_500)[0])
    verdict = delivery.deliver(harness.settings, message(harness, endpoint_id), 1)
    assert verdict.why == "answered 500" and verdict.delay
    assert WebhookEndpoints(harness.settings).get("acct-1", endpoint_id).unreachable_until


def test_a_record_cut_off_by_the_invocations_end_backs_off_and_leaves_no_thread(harness, receiver, monkeypatch):
    harness.configure(WEBHOOK_ALLOW_LOOPBACK_HTTP="true", WEBHOOK_TIMEOUT_SECONDS=10)
    endpoint_id = create_endpoint(harness, receiver(trickle)[0])
    sqs, queue_url = aws.sqs(), harness.settings.webhook_delivery_queue_url
    sqs.send_message(QueueUrl=queue_url, MessageBody=message(harness, endpoint_id).model_dump_json())
    (received,) = sqs.receive_message(QueueUrl=queue_url, AttributeNames=["All"])["Messages"]
    waits: list[int] = []
    monkeypatch.setattr(delivery.queues, "change_visibility", lambda url, handle, seconds: waits.append(seconds))
    def delivery_threads() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("ThreadPoolExecutor")]

    before = delivery_threads()

    started = time.monotonic()
    # 7 s to live, 5 of them kept to answer: 2 s for the attempt, not the receiver's 10 s deadline
    answer = load_handler("webhook_delivery")({"Records": [sqs_record(received, "arn:aws:sqs:us-east-1:1:q")]},
                                              LambdaContext("webhook_delivery", 256, 7))
    took = time.monotonic() - started
    assert answer == {"batchItemFailures": [{"itemIdentifier": received["MessageId"]}]}
    assert took < 4, f"the invocation took {took:.1f} s"
    # Backed off as any failed attempt (WEBHOOK_RETRY_BASE_SECONDS 30: 15 to 30 s), not left to the
    # queue's fixed 360 s
    assert len(waits) == 1 and 15 <= waits[0] <= 30, waits
    assert delivery_threads() == before, "a delivery thread outlived its invocation"


def call_test(harness, endpoint_id: str) -> tuple[int, dict[str, str], dict]:
    event = build_event(method="POST", target=f"/v1/webhook_endpoints/{endpoint_id}/test",
                        headers=[("authorization", f"Bearer {harness.key}"), ("content-type", "application/json")],
                        body=json.dumps({"event_type": "batch.completed"}).encode(),
                        route_key="POST /v1/webhook_endpoints/{endpoint_id}/test",
                        path_parameters={"endpoint_id": endpoint_id})
    status, headers, body = invoke_integration(harness.api_handler, event, LambdaContext("api", 1769, 29))
    return status, {name.lower(): value for name, value in headers}, json.loads(body)


def test_test_deliveries_are_rate_limited_per_endpoint(harness, receiver) -> None:
    harness.configure(WEBHOOK_ALLOW_LOOPBACK_HTTP="true", WEBHOOK_TEST_INTERVAL_SECONDS=10)
    url, came = receiver(lambda conn: conn.sendall(OK))
    first, second = create_endpoint(harness, url), create_endpoint(harness, url)
    assert call_test(harness, first)[0] == 200
    status, headers, body = call_test(harness, first)
    assert status == 429 and body["error"]["code"] == "webhook_test_rate_limited", body
    assert body["error"]["type"] == "rate_limit_error" and 1 <= int(headers["retry-after"]) <= 10
    assert call_test(harness, second)[0] == 200  # per endpoint
    assert len(came) == 2
    harness.advance_clock(10)
    assert call_test(harness, first)[0] == 200


def test_a_test_delivery_to_a_trickling_receiver_holds_the_api_no_longer_than_its_deadline(harness, receiver):
    harness.configure(WEBHOOK_ALLOW_LOOPBACK_HTTP="true", WEBHOOK_TIMEOUT_SECONDS=1)
    endpoint_id = create_endpoint(harness, receiver(trickle)[0])
    started = time.monotonic()
    status, _, body = call_test(harness, endpoint_id)
    assert status == 400 and body["error"]["code"] == "webhook_test_failed", body
    assert time.monotonic() - started < 2
