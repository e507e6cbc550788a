"""Webhooks and status events end to end, on one local stack of this module: endpoints managed
through the `openai` package's `client.webhooks`, deliveries to receivers on loopback verified by
its `webhooks.unwrap`, retries, a hanging endpoint, and the EventBridge events a rule routes to
an SQS queue."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import boto3
import openai
import pytest
from conftest import SHORT_TIMINGS, Api, StackProcess, launch_stack, wait_for

# Short enough to see retries and a give-up within a test; the rest as deployed.
WEBHOOK_TIMINGS = {
    "WEBHOOK_RETRY_BASE_SECONDS": "0.5",
    "WEBHOOK_RETRY_MAX_SECONDS": "1",
    "WEBHOOK_RETRY_WINDOW_SECONDS": "30",
    "WEBHOOK_TIMEOUT_SECONDS": "4",
    # The tests below test an endpoint twice in a row; the interval's own test is on moto.
    "WEBHOOK_TEST_INTERVAL_SECONDS": "0",
}


class Receiver:
    """An HTTP server on loopback recording every POST; `answers` are the statuses it gives, in
    turn (the last one repeats); `hang` makes it hold every request for that many seconds."""

    def __init__(self, answers: tuple[int, ...] = (200,), hang: float = 0.0) -> None:
        self.answers, self.hang = list(answers), hang
        self.received: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver._lock:
                    receiver.received.append({"headers": dict(self.headers), "body": body, "at": time.monotonic()})
                    status = receiver.answers.pop(0) if len(receiver.answers) > 1 else receiver.answers[0]
                if receiver.hang:
                    time.sleep(receiver.hang)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"

    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            return [json.loads(r["body"]) for r in self.received]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def hooks_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackProcess]:
    stack = launch_stack(tmp_path_factory.mktemp("webhooks"), **SHORT_TIMINGS, **WEBHOOK_TIMINGS)
    try:
        yield stack
    finally:
        stack.stop()
        print(stack.stderr_text()[-20000:])  # pytest shows it when a test fails


@pytest.fixture
def receivers() -> Iterator[list[Receiver]]:
    made: list[Receiver] = []
    yield made
    for receiver in made:
        receiver.close()


def sdk(stack: StackProcess, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url, api_key=key or stack.key, max_retries=0)


def aws_client(stack: StackProcess, service: str) -> Any:
    state = json.loads(stack.state_file.read_text())
    return boto3.client(service, endpoint_url=state["env"]["AWS_ENDPOINT_URL"], region_name="us-east-1",
                        aws_access_key_id="test", aws_secret_access_key="test")


def one_request_batch(api: Api, n: int = 1) -> dict:
    body = {"model": "glm-5.3-flash", "messages": [{"role": "user", "content": "hi"}]}
    items = [{"custom_id": f"r-{i}", "body": body} for i in range(n)]
    answer = api.create_batch(items)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_sdk_endpoints_get_verified_batch_events_and_eventbridge_routes_them(hooks_stack, receivers) -> None:
    # An EventBridge rule with an SQS target, as an operator would route the events.
    sqs, events = aws_client(hooks_stack, "sqs"), aws_client(hooks_stack, "events")
    queue_url = sqs.create_queue(QueueName="status-changes")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    events.put_rule(Name="batch-status", EventPattern=json.dumps({"source": ["freeinference.batch"],
                                                                   "detail-type": ["Batch Status Change"]}))
    events.put_targets(Rule="batch-status", Targets=[{"Id": "queue", "Arn": queue_arn}])

    receiver = Receiver()
    receivers.append(receiver)
    client = sdk(hooks_stack)
    assert client.webhooks.event_types.list().data == ["batch.completed", "batch.failed", "batch.expired",
                                                       "batch.cancelled"]
    endpoint = client.webhooks.create(url=receiver.url, name="mine", event_types=["batch.completed", "batch.cancelled"])
    assert endpoint.signing_secret.startswith("whsec_")
    assert endpoint.signing_secret_hint and endpoint.signing_secret not in json.dumps(
        client.webhooks.retrieve(endpoint.id).to_dict())
    assert [e.id for e in client.webhooks.list()] == [endpoint.id]
    assert client.webhooks.update(endpoint.id, name="renamed").name == "renamed"

    api = hooks_stack.api()
    completed = one_request_batch(api)
    api.wait_for_status(completed["id"], "completed")
    cancelled = one_request_batch(api, 200)
    assert api.post(f"/batches/{cancelled['id']}/cancel").status_code == 200
    api.wait_for_status(cancelled["id"], "cancelled", timeout=60)

    verifier = openai.OpenAI(api_key="unused", webhook_secret=endpoint.signing_secret)
    wanted = {("batch.completed", completed["id"]), ("batch.cancelled", cancelled["id"])}
    wait_for(lambda: wanted <= {(e["type"], e["data"]["id"]) for e in receiver.events()}, timeout=30)
    for record in receiver.received:
        event = verifier.webhooks.unwrap(record["body"], record["headers"])
        assert event.object == "event" and event.id.startswith("evt_") and event.created_at > 0

    # Both batches' status changes reached the rule's queue.
    seen: list[dict] = []

    def both_final() -> bool:
        for message in sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get("Messages", []):
            seen.append(json.loads(message["Body"]))
        return {(e["detail"]["batch_id"], e["detail"]["status"]) for e in seen} >= {
            (completed["id"], "completed"), (cancelled["id"], "cancelled")}

    wait_for(both_final, timeout=30)
    final = next(e for e in seen if e["detail"]["status"] == "completed")
    assert final["source"] == "freeinference.batch" and final["detail-type"] == "Batch Status Change"
    assert final["detail"]["account_id"] == "dev" and final["detail"]["request_counts"]["completed"] == 1
    assert set(final["detail"]) == {"batch_id", "account_id", "status", "previous_status", "request_counts",
                                    "cost_usd", "created_at", "metadata", "retry_of", "waiting"}
    client.webhooks.delete(endpoint.id)


def test_a_receiver_answering_500_twice_gets_the_same_id_a_third_time_and_no_more(hooks_stack, receivers) -> None:
    receiver = Receiver(answers=(500, 500, 204))
    receivers.append(receiver)
    client = sdk(hooks_stack)
    endpoint = client.webhooks.create(url=receiver.url, name="flaky", event_types=["batch.completed"])
    api = hooks_stack.api()
    batch = one_request_batch(api)
    api.wait_for_status(batch["id"], "completed")
    wait_for(lambda: len(receiver.received) >= 3, timeout=30)
    ids = {r["headers"]["webhook-id"] for r in receiver.received}
    assert len(ids) == 1
    # Attempts are re-signed: each carries its own timestamp, and verifies.
    verifier = openai.OpenAI(api_key="unused", webhook_secret=endpoint.signing_secret)
    for record in receiver.received:
        verifier.webhooks.unwrap(record["body"], record["headers"])
    # No more: wait longer than the longest retry delay (1 s) plus a poll, then count again.
    settled = time.monotonic() + 4
    wait_for(lambda: time.monotonic() > settled, timeout=10)
    assert len(receiver.received) == 3
    client.webhooks.delete(endpoint.id)


def test_a_hanging_endpoint_does_not_delay_another_accounts_delivery(hooks_stack, receivers) -> None:
    hanging, healthy = Receiver(hang=6), Receiver()
    receivers.extend([hanging, healthy])
    other_key = hooks_stack.create_key("webhooks-other", tier="internal")
    slow = sdk(hooks_stack).webhooks.create(url=hanging.url, name="hangs", event_types=["batch.completed"])
    fast = sdk(hooks_stack, other_key).webhooks.create(url=healthy.url, name="fine", event_types=["batch.completed"])
    # Several events for the hanging endpoint first, then one for the healthy one.
    api, other = hooks_stack.api(), hooks_stack.api(other_key)
    slow_batches = [one_request_batch(api) for _ in range(3)]
    for batch in slow_batches:
        api.wait_for_status(batch["id"], "completed")
    wait_for(lambda: hanging.received, timeout=20)
    batch = one_request_batch(other)
    finished = other.wait_for_status(batch["id"], "completed")
    assert finished["completed_at"]
    done_at = time.monotonic()
    wait_for(lambda: healthy.received, timeout=20)
    assert healthy.received[0]["at"] - done_at < 4, "the healthy endpoint waited behind the hanging one"
    sdk(hooks_stack).webhooks.delete(slow.id)
    sdk(hooks_stack, other_key).webhooks.delete(fast.id)


def test_endpoint_rules_refusals_limits_and_other_accounts(hooks_stack, receivers) -> None:
    client = sdk(hooks_stack)
    with pytest.raises(openai.BadRequestError, match="private address"):
        client.webhooks.create(url="https://10.0.0.1/hook", name="x", event_types=["batch.completed"])
    with pytest.raises(openai.BadRequestError, match="https"):
        client.webhooks.create(url="http://example.com/hook", name="x", event_types=["batch.completed"])
    with pytest.raises(openai.BadRequestError, match=r"Unsupported event types: response\.completed"):
        client.webhooks.create(url="http://127.0.0.1:9/h", name="x", event_types=["response.completed"])
    receiver = Receiver()
    receivers.append(receiver)
    made = [client.webhooks.create(url=receiver.url, name=f"n{i}", event_types=["batch.failed"]) for i in range(5)]
    with pytest.raises(openai.BadRequestError, match="at most 5"):
        client.webhooks.create(url=receiver.url, name="sixth", event_types=["batch.failed"])
    other = sdk(hooks_stack, hooks_stack.create_key("webhooks-stranger", tier="internal"))
    with pytest.raises(openai.NotFoundError):
        other.webhooks.retrieve(made[0].id)
    with pytest.raises(openai.PermissionDeniedError):
        sdk(hooks_stack, hooks_stack.create_key("webhooks-standard")).webhooks.list()

    # test: a signed test delivery; rotation keeps the old secret signing for 24 h on request.
    result = client.webhooks.test(made[0].id, event_type="batch.completed")
    assert result.status_code == 200 and result.webhook_endpoint_id == made[0].id
    rotated = client.webhooks.rotate_secret(made[0].id, keep_old_secret_active_for_24_hours=True)
    assert rotated.signing_secret != made[0].signing_secret
    client.webhooks.test(made[0].id, event_type="batch.failed")
    last = receiver.received[-1]
    for secret in (made[0].signing_secret, rotated.signing_secret):
        openai.OpenAI(api_key="unused", webhook_secret=secret).webhooks.unwrap(last["body"], last["headers"])
    for endpoint in made:
        assert client.webhooks.delete(endpoint.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        client.webhooks.retrieve(made[0].id)


class Tarpit:
    """A receiver on loopback that reads each request, then trickles an answer one byte a second
    (well inside every per-read timeout, never done within WEBHOOK_TIMEOUT_SECONDS' 4 s)."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.connections = 0
        self.closed = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}/tarpit?token=t"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.recv(65536)
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n":
                if self.closed.wait(1.0):
                    return
                conn.sendall(bytes([byte]))

    def close(self) -> None:
        self.closed.set()
        self.server.close()


