"""Create, cancel and delete when storage or SQS misbehave (issue 12): a stored batch is
answered 200 and still runs; a write conflict is 503 with Retry-After, never 429 or 409."""

from __future__ import annotations

import json

import pytest
from freeinference_batch.batches import dispatch, operations
from freeinference_batch.ops import schedules
from freeinference_batch.store.batch_table import BatchTable
from freeinference_batch.store.dynamo import TransactionConflict, TransactionFailed

from tests.conftest import capture_answers, sample_request

pytestmark = pytest.mark.usefixtures("one_worker_thread")


def queued_messages(harness) -> int:
    from freeinference_batch.core import aws

    total = 0
    for url in harness.queues.values():
        attributes = aws.sqs().get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
        total += int(attributes["Attributes"]["ApproximateNumberOfMessages"])
    return total


def failing_once(monkeypatch, module, name: str, error: Exception) -> list[int]:
    calls: list[int] = []
    original = getattr(module, name)

    def once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise error
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, once)
    return calls


# ---- dispatch fails after the batch is stored ----------------------------------------------------


def test_create_answers_200_when_dispatch_fails_and_the_sweep_starts_the_batch(harness, monkeypatch):
    # Given SQS refusing the create's first messages
    failing_once(monkeypatch, dispatch, "send", RuntimeError("SQS is down"))
    # When a batch is created
    status, batch = harness.call("POST", "/v1/batches", {"requests": [sample_request(f"q-{i}") for i in range(3)]})
    # Then it is answered 200 (it is stored), with nothing on the queues yet
    assert status == 200, batch
    assert harness.batch(batch["id"])["status"] == "validating"
    assert queued_messages(harness) == 0
    # And the next sweep tick sends its first messages, without waiting for the dispatch lease
    assert schedules.sweep(harness.settings)["resent"] >= 1
    assert queued_messages(harness) >= 1
    # And the batch runs to completion
    final = harness.run_to_final(batch["id"])
    assert final["status"] == "completed" and final["request_counts"]["completed"] == 3, final


def test_when_even_marking_the_chains_fails_the_dispatch_lease_recovers_the_batch(harness, monkeypatch):
    failing_once(monkeypatch, dispatch, "send", RuntimeError("SQS is down"))
    failing_once(monkeypatch, BatchTable, "set_lane_lease", RuntimeError("DynamoDB is down"))
    status, batch = harness.call("POST", "/v1/batches", {"requests": [sample_request("q-0")]})
    assert status == 200, batch
    # Not due yet: the lease set at create still runs
    assert schedules.sweep(harness.settings)["resent"] == 0
    harness.advance_clock(harness.settings.batch_dispatch_lease_seconds + 1)
    assert schedules.sweep(harness.settings)["resent"] == 1
    assert harness.run_to_final(batch["id"])["status"] == "completed"


# ---- conflicts are 503 with Retry-After -------------------------------------------------------


def conflict(*_args, **_kwargs):
    raise TransactionConflict(["TransactionConflict", "None"])


def test_a_create_conflict_is_503_with_retry_after_and_changes_nothing(harness, monkeypatch):
    harness.configure(BATCH_MAX_UNFINISHED=1)
    answers = capture_answers(harness)
    monkeypatch.setattr(operations, "transact", conflict)
    status, body = harness.call("POST", "/v1/batches", {"requests": [sample_request("q-0")]})
    assert status == 503, body
    assert body["error"]["code"] == "service_unavailable" and "try again" in body["error"]["message"].lower()
    assert int(answers[-1]["headers"]["Retry-After"]) >= 1
    # Nothing stored, and the account's one unfinished slot is still free
    monkeypatch.undo()
    assert harness.call("GET", "/v1/batches")[1]["data"] == []
    assert harness.call("POST", "/v1/batches", {"requests": [sample_request("q-0")]})[0] == 200
    assert harness.call("POST", "/v1/batches", {"requests": [sample_request("q-0")]})[0] == 429


def test_a_failed_condition_other_than_the_limit_is_not_reported_as_the_limit(harness, monkeypatch):
    def meta_condition(*_args, **_kwargs):
        raise TransactionFailed(["ConditionalCheckFailed", "None"])

    monkeypatch.setattr(operations, "transact", meta_condition)
    status, body = harness.call("POST", "/v1/batches", {"requests": [sample_request("q-0")]})
    assert status == 503 and "unfinished" not in body["error"]["message"], body


def test_a_create_whose_commit_answer_was_lost_and_retried_keeps_its_batch(harness, monkeypatch):
    # Given a transaction that commits, but whose answer is lost, so that it is sent again (as
    # botocore does after a 5xx or a reset connection) and fails its own conditions
    real_transact = operations.transact

    def committed_then_retried(elements, **kwargs):
        real_transact(elements, **kwargs)
        raise TransactionFailed(["ConditionalCheckFailed", "ConditionalCheckFailed"])

    monkeypatch.setattr(operations, "transact", committed_then_retried)
    harness.configure(BATCH_MAX_UNFINISHED=1)
    # When the batch is created
    status, batch = harness.call("POST", "/v1/batches", {"requests": [sample_request("q-0")]})
    monkeypatch.setattr(operations, "transact", real_transact)
    # Then it is answered as created, it is there, it holds the account's one unfinished slot,
    # and it runs
    assert status == 200, batch
    assert harness.call("GET", f"/v1/batches/{batch['id']}")[0] == 200
    assert harness.call("POST", "/v1/batches", {"requests": [sample_request("q-1")]})[0] == 429
    assert harness.run_to_final(batch["id"])["status"] == "completed"
    assert harness.call("POST", "/v1/batches", {"requests": [sample_request("q-1")]})[0] == 200


