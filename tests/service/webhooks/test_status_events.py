"""Batch status events (webhooks/status_events.py), without AWS: a table stream record tells a
status change and nothing else, under an event id that is the same each time.
"""

from __future__ import annotations

import json

from freeinference_batch.webhooks import status_events


def _image(status: str, **extra: object) -> dict:
    item = {"pk": "BATCH#batch_1", "sk": "META", "id": "batch_1", "account_id": "acct", "key_hash": "h",
            "status": status, "created_at": 10, "expires_at": 99, "window_seconds": 89, "total": 3, "id_base": 0,
            "chunk_starts": [0], "lane_widths": {"m": 1}, "ttl": 999, "completed": 2, "failed": 1,
            "cost_nano": 1500, "metadata": {"p": "q"}, **extra}
    from freeinference_batch.store.dynamo import to_item

    return to_item(item)


def test_a_stream_record_tells_a_status_change_and_nothing_else() -> None:
    record = {"eventName": "MODIFY", "dynamodb": {"OldImage": _image("in_progress"),
                                                   "NewImage": _image("completed", completed_at=20)}}
    change, _ = status_events.status_change(record)
    assert json.loads(change.model_dump_json()) == {
        "batch_id": "batch_1", "account_id": "acct", "status": "completed", "previous_status": "in_progress",
        "request_counts": {"total": 3, "completed": 2, "failed": 1}, "cost_usd": 1.5e-06, "created_at": 10,
        "metadata": {"p": "q"}, "retry_of": None}
    same = {"eventName": "MODIFY", "dynamodb": {"OldImage": _image("in_progress"), "NewImage": _image("in_progress")}}
    deleted = {"eventName": "MODIFY", "dynamodb": {"OldImage": _image("completed"), "NewImage": _image("deleted")}}
    assert status_events.status_change(same) is None and status_events.status_change(deleted) is None
    assert status_events.event_id("batch_1", "batch.completed") == status_events.event_id("batch_1", "batch.completed")


def test_a_retrys_child_names_its_parent_in_its_events() -> None:
    record = {"eventName": "MODIFY", "dynamodb": {"OldImage": _image("validating", retry_of="batch_0"),
                                                   "NewImage": _image("in_progress", retry_of="batch_0",
                                                                      in_progress_at=11)}}
    change, _ = status_events.status_change(record)
    assert json.loads(change.model_dump_json())["retry_of"] == "batch_0"
