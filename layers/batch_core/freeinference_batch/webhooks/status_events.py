"""What a batch's status changes tell the world: EventBridge events and webhook deliveries.

They are read from the batch table's DynamoDB stream (NEW_AND_OLD_IMAGES, the mapping filtered
to `META` items), not written by the code that changes a status: a status changes by several
writes (store/batch_status.py lists them), one of them inside the worker's hottest transaction
(the first claim's), and an outbox item there would be a write per run. The stream costs no
write at all, holds every change that committed (a function that dies after its commit still
notifies), keeps a record 24 hours, and Lambda retries a record until it succeeds: at least once. A record read twice
gives the same webhook events (their id derives from the batch and the status, which a batch
reaches once) and an EventBridge event with the same detail.

A change is a record whose old and new images differ in `status`; only visible statuses are
told of (a batch becoming `deleted` is not a status change a user sees: its final one was).

A record whose images differ in `waiting` and not in status (a batch began to wait, waits for
another reason, or a request started again: issue 33) is put on the bus as a "Batch Waiting
Change" of the same detail, its status unchanged: a detail-type of its own, so that rules on
"Batch Status Change" see only status changes, as before. It is never a webhook: those are
OpenAI's four final event types, which its SDK's `unwrap` knows. The waiting written with a status
change (cleared by a first start or a final status) rides on that change's event.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from freeinference_batch.batches import views
from freeinference_batch.core import clock
from freeinference_batch.core.schemas import (
    FINAL_STATUSES,
    BatchStatus,
    BatchStatusChange,
    WebhookDeliveryMessage,
    WebhookEventType,
)
from freeinference_batch.core.settings import Settings
from freeinference_batch.store import event_bus, queues
from freeinference_batch.store.batch_record import BatchRecord
from freeinference_batch.store.dynamo import from_item
from freeinference_batch.store.webhook_endpoints import WebhookEndpoints

EVENT_SOURCE = "freeinference.batch"
DETAIL_TYPE = "Batch Status Change"
WAITING_DETAIL_TYPE = "Batch Waiting Change"
# `finalizing` (a file batch's files being written) is put on the bus; webhooks stay the final four.
TOLD = frozenset({BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING, BatchStatus.CANCELLING, *FINAL_STATUSES})


def _meta_images(record: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """A META record's old and new images, as plain values; None for any other record."""
    images = record.get("dynamodb") or {}
    old, new = images.get("OldImage"), images.get("NewImage")
    if not old or not new or new.get("sk", {}).get("S") != "META":
        return None
    before, after = from_item(old), from_item(new)
    assert before is not None and after is not None
    return before, after


def status_change(record: dict[str, Any]) -> tuple[BatchStatusChange, BatchRecord] | None:
    """The change a stream record shows, with the new record; None if it shows none to tell."""
    images = _meta_images(record)
    if images is None:
        return None
    before, after = images
    if before.get("status") == after.get("status") or after.get("status") not in TOLD:
        return None
    if before.get("status") not in TOLD and before.get("status") != BatchStatus.VALIDATING:
        return None  # from a stored-only status (creating): not a change a user saw
    meta = BatchRecord.model_validate(after)
    return _detail(meta, before["status"]), meta


def waiting_change(record: dict[str, Any]) -> tuple[BatchStatusChange, BatchRecord] | None:
    """The change of `waiting` alone a stream record shows (its status unchanged, one a user sees
    and may still start requests in), with the new record; None if it shows none."""
    images = _meta_images(record)
    if images is None:
        return None
    before, after = images
    # Most records are counts (every 24 requests of a chain): compared raw, they cost no parse.
    if before.get("waiting") == after.get("waiting") or before.get("status") != after.get("status"):
        return None
    meta = BatchRecord.model_validate(after)
    if meta.failing is not None:
        return None  # it stopped waiting to fail: its `failed` event tells that
    if views.waiting(BatchRecord.model_validate(before)) == views.waiting(meta):
        return None  # neither could start requests: nothing a user saw changed
    return _detail(meta, meta.status), meta


def _detail(meta: BatchRecord, previous_status: str) -> BatchStatusChange:
    return BatchStatusChange(
        batch_id=meta.id, account_id=meta.account_id, status=meta.status, previous_status=previous_status,
        request_counts=views.request_counts(meta), cost_usd=views.batch_object(meta)["cost_usd"],
        created_at=meta.created_at, metadata=meta.metadata, retry_of=meta.retry_of, waiting=views.waiting(meta),
    )


def event_id(batch_id: str, event_type: str) -> str:
    """The same for every reading of the same change: a batch reaches a final status once."""
    return "evt_" + hashlib.sha256(f"{batch_id}:{event_type}".encode()).hexdigest()[:32]


def put_event(settings: Settings, change: BatchStatusChange, detail_type: str = DETAIL_TYPE) -> None:
    event_bus.put_event(settings.event_bus_name, EVENT_SOURCE, detail_type, change.model_dump_json())


def queue_deliveries(settings: Settings, change: BatchStatusChange, meta: BatchRecord) -> int:
    """One delivery message per endpoint of the owner subscribed to this final status."""
    if change.status not in FINAL_STATUSES:
        return 0
    event_type = WebhookEventType(f"batch.{change.status}")
    finished_at = getattr(meta, f"{change.status}_at", None) or meta.finished_at or meta.created_at
    now = clock.now(settings.clock_offset_file)
    messages = [
        WebhookDeliveryMessage(event_id=event_id(meta.id, event_type), event_type=event_type, batch_id=meta.id,
                               endpoint_id=endpoint.id, account_id=meta.account_id, created_at=int(finished_at),
                               queued_at=now).model_dump_json()
        for endpoint in WebhookEndpoints(settings).list(meta.account_id) if event_type in endpoint.event_types
    ]
    queues.send_messages(settings.webhook_delivery_queue_url, messages)
    return len(messages)


def handle_record(settings: Settings, record: dict[str, Any]) -> dict[str, Any] | None:
    """Tell one stream record's change: deliveries queued and the EventBridge event put. Raises
    (and the record is retried) if either failed."""
    found = status_change(record)
    if found is None:
        waited = waiting_change(record)
        if waited is None:
            return None
        change, _ = waited
        put_event(settings, change, WAITING_DETAIL_TYPE)
        return {"batch_id": change.batch_id, "status": change.status,
                "waiting": change.waiting.reason if change.waiting else None, "deliveries": 0}
    change, meta = found
    # The event first: a bus that refuses it (a policy, IAM) makes the stream retry the record,
    # and deliveries queued before it would be queued again at every retry.
    put_event(settings, change)
    deliveries = queue_deliveries(settings, change, meta)
    return {"batch_id": change.batch_id, "status": change.status, "deliveries": deliveries}


def describe(record: dict[str, Any]) -> str:
    """A record's key, for logs (never its images: they hold users' metadata)."""
    return json.dumps((record.get("dynamodb") or {}).get("Keys"), sort_keys=True)