@pytest.mark.parametrize("method,suffix", [("POST", "/cancel"), ("DELETE", "")])
def test_cancel_and_delete_conflicts_are_503_with_retry_after(harness, monkeypatch, method, suffix):
    batch = harness.create([sample_request("q-0")])
    answers = capture_answers(harness)
    monkeypatch.setattr(operations, "transact", conflict)
    status, body = harness.call(method, f"/v1/batches/{batch['id']}{suffix}")
    assert status == 503, body
    assert answers[-1]["headers"]["Retry-After"] == "1"
    monkeypatch.undo()
    assert harness.batch(batch["id"])["status"] == "validating"


def test_transact_reports_lasting_conflicts_as_transaction_conflict(monkeypatch):
    from botocore.exceptions import ClientError
    from freeinference_batch.core import aws
    from freeinference_batch.store import dynamo

    class Conflicting:
        calls = 0

        def transact_write_items(self, TransactItems):
            self.calls += 1
            raise ClientError({"Error": {"Code": "TransactionCanceledException", "Message": "x"},
                               "CancellationReasons": [{"Code": "TransactionConflict"}, {"Code": "None"}]},
                              "TransactWriteItems")

    fake = Conflicting()
    monkeypatch.setattr(aws, "dynamodb", lambda: fake)
    monkeypatch.setattr(dynamo.time, "sleep", lambda _s: None)
    with pytest.raises(TransactionConflict) as raised:
        dynamo.transact([{}], attempts=3)
    assert fake.calls == 3 and isinstance(raised.value, TransactionFailed)
    assert json.dumps(raised.value.codes) == '["TransactionConflict", "None"]'


# ---- AWS errors that outlast botocore's retries -------------------------------------------------


def aws_error(code: str, status: int):
    from botocore.exceptions import ClientError

    def failing(*_args, **_kwargs):
        raise ClientError({"Error": {"Code": code, "Message": "x"}, "ResponseMetadata": {"HTTPStatusCode": status}},
                          "Query")

    return failing


@pytest.mark.parametrize("code,status", [("ThrottlingException", 400), ("ProvisionedThroughputExceededException", 400),
                                         ("InternalServerError", 500), ("TransactionConflictException", 400)])
def test_an_aws_error_that_outlasts_the_retries_is_503_with_retry_after(harness, monkeypatch, code, status):
    answers = capture_answers(harness)
    monkeypatch.setattr(BatchTable, "list_owner", aws_error(code, status))
    status_code, body = harness.call("GET", "/v1/batches")
    assert status_code == 503, body
    assert body["error"]["code"] == "service_unavailable" and "retry" in body["error"]["message"].lower()
    assert code not in body["error"]["message"]  # AWS's words stay in our logs
    assert int(answers[-1]["headers"]["Retry-After"]) >= 1


def test_a_broken_connection_to_aws_is_503(harness, monkeypatch):
    from botocore.exceptions import EndpointConnectionError

    def unreachable(*_args, **_kwargs):
        raise EndpointConnectionError(endpoint_url="https://dynamodb.us-east-1.amazonaws.com")

    monkeypatch.setattr(BatchTable, "list_owner", unreachable)
    assert harness.call("GET", "/v1/batches")[0] == 503


def test_an_aws_error_that_is_our_own_mistake_stays_a_500(harness, monkeypatch):
    monkeypatch.setattr(BatchTable, "list_owner", aws_error("ValidationException", 400))
    status, body = harness.call("GET", "/v1/batches")
    assert status == 500 and body["error"]["code"] == "internal_error", body


def test_retries_stop_in_time_to_answer_503_before_the_invocation_ends(harness, monkeypatch):
    # Given DynamoDB throttling every call for good, each answer asking for 1 s before a retry
    # (x-amz-retry-after): botocore alone sleeps at least 1 s before each of its 4 retries
    import time

    from botocore.awsrequest import AWSResponse
    from freeinference_batch.core import aws
    from freeinference_batch_local.handlers import LambdaContext
    from moto.core.botocore_stubber import MockRawResponse

    attempts: list[float] = []
    throttle = json.dumps({"__type": "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
                           "message": "Rate of requests exceeds the allowed throughput"}).encode()

    def throttled(request, **_):
        attempts.append(time.monotonic())
        return AWSResponse(request.url, 400, {"Content-Type": "application/x-amz-json-1.0",
                                              "x-amz-retry-after": "1000"}, MockRawResponse(throttle))

    events = aws.dynamodb().meta.events
    events.register_first("before-send.dynamodb", throttled)
    # And an invocation with 4.5 s left
    monkeypatch.setattr("tests.conftest.LambdaContext", lambda name, memory, _timeout: LambdaContext(name, memory, 4.5))
    answers = capture_answers(harness)
    try:
        started = time.monotonic()
        status, body = harness.call("GET", "/v1/batches")
        elapsed = time.monotonic() - started
    finally:
        events.unregister("before-send.dynamodb", throttled)
    # Then it retries while a retry can end in time, then answers 503 with Retry-After in the
    # spec's error shape, with 2 s still left (not after botocore's 4+ s of retries)
    assert status == 503, body
    assert body["error"]["code"] == "service_unavailable" and "retry" in body["error"]["message"].lower()
    assert int(answers[-1]["headers"]["Retry-After"]) >= 1
    assert len(attempts) >= 2, attempts
    assert elapsed < 2.5, elapsed
