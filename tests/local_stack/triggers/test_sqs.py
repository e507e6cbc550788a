"""The local SQS event mappings, on a real moto server, with fake handlers."""

from __future__ import annotations

import hashlib
import threading
import time
import uuid

import boto3
import pytest
from freeinference_batch_local.environments import FunctionError
from freeinference_batch_local.handlers import LAMBDA_INVOKE_PAYLOAD_BYTES, invoke_payload_bytes
from freeinference_batch_local.moto.server import MotoServer
from freeinference_batch_local.triggers.sqs import (
    QueuePoller,
    failed_message_ids,
    records_within_invoke_payload,
    sqs_record,
)

from tests.local_stack.waiting import wait_for


@pytest.fixture(scope="module")
def moto_endpoint():
    with MotoServer() as server:
        yield server.endpoint_url


@pytest.fixture
def sqs(moto_endpoint):
    return boto3.client(
        "sqs",
        endpoint_url=moto_endpoint,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )


@pytest.fixture
def queue(sqs):
    url = sqs.create_queue(QueueName=f"q-{uuid.uuid4().hex[:12]}", Attributes={"VisibilityTimeout": "30"})["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    return url, arn


@pytest.fixture
def pollers():
    started: list[QueuePoller] = []
    yield started
    for poller in started:
        poller.stop(timeout=5)


def messages_left(sqs, url) -> int:
    attributes = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesNotVisible"])


def send(sqs, url, bodies):
    for start in range(0, len(bodies), 10):
        sqs.send_message_batch(
            QueueUrl=url,
            Entries=[{"Id": str(i), "MessageBody": body} for i, body in enumerate(bodies[start : start + 10])],
        )


def start_poller(pollers, sqs, queue, handler, **kwargs) -> QueuePoller:
    url, arn = queue
    poller = QueuePoller(name="test", sqs=sqs, queue_url=url, queue_arn=arn, handler=handler, **kwargs)
    pollers.append(poller.start())
    return poller


def test_event_records_are_shaped_as_lambda_builds_them(sqs, queue, pollers):
    # Given a message with a string and a binary attribute
    url, arn = queue
    sqs.send_message(
        QueueUrl=url,
        MessageBody='{"batch_id": "b"}',
        MessageAttributes={
            "kind": {"DataType": "String", "StringValue": "request"},
            "blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01"},
        },
    )
    events = []
    # When the poller invokes the worker
    start_poller(pollers, sqs, queue, lambda event, context: events.append(event) or {"batchItemFailures": []})
    wait_for(lambda: events, what="an invocation")
    # Then the record has every field Lambda sends
    (record,) = events[0]["Records"]
    assert record["body"] == '{"batch_id": "b"}'
    assert record["md5OfBody"] == hashlib.md5(b'{"batch_id": "b"}').hexdigest()
    assert record["eventSource"] == "aws:sqs" and record["eventSourceARN"] == arn
    assert record["awsRegion"] == "us-east-1"
    assert record["messageId"] and record["receiptHandle"]
    assert {"ApproximateReceiveCount", "SentTimestamp", "SenderId", "ApproximateFirstReceiveTimestamp"} <= set(
        record["attributes"]
    )
    assert record["attributes"]["ApproximateReceiveCount"] == "1"
    assert record["messageAttributes"]["kind"] == {
        "stringValue": "request",
        "stringListValues": [],
        "binaryListValues": [],
        "dataType": "String",
    }
    assert record["messageAttributes"]["blob"]["binaryValue"] == "AAE="
    assert list(record)[-3:] == ["eventSource", "eventSourceARN", "awsRegion"]