def _latencies(stack: StackProcess, key: str, receiver: Receiver, n: int) -> list[float]:
    """n batches of the account, one after another: how long after each one completed its event
    reached the receiver (seconds, against the batch's completed_at)."""
    api, seen, latencies = stack.api(key), len(receiver.received), []
    for _ in range(n):
        finished = api.wait_for_status(one_request_batch(api)["id"], "completed")
        wait_for(lambda seen=seen: len(receiver.received) > seen, timeout=90)
        seen = len(receiver.received)
        arrived = time.time() - (time.monotonic() - receiver.received[-1]["at"])
        latencies.append(round(arrived - finished["completed_at"], 1))
    return latencies


def test_one_accounts_tarpits_do_not_hold_up_another_accounts_events(hooks_stack, receivers) -> None:
    """Fair deliveries (issue 31): one account's five endpoints trickle their answers (a byte a
    second, past the 4 s deadline here) while its events keep coming; another account's receiver
    still gets each of its events within seconds. Measured (2 cores shared with other work; the
    batch's completed_at is whole seconds, so each figure may be up to 1 s high): without the
    tarpits 2.0, 1.3, 1.6 s after the batch completed, with them 1.6, 2.4, 1.8 s; on the code
    before issue 31, 2.0, 1.2, 1.5 s and 36.1, 6.3, 1.5 s (this test fails there). The issue's
    bound is 60 s. The test takes about 16 s on the module's stack (bench/README.md)."""
    healthy = Receiver()
    receivers.append(healthy)
    other_key = hooks_stack.create_key("fair-other", tier="internal")
    fine = sdk(hooks_stack, other_key).webhooks.create(url=healthy.url, name="fine", event_types=["batch.completed"])
    quiet = _latencies(hooks_stack, other_key, healthy, 3)

    tarpit_key = hooks_stack.create_key("fair-tarpits", tier="internal")
    tarpits = [Tarpit() for _ in range(5)]
    made = [sdk(hooks_stack, tarpit_key).webhooks.create(url=t.url, name=f"tarpit {i}", event_types=["batch.completed"])
            for i, t in enumerate(tarpits)]
    try:
        tarpit_api = hooks_stack.api(tarpit_key)
        for _ in range(12):  # 60 deliveries, retried for the 30 s window: more than 10 environments hold
            one_request_batch(tarpit_api)
        wait_for(lambda: all(t.connections for t in tarpits), timeout=60)
        loaded = _latencies(hooks_stack, other_key, healthy, 3)
        print(f"another account's event latency (s): without tarpits {quiet}, with five tarpits {loaded}")
        assert max(loaded) < 60, loaded
        assert max(loaded) < max(quiet) + 10, (quiet, loaded)
    finally:
        for endpoint in made:
            sdk(hooks_stack, tarpit_key).webhooks.delete(endpoint.id)
        for tarpit in tarpits:
            tarpit.close()
        sdk(hooks_stack, other_key).webhooks.delete(fine.id)


