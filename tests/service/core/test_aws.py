"""The service's boto3 clients re-send a DynamoDB write that met a transaction, as DynamoDB asks
callers to (botocore does not), and give up after `aws.CONFLICT_ATTEMPTS`."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from botocore.exceptions import ClientError
from freeinference_batch.core import aws

CONFLICT = json.dumps({"__type": "com.amazonaws.dynamodb.v20120810#TransactionConflictException",
                       "message": "Transaction is ongoing for the item"}).encode()
CONDITION = json.dumps({"__type": "com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException",
                        "message": "The conditional request failed"}).encode()


class FakeDynamoDB:
    """Answers the first `failures` requests with `error` (HTTP 400), the rest with `{}`."""

    def __init__(self) -> None:
        self.failures = 0
        self.error = CONFLICT
        self.hangs = 0  # the first `hangs` requests get no answer (until the fake stops)
        self.stopped = threading.Event()
        self.requests: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                fake.requests.append(self.headers.get("X-Amz-Target", ""))
                if len(fake.requests) <= fake.hangs:
                    fake.stopped.wait(60)
                    return
                failing = len(fake.requests) <= fake.failures
                body = fake.error if failing else b"{}"
                self.send_response(400 if failing else 200)
                self.send_header("Content-Type", "application/x-amz-json-1.0")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"


@pytest.fixture
def fake(monkeypatch) -> Iterator[FakeDynamoDB]:
    server = FakeDynamoDB()
    for name, value in {"AWS_ENDPOINT_URL": server.url, "AWS_DEFAULT_REGION": "us-east-1",
                        "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}.items():
        monkeypatch.setenv(name, value)
    aws.reset_clients()
    yield server
    server.stopped.set()
    server.server.shutdown()
    aws.reset_clients()


def update() -> None:
    aws.dynamodb().update_item(TableName="t", Key={"pk": {"S": "a"}}, UpdateExpression="SET n = :one",
                               ExpressionAttributeValues={":one": {"N": "1"}})


def test_a_write_that_met_a_transaction_is_sent_again(fake):
    fake.failures = 3
    update()
    assert len(fake.requests) == 4


def test_conflicts_that_outlast_the_attempts_reach_the_caller(fake):
    fake.failures = 100
    with pytest.raises(ClientError) as raised:
        update()
    assert raised.value.response["Error"]["Code"] == "TransactionConflictException"
    assert len(fake.requests) == aws.CONFLICT_ATTEMPTS


def test_other_errors_are_left_to_botocore(fake):
    fake.error, fake.failures = CONDITION, 100
    with pytest.raises(ClientError) as raised:
        update()
    assert raised.value.response["Error"]["Code"] == "ConditionalCheckFailedException"
    assert len(fake.requests) == 1


def test_an_attempt_that_never_answers_is_cut_and_sent_again(fake, monkeypatch):
    monkeypatch.setattr(aws, "READ_TIMEOUT_SECONDS", 0.5)
    aws.reset_clients()
    fake.hangs = 1
    started = time.monotonic()
    update()
    assert len(fake.requests) == 2 and time.monotonic() - started < 5


def test_under_a_deadline_a_call_whose_attempts_hang_gives_up_before_it(fake, monkeypatch):
    # Given attempts that never answer, cut after 2 s each, within 5 s of an invocation
    monkeypatch.setattr(aws, "READ_TIMEOUT_SECONDS", 2.0)
    aws.reset_clients()
    fake.hangs = 100
    started = time.monotonic()
    # When a call is made, then it stops once another hung attempt would not end in time
    with aws.deadline(5.0), pytest.raises(aws.OutOfTime):
        update()
    assert time.monotonic() - started < 5.0 - aws.ANSWER_RESERVE_SECONDS + 0.5
    assert 1 <= len(fake.requests) < aws.MAX_ATTEMPTS