def test_messages_are_deleted_unless_reported_in_batch_item_failures(sqs, queue, pollers):
    # Given 25 messages, 5 of which the worker reports as failed
    url, _ = queue
    bodies = [f"fail-{i}" if i % 5 == 0 else f"ok-{i}" for i in range(25)]
    send(sqs, url, bodies)
    seen: list[str] = []
    lock = threading.Lock()

    def handler(event, context):
        with lock:
            seen.extend(record["body"] for record in event["Records"])
        return {
            "batchItemFailures": [
                {"itemIdentifier": record["messageId"]}
                for record in event["Records"]
                if record["body"].startswith("fail")
            ]
        }

    # When the poller has run them all
    poller = start_poller(pollers, sqs, queue, handler, batch_size=10, max_concurrency=2)
    wait_for(lambda: len(seen) >= 25, what="all messages")
    poller.pause()
    assert poller.wait_idle(5)
    # Then only the 5 reported messages are left (in flight until their visibility timeout)
    assert sorted(seen) == sorted(bodies)
    assert messages_left(sqs, url) == 5
    stats = poller.stats()
    assert stats["deleted"] == 20 and stats["reported_failures"] == 5 and stats["messages"] == 25


def test_batch_size_is_respected(sqs, queue, pollers):
    url, _ = queue
    send(sqs, url, [str(i) for i in range(9)])
    sizes = []
    poller = start_poller(
        pollers, sqs, queue, lambda event, context: sizes.append(len(event["Records"])), batch_size=2, max_concurrency=1
    )
    wait_for(lambda: sum(sizes) >= 9, what="all messages")
    assert max(sizes) <= 2
    poller.pause()
    assert poller.wait_idle(5)
    assert messages_left(sqs, url) == 0  # a None answer means every record succeeded


def test_concurrency_cap_is_respected(sqs, queue, pollers):
    # Given 24 messages, one per invocation, and a slow worker
    url, _ = queue
    send(sqs, url, [str(i) for i in range(24)])
    lock = threading.Lock()
    running = {"now": 0, "max": 0, "done": 0}

    def handler(event, context):
        with lock:
            running["now"] += 1
            running["max"] = max(running["max"], running["now"])
        time.sleep(0.15)
        with lock:
            running["now"] -= 1
            running["done"] += len(event["Records"])
        return {"batchItemFailures": []}

    # When the mapping allows 3 concurrent invocations
    poller = start_poller(pollers, sqs, queue, handler, batch_size=1, max_concurrency=3)
    wait_for(lambda: running["done"] >= 24, timeout=20, what="all messages")
    # Then never more than 3 ran at once, and the cap was used
    assert running["max"] == 3
    assert poller.stats()["max_in_flight"] == 3


def test_a_raising_worker_deletes_nothing(sqs, queue, pollers, caplog):
    # Given a worker that crashes
    url, _ = queue
    send(sqs, url, [str(i) for i in range(7)])
    calls = []

    def handler(event, context):
        calls.append(len(event["Records"]))
        raise RuntimeError("worker crashed")

    # When it has received every message once
    poller = start_poller(pollers, sqs, queue, handler, batch_size=10, max_concurrency=1)
    wait_for(lambda: sum(calls) >= 7, what="the messages")
    poller.pause()
    assert poller.wait_idle(5)
    # Then all 7 are still in the queue, and the crash was logged
    assert messages_left(sqs, url) == 7
    assert poller.stats()["errors"] >= 1 and poller.stats()["deleted"] == 0
    assert "worker crashed" in caplog.text


def throttle() -> FunctionError:
    return FunctionError("Rate Exceeded.", "TooManyRequestsException")


def test_a_throttled_batch_is_sent_again_with_backoff_and_deleted_once_it_runs(sqs, queue, pollers):
    # Given a function that throttles the first two invocations (its reserved concurrency is busy)
    url, _ = queue
    send(sqs, url, ["a", "b", "c"])
    tries: list[float] = []

    def handler(event, context):
        tries.append(time.monotonic())
        if len(tries) <= 2:
            raise throttle()
        return {}

    # When the poller takes the batch
    poller = start_poller(pollers, sqs, queue, handler, batch_size=10, max_concurrency=1)
    wait_for(lambda: poller.stats()["deleted"] == 3, what="the batch to run")
    # Then the same batch was sent again after growing pauses, not dropped, and then deleted
    assert len(tries) == 3 and tries[2] - tries[1] > tries[1] - tries[0] > 0
    stats = poller.stats()
    assert stats["throttles"] == 2 and stats["errors"] == 0 and stats["receives"] >= 1
    assert messages_left(sqs, url) == 0


