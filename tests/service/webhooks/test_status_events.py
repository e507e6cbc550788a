"""Batch status events (webhooks/status_events.py), without AWS: a table stream record tells a
status change and nothing else, under an event id that is the same each time; a change of the
batch's `waiting` alone is a "Batch Waiting Change" on the bus, never a webhook.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
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
        "metadata": {"p": "q"}, "retry_of": None, "waiting": None}
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


WAITING = {"reason": "daily_quota", "message": "The account's daily quota is used up", "since": 12}


def _record(old: dict, new: dict) -> dict:
    return {"eventName": "MODIFY", "dynamodb": {"OldImage": old, "NewImage": new}}


def test_a_batch_beginning_to_wait_is_a_waiting_change_not_a_status_change() -> None:
    record = _record(_image("in_progress"), _image("in_progress", waiting=WAITING))
    assert status_events.status_change(record) is None
    change, _ = status_events.waiting_change(record)
    detail = json.loads(change.model_dump_json())
    assert detail["status"] == detail["previous_status"] == "in_progress"
    assert detail["waiting"] == WAITING
    # Cleared by a start of a batch already in progress: told too, as null
    cleared, _ = status_events.waiting_change(_record(_image("in_progress", waiting=WAITING), _image("in_progress")))
    assert cleared.waiting is None


def test_counts_and_changes_told_with_the_status_are_no_waiting_change() -> None:
    counted = _record(_image("in_progress", waiting=WAITING), _image("in_progress", waiting=WAITING, completed=3))
    assert status_events.waiting_change(counted) is None
    # A first start clears it with the status change: that event carries it, null
    started = _record(_image("validating", waiting=WAITING), _image("in_progress", in_progress_at=11))
    assert status_events.waiting_change(started) is None
    change, _ = status_events.status_change(started)
    assert change.waiting is None
    # A batch failing stops waiting by the same write, which no one is told of until it fails
    failing = _record(_image("in_progress", waiting=WAITING),
                      _image("in_progress", failing={"code": "owner_unauthorized", "message": "x"}))
    assert status_events.waiting_change(failing) is None


def test_a_waiting_change_goes_on_the_bus_as_its_own_detail_type_and_never_to_webhooks(monkeypatch) -> None:
    put: list[tuple[str, dict]] = []
    monkeypatch.setattr(status_events.event_bus, "put_event",
                        lambda bus, source, detail_type, detail: put.append((detail_type, json.loads(detail))))
    monkeypatch.setattr(status_events, "queue_deliveries", lambda *a: pytest.fail("no webhook for a waiting change"))
    told = status_events.handle_record(SimpleNamespace(event_bus_name="bus"), _record(_image("in_progress"),
                                                         _image("in_progress", waiting=WAITING)))
    assert told == {"batch_id": "batch_1", "status": "in_progress", "waiting": "daily_quota", "deliveries": 0}
    assert [(kind, detail["waiting"]["reason"]) for kind, detail in put] == [("Batch Waiting Change", "daily_quota")]
