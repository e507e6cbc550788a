"""The service's EventBridge bus: the batches' status changes as events."""

from __future__ import annotations

from freeinference_batch.core import aws


def put_event(bus_name: str, source: str, detail_type: str, detail: str) -> None:
    """One event on the bus (PutEvents); raises when the bus refuses it."""
    answer = aws.events().put_events(Entries=[{
        "Source": source, "DetailType": detail_type, "Detail": detail, "EventBusName": bus_name, "Resources": [],
    }])
    if answer.get("FailedEntryCount"):
        raise RuntimeError(f"PutEvents refused the event: {answer.get('Entries')}")
