"""What the service's tests on moto share across folders: the schedules called as EventBridge
would, a model queue's messages taken or lost, and completed requests stored as the worker
stores them."""

from __future__ import annotations

import json

from freeinference_batch.core import aws
from freeinference_batch.store.batch_table import BatchTable
from freeinference_batch_local.handlers import LambdaContext, load_handler, repo_root

EVENTS = repo_root() / "events"


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
    assert table.update_request(batch_id, position,
                                "SET #status = :completed, " + ", ".join(f"{a} = :{a}" for a in attributes),
                                "attribute_not_exists(pk)", names={"#status": "status"},
                                completed="completed", **attributes)
