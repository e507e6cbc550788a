"""What the service's tests on moto share across modules: API calls built and checked (request
lines with a field changed or dropped, error answers checked and every mismatch collected, the
spec's batch object), the schedules called as EventBridge would, a model queue's messages taken
or lost, and completed requests stored as the worker stores them."""

from __future__ import annotations

import json
import re
from typing import Any

from freeinference_batch import accounts
from freeinference_batch.core import aws
from freeinference_batch.store.batch_keys import request_key
from freeinference_batch.store.batch_table import BatchTable
from freeinference_batch.store.dynamo import apply_update, update_element
from freeinference_batch_local.handlers import LambdaContext, load_handler, repo_root

from tests.conftest import sample_request

EVENTS = repo_root() / "events"


# ---- schedules, queues and stored results --------------------------------------------------------


def run_schedule(name: str) -> dict:
    """Call `<name>_handler` with events/schedule-<name>.json, as EventBridge would."""
    event = json.loads((EVENTS / f"schedule-{name}.json").read_text())
    assert event["detail-type"] == "Scheduled Event"
    handler = load_handler("schedules", f"{name}_handler")
    return handler(event, LambdaContext(f"{name.capitalize()}Function", 256, 60))


def take_messages(harness, model: str = "glm-5.3-flash") -> list[dict]:
    """Receive every visible message of a model's queue (they stay in flight, unprocessed)."""
    sqs, url = aws.sqs(), harness.queues[model]
    taken: list[dict] = []
    while True:
        got = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"], MessageAttributeNames=["All"]
        ).get("Messages", [])
        if not got:
            return taken
        taken.extend(got)


def lose_messages(harness, model: str = "glm-5.3-flash") -> int:
    """Messages lost on the way (a crash between send and receive): gone from the queue."""
    taken = take_messages(harness, model)
    for message in taken:
        aws.sqs().delete_message(QueueUrl=harness.queues[model], ReceiptHandle=message["ReceiptHandle"])
    return len(taken)


def position_of(message: dict) -> int:
    return json.loads(message["Body"])["position"]


def completion(content: str) -> dict:
    return {"id": "chatcmpl-x", "object": "chat.completion", "model": "glm-5.3-flash",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12}}


def store_completed(harness, batch_id: str, position: int, body: dict) -> None:
    """A completed request, stored the way the worker stores one (inline or in S3 by size)."""
    table = BatchTable(harness.settings)
    response = {"status_code": 200, "request_id": f"req_{position}", "body": body}
    attributes = table.response_attributes(batch_id, position, "a-claim-token", response)
    assert apply_update(update_element(table.name, request_key(batch_id, position),
                                       "SET #status = :completed, " + ", ".join(f"{a} = :{a}" for a in attributes),
                                       "attribute_not_exists(pk)", {"#status": "status"},
                                       completed="completed", **attributes))


# ---- API calls and answers -----------------------------------------------------------------------

# The batch object of the spec's "Create a batch" answer: every field, in the spec's order.
SPEC_BATCH_FIELDS = [
    "id",
    "object",
    "endpoint",
    "errors",
    "input_file_id",
    "completion_window",
    "status",
    "output_file_id",
    "error_file_id",
    "created_at",
    "in_progress_at",
    "expires_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
    "request_counts",
    "metadata",
    "cost_usd",
    "error",
]
# The batch object as we answer it: the spec's fields, then ours beyond them (issue 33: `retry_of`,
# `waiting`), documented as additions to it.
BATCH_FIELDS = [*SPEC_BATCH_FIELDS, "retry_of", "waiting"]
WAITING_REASONS = {"batch_access", "concurrency", "model_busy", "daily_quota"}
ALWAYS_NULL = ("output_file_id", "error_file_id", "finalizing_at")
TIMESTAMPS = ("in_progress_at", "completed_at", "failed_at", "expired_at", "cancelling_at", "cancelled_at")
ERROR_FIELDS = {"message", "type", "code", "param"}
DROP = object()  # `req(field=DROP)`, `body_with(field=DROP)`: the field left out


def req(custom_id: Any = "q-0", **changes: Any) -> dict:
    """A valid request line, with fields replaced (`body=...`) or removed (`field=DROP`)."""
    line = sample_request(custom_id)
    if custom_id is DROP:
        del line["custom_id"]
    for name, value in changes.items():
        if value is DROP:
            line.pop(name, None)
        else:
            line[name] = value
    return line