# AWS's bad days (README "AWS's bad days, on demand"), every DynamoDB and SQS fault at once.
AWS_FAULTS = ("dynamodb.throttle=0.03,dynamodb.error=0.02,dynamodb.lost_answer=0.03,dynamodb.conflict=0.03,"
              "dynamodb.stale_ms=1000,sqs.duplicate=0.1,sqs.lost_answer=0.03")


def test_under_aws_faults_every_event_arrives_under_one_webhook_id(tmp_path, receivers) -> None:
    from collections import defaultdict

    from freeinference_batch_client.client import BatchApiError, BatchClient

    stack = launch_stack(tmp_path, **SHORT_TIMINGS, **WEBHOOK_TIMINGS, LOCAL_AWS_FAULTS=AWS_FAULTS,
                         LOCAL_AWS_FAULTS_SEED="22")
    try:
        receiver = Receiver()
        receivers.append(receiver)
        # Clients that retry what AWS's faults make a 503, as a user's would
        endpoint = openai.OpenAI(base_url=stack.base_url, api_key=stack.key, max_retries=8).webhooks.create(
            url=receiver.url, name="faults", event_types=["batch.completed", "batch.cancelled"])
        client = BatchClient(stack.key, stack.base_url, backoff_base=0.2, max_retries=8)
        body = {"model": "glm-5.3-flash", "messages": [{"role": "user", "content": "hi"}]}
        done = [client.create([{"custom_id": f"r-{i}", "body": body} for i in range(3)]).id for _ in range(4)]
        slow = client.create([{"custom_id": f"s-{i}", "body": {**body, "messages": [
            {"role": "user", "content": "[sim:latency=1] hi"}]}} for i in range(100)]).id

        def cancel() -> bool:
            try:
                return client.cancel(slow).status in ("cancelling", "cancelled")
            except BatchApiError as error:
                if error.status == 503:  # a conflict, nothing changed: again
                    return False
                raise

        wait_for(cancel, timeout=30)
        finals = {batch_id: client.wait(batch_id, poll_interval=0.2, timeout=90).status for batch_id in [*done, slow]}
        assert finals == {**{b: "completed" for b in done}, slow: "cancelled"}

        # Every final status told, none lost
        wanted = {(f"batch.{status}", batch_id) for batch_id, status in finals.items()}
        wait_for(lambda: wanted <= {(e["type"], e["data"]["id"]) for e in receiver.events()}, timeout=60)
        # ...and none told twice but as the same event: one webhook-id per (event, batch), another
        # per event, every delivery verifying
        verifier = openai.OpenAI(api_key="unused", webhook_secret=endpoint.signing_secret)
        ids: dict[tuple[str, str], set[str]] = defaultdict(set)
        for record in receiver.received:
            event = verifier.webhooks.unwrap(record["body"], record["headers"])
            ids[(event.type, event.data.id)].add(record["headers"]["webhook-id"])
        assert set(ids) == wanted
        assert all(len(seen) == 1 for seen in ids.values()), ids
        assert len({i for seen in ids.values() for i in seen}) == len(wanted)
        # And the faults did happen
        injected = json.loads(stack.admin("faults").stdout)
        print("faults injected:", json.dumps(injected, sort_keys=True), "deliveries:", len(receiver.received))
        assert injected["sqs.duplicate"] and injected["dynamodb.lost_answer"] and injected["dynamodb.conflict"]
    finally:
        stack.stop()
        print(stack.stderr_text()[-20000:])