def test_a_batch_throttled_past_its_visibility_timeout_comes_back_to_the_queue(sqs, queue, pollers, caplog):
    # Given a function that always throttles, and a queue whose messages hide for 1 s
    url, _ = queue
    send(sqs, url, ["a"])
    received: list[str] = []

    def handler(event, context):
        received.append(event["Records"][0]["receiptHandle"])
        raise throttle()

    # When the poller has tried for longer than the visibility timeout
    poller = start_poller(pollers, sqs, queue, handler, batch_size=10, max_concurrency=1, visibility_timeout=1)
    wait_for(lambda: poller.stats()["errors"] >= 1, what="the poller to give up on the batch")
    poller.pause()
    assert poller.wait_idle(5)
    # Then it gave up within the timeout, deleted nothing, and the message is still in the queue
    assert poller.stats()["throttles"] >= 2 and poller.stats()["deleted"] == 0
    assert messages_left(sqs, url) == 1
    assert "throttled until the batch's visibility timeout" in caplog.text


def test_invalid_item_identifier_fails_the_whole_batch(sqs, queue, pollers):
    url, _ = queue
    send(sqs, url, ["a", "b", "c"])
    calls = []

    def handler(event, context):
        calls.append(len(event["Records"]))
        return {"batchItemFailures": [{"itemIdentifier": "not-a-message-of-this-batch"}]}

    poller = start_poller(pollers, sqs, queue, handler, batch_size=10, max_concurrency=1)
    wait_for(lambda: sum(calls) >= 3, what="the messages")
    poller.pause()
    assert poller.wait_idle(5)
    assert messages_left(sqs, url) == 3


def test_failed_message_ids_follows_lambda_rules():
    ids = ["m1", "m2"]
    assert failed_message_ids(None, ids) == set()
    assert failed_message_ids({}, ids) == set()
    assert failed_message_ids({"batchItemFailures": []}, ids) == set()
    assert failed_message_ids({"batchItemFailures": [{"itemIdentifier": "m2"}]}, ids) == {"m2"}
    assert failed_message_ids({"batchItemFailures": [{"itemIdentifier": ""}]}, ids) is None
    assert failed_message_ids({"batchItemFailures": [{}]}, ids) is None
    assert failed_message_ids({"batchItemFailures": [{"itemIdentifier": "m9"}]}, ids) is None


def test_pause_stops_receiving_and_resume_continues(sqs, queue, pollers):
    url, _ = queue
    seen = []
    poller = start_poller(pollers, sqs, queue, lambda event, context: seen.extend(event["Records"]))
    poller.pause()
    time.sleep(0.1)
    send(sqs, url, ["x", "y"])
    time.sleep(0.3)
    assert seen == [] and messages_left(sqs, url) == 2
    poller.resume()
    wait_for(lambda: len(seen) == 2, what="the messages after resume")


def in_flight(sqs, url) -> int:
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"])
    return int(attributes["Attributes"]["ApproximateNumberOfMessagesNotVisible"])


def test_a_batching_window_gathers_messages_sent_after_the_first_receive(sqs, queue, pollers):
    # Given a mapping with a batch of 7 and a long window, and 3 messages
    url, _ = queue
    events = []
    send(sqs, url, ["a", "b", "c"])
    start_poller(pollers, sqs, queue, lambda event, context: events.append(event), batch_size=7,
                 max_batching_window=20, idle_sleep=0.02)
    # When 4 more arrive once the poller holds the first 3
    wait_for(lambda: in_flight(sqs, url) == 3, what="the first receive")
    assert events == []  # the window is open and the batch not full: nothing invoked yet
    send(sqs, url, ["d", "e", "f", "g"])
    # Then one invocation carries all 7, as soon as the batch is full (not at the window's end)
    wait_for(lambda: events, timeout=10, what="the invocation")
    assert sorted(record["body"] for record in events[0]["Records"]) == list("abcdefg")


