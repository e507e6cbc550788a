"""What the worker's tests on moto share: the request message for a position (as the handler
would parse it from an SQS record), reads of the batch, the request and the day's usage, slots
held by others, the queue's messages, and the clock moved past a run's leases."""

from __future__ import annotations

from freeinference_batch.core import aws, clock
from freeinference_batch.core.catalog import load_catalog
from freeinference_batch.core.schemas import RequestMessage
from freeinference_batch.store import accounts_table
from freeinference_batch.store.batch_record import BatchRecord
from freeinference_batch.store.batch_table import BatchTable
from freeinference_batch.store.leases import Leases, model_slots_key
from freeinference_batch_local.upstream_sim import prompt_tokens, reply_for

MODEL = "glm-5.3-flash"
ACCOUNT = "acct-1"  # the harness's account (internal tier, 16 concurrent requests)
NO_RECORD: dict = {"messageId": "direct", "attributes": {}}
TIME_LEFT = 600.0  # seconds left in the invocation: plenty for a chain to run on


class WorkerDied(BaseException):
    """The Lambda running the request is killed mid-run: nothing cleans up."""


def message_for(harness, batch_id: str, position: int, model: str = MODEL) -> RequestMessage:
    table = BatchTable(harness.settings)
    meta = table.get_meta(batch_id)
    lane = table.get_lane_positions(batch_id, model)
    return RequestMessage(
        batch_id=batch_id,
        model=model,
        index=lane.index(position),
        position=position,
        account_id=meta.account_id,
        key_hash=meta.key_hash,
    )


def now(harness) -> float:
    return clock.now(harness.clock_file)


def meta_of(harness, batch_id: str) -> BatchRecord | None:
    return BatchTable(harness.settings).get_meta(batch_id)


def state_of(harness, batch_id: str, position: int) -> dict | None:
    return BatchTable(harness.settings).get_request(batch_id, position)


def usage_today(harness) -> int:
    _, usage = accounts_table.get_account_and_usage(harness.settings, ACCOUNT, clock.utc_day(now(harness)))
    return usage


def one_cost(content: str) -> int:
    messages = [{"role": "user", "content": content}]
    text, _ = reply_for(MODEL, messages, None)
    return load_catalog().models[MODEL].cost_nano(prompt_tokens(messages), len(text.split()))


def attempts(sim, batch_id: str, position: int) -> int:
    return sim.attempts_by_request.get(f"{batch_id}:{position}", 0)


def fill_slots(harness, slots_key: dict, holders: dict[str, float]) -> None:
    """Slots held by others, one each (the account's interactive requests, as the gateway takes
    them, or dead workers'), whatever the capacity."""
    leases = Leases(harness.settings)
    leases.ensure_item(slots_key, None)  # creates the slots item
    for holder, until in holders.items():
        assert leases.take_one(slots_key, holder, 10**6, until)


def hold_all_model_slots(harness, prefix: str, seconds: float = 3600) -> dict[str, float]:
    """Every one of the model's batch slots held by others for `seconds`: the holders."""
    capacity = load_catalog().models[MODEL].batch_concurrency
    holders = {f"{prefix}-{n}": now(harness) + seconds for n in range(capacity)}
    fill_slots(harness, model_slots_key(MODEL), holders)
    return holders


def expire_leases(harness) -> None:
    """Move the clock past a running request's lease and a sent message's dispatch lease."""
    harness.advance_clock(harness.settings.lease_seconds + harness.settings.batch_dispatch_lease_seconds + 60)


def results_by_id(harness, batch_id: str) -> dict[str, dict]:
    return {line["custom_id"]: line for line in harness.results(batch_id)}


def queued_messages(harness, model: str = MODEL) -> int:
    attributes = aws.sqs().get_queue_attributes(
        QueueUrl=harness.queues[model],
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesDelayed"],
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesDelayed"])


def received_record(harness, batch_id: str, position: int, model: str = MODEL) -> dict:
    """Receive the queued message for one request (hiding it, as a delivery does): its record."""
    sqs = aws.sqs()
    for _ in range(20):
        found = None
        for received in sqs.receive_message(QueueUrl=harness.queues[model], MaxNumberOfMessages=10,
                                            VisibilityTimeout=3600, AttributeNames=["All"]).get("Messages", []):
            body = RequestMessage.model_validate_json(received["Body"])
            if (body.batch_id, body.position) == (batch_id, position):
                found = {"messageId": received["MessageId"], "receiptHandle": received["ReceiptHandle"],
                         "body": received["Body"], "attributes": received["Attributes"]}
            else:  # every other message received alongside goes back on the queue
                sqs.change_message_visibility(QueueUrl=harness.queues[model],
                                              ReceiptHandle=received["ReceiptHandle"], VisibilityTimeout=0)
        if found:
            return found
    raise AssertionError(f"no queued message for {batch_id} request {position}")


def received_record_now(harness, batch_id: str, position: int, model: str = MODEL) -> bool:
    """Whether the request's message is visible on the queue right now."""
    for received in aws.sqs().receive_message(QueueUrl=harness.queues[model], MaxNumberOfMessages=10,
                                              VisibilityTimeout=0).get("Messages", []):
        body = RequestMessage.model_validate_json(received["Body"])
        if (body.batch_id, body.position) == (batch_id, position):
            return True
    return False