def body_with(**changes: Any) -> dict:
    body = {"model": "glm-5.3-flash", "messages": [{"role": "user", "content": "Say hello."}]}
    for name, value in changes.items():
        if value is DROP:
            body.pop(name, None)
        else:
            body[name] = value
    return body


class Checker:
    """Calls the API through the harness, never accepting a 5xx, and collects every mismatch."""

    def __init__(self, harness) -> None:
        self.harness = harness
        self.problems: list[str] = []

    def call(self, method: str, path: str, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
        status, answer = self.harness.call(method, path, body, **kwargs)
        assert status < 500, f"{method} {path} -> {status} {answer}"
        return status, answer

    def expect(
        self,
        label: str,
        status: int,
        method: str,
        path: str,
        body: Any = None,
        *,
        contains: tuple[str, ...] = (),
        equals: str | None = None,
        **kwargs: Any,
    ) -> dict | None:
        got, answer = self.call(method, path, body, **kwargs)
        if got != status:
            self.problems.append(f"{label}: expected {status}, got {got}: {answer}")
            return None
        error = answer.get("error") if isinstance(answer, dict) else None
        if not isinstance(error, dict) or set(error) != ERROR_FIELDS or not isinstance(error["message"], str):
            self.problems.append(f"{label}: error body is not {{'error': {sorted(ERROR_FIELDS)}}}: {answer}")
            return None
        message = error["message"]
        if equals is not None and message != equals:
            self.problems.append(f"{label}: message {message!r} != {equals!r}")
        missing = [fragment for fragment in contains if fragment.lower() not in message.lower()]
        if missing:
            self.problems.append(f"{label}: message {message!r} does not mention {missing}")
        return error

    def create_error(
        self, label: str, status: int, document: Any = None, *, raw: bytes | None = None, **kwargs: Any
    ) -> dict | None:
        return self.expect(label, status, "POST", "/v1/batches", document, raw=raw, **kwargs)

    def done(self) -> None:
        assert not self.problems, "\n".join(self.problems)


def list_all(harness, key: str | None = None) -> list[dict]:
    status, page = harness.call("GET", "/v1/batches?limit=100", key=key)
    assert status == 200, page
    return page["data"]


def other_key(harness, account: str, tier: str = "internal", **kwargs: Any) -> str:
    return accounts.create_key(harness.settings, account, tier=tier, **kwargs)


def assert_batch_object(batch: dict) -> None:
    assert list(batch) == BATCH_FIELDS, sorted(set(batch) ^ set(BATCH_FIELDS))
    assert re.fullmatch(r"batch_[0-9a-f]{32}", batch["id"]), batch["id"]
    assert batch["object"] == "batch"
    assert batch["endpoint"] == "/v1/chat/completions"
    for name in ALWAYS_NULL:
        assert batch[name] is None, name
    # An inline batch's file fields are null (the spec); a file batch names its file, and its
    # errors are OpenAI's list or null.
    if batch["input_file_id"] is None:
        assert batch["errors"] is None
    else:
        assert re.fullmatch(r"file-[0-9a-f]{32}", batch["input_file_id"]), batch["input_file_id"]
        errors = batch["errors"]
        assert errors is None or (errors["object"] == "list" and all(
            set(e) == {"code", "message", "param", "line"} for e in errors["data"])), errors
    assert isinstance(batch["created_at"], int) and isinstance(batch["expires_at"], int)
    for name in TIMESTAMPS:
        assert batch[name] is None or isinstance(batch[name], int), (name, batch[name])
    assert set(batch["request_counts"]) == {"total", "completed", "failed"}
    assert all(isinstance(v, int) for v in batch["request_counts"].values())
    assert isinstance(batch["cost_usd"], float)
    assert batch["metadata"] is None or all(isinstance(v, str) for v in batch["metadata"].values())
    assert batch["retry_of"] is None or re.fullmatch(r"batch_[0-9a-f]{32}", batch["retry_of"]), batch["retry_of"]
    waiting = batch["waiting"]
    assert waiting is None or (set(waiting) == {"reason", "message", "since"} and waiting["reason"] in WAITING_REASONS
                               and waiting["message"] and isinstance(waiting["since"], int)), waiting