def test_a_batching_window_invokes_what_it_has_when_it_ends(sqs, queue, pollers):
    # Given a window of 0.5 s and a batch size it will not reach
    url, _ = queue
    invoked_at = []
    sent_at = time.monotonic()
    send(sqs, url, ["a", "b"])
    start_poller(pollers, sqs, queue, lambda event, context: invoked_at.append((time.monotonic(), event)),
                 batch_size=10, max_batching_window=0.5, idle_sleep=0.02)
    wait_for(lambda: invoked_at, what="the invocation")
    # Then it waited the window out, and invoked with the two it had
    at, event = invoked_at[0]
    assert at - sent_at >= 0.5
    assert len(event["Records"]) == 2


def test_without_a_window_a_batch_is_at_most_10_and_invoked_at_once():
    poller = QueuePoller(name="p", sqs=None, queue_url="u", queue_arn="a", handler=print, batch_size=50)
    assert poller.batch_size == 10 and poller.max_batching_window == 0
    windowed = QueuePoller(name="p", sqs=None, queue_url="u", queue_arn="a", handler=print, batch_size=50,
                           max_batching_window=1)
    assert windowed.batch_size == 50


def test_an_event_never_exceeds_the_6_mb_invoke_payload(sqs, queue, pollers):
    # Given 30 messages of 250 KB (7.5 MB) and a mapping whose batch could take them all
    url, _ = queue
    for start in range(0, 30, 1):
        sqs.send_message(QueueUrl=url, MessageBody=f"{start:03d}" + "x" * (250_000 - 3))
    events = []
    lock = threading.Lock()

    def handler(event, context):
        with lock:
            events.append(event)

    poller = start_poller(pollers, sqs, queue, handler, batch_size=30, max_batching_window=2, idle_sleep=0.02)
    # When every message has been delivered
    wait_for(lambda: sum(len(event["Records"]) for event in events) >= 30, timeout=30, what="all messages")
    poller.pause()
    assert poller.wait_idle(5)
    # Then no event was over 6 MB, so they took more than one invocation, and none was lost
    assert all(invoke_payload_bytes(event) <= LAMBDA_INVOKE_PAYLOAD_BYTES for event in events)
    assert len(events) >= 2
    assert sorted(record["body"][:3] for event in events for record in event["Records"]) == [
        f"{i:03d}" for i in range(30)
    ]
    assert poller.stats()["released_over_payload"] >= 1
    assert messages_left(sqs, url) == 0


def test_records_within_invoke_payload_counts_the_event_json():
    record = {"body": "x" * 1_000_000}
    assert records_within_invoke_payload([record] * 6) == 6
    assert records_within_invoke_payload([record] * 7) == 6
    # A record bigger than the whole payload still goes alone (SQS cannot hold such a message)
    assert records_within_invoke_payload([{"body": "x" * 7_000_000}]) == 1


def test_sqs_record_without_attributes():
    record = sqs_record({"MessageId": "m", "ReceiptHandle": "r", "Body": "b", "MD5OfBody": "x"}, "arn:q")
    assert record["attributes"] == {} and record["messageAttributes"] == {}
    assert record["eventSourceARN"] == "arn:q"


class RefusingVisibility:
    """An SQS client whose ChangeMessageVisibilityBatch answers 200 with every entry in `Failed`
    (a receipt handle gone stale, as after a re-receive)."""

    def change_message_visibility_batch(self, QueueUrl: str, Entries: list[dict]) -> dict:
        return {"Successful": [], "Failed": [{"Id": entry["Id"], "SenderFault": True,
                                              "Code": "ReceiptHandleIsInvalid"} for entry in Entries]}


def test_messages_whose_release_failed_are_counted_apart_from_the_released():
    poller = QueuePoller(name="p", sqs=RefusingVisibility(), queue_url="u", queue_arn="a", handler=print)
    poller._release([{"receiptHandle": f"r{n}"} for n in range(12)])
    assert (poller.stats()["released_over_payload"], poller.stats()["release_failed"]) == (0, 12)

