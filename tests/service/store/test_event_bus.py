"""store.event_bus: PutEvents entries the bus refuses one by one (`FailedEntryCount`) are sent
again, the ones it put never twice; still refused after the attempts, the call raises."""

from __future__ import annotations

import pytest
from freeinference_batch.core import aws
from freeinference_batch.store import event_bus


class FakeBus:
    """Answers PutEvents like EventBridge: each entry in its place, refused (`ErrorCode`) for the
    first `refusals` calls that carry it when its detail is in `refuse`."""

    def __init__(self, refuse: set[str], refusals: int) -> None:
        self.refuse = refuse
        self.refusals = refusals
        self.calls: list[list[str]] = []
        self.put: list[str] = []

    def put_events(self, Entries: list[dict]) -> dict:
        details = [entry["Detail"] for entry in Entries]
        self.calls.append(details)
        results = []
        for detail in details:
            if detail in self.refuse and len(self.calls) <= self.refusals:
                results.append({"ErrorCode": "InternalFailure", "ErrorMessage": "Internal Failure"})
            else:
                self.put.append(detail)
                results.append({"EventId": f"id-{detail}"})
        return {"FailedEntryCount": sum("ErrorCode" in result for result in results), "Entries": results}


def entries(*details: str) -> list[dict]:
    return [{"Source": "s", "DetailType": "t", "Detail": detail, "EventBusName": "b"} for detail in details]


def test_refused_entries_are_sent_again_and_the_others_never_twice(monkeypatch):
    bus = FakeBus(refuse={"b"}, refusals=2)
    monkeypatch.setattr(aws, "events", lambda: bus)
    monkeypatch.setattr(event_bus, "PUT_BACKOFF_SECONDS", 0.0)
    event_bus.put_events(entries("a", "b", "c"))
    assert bus.calls == [["a", "b", "c"], ["b"], ["b"]]
    assert sorted(bus.put) == ["a", "b", "c"]


def test_one_event_refused_once_is_put(monkeypatch):
    bus = FakeBus(refuse={'{"n": 1}'}, refusals=1)
    monkeypatch.setattr(aws, "events", lambda: bus)
    event_bus.put_event("b", "s", "t", '{"n": 1}')
    assert bus.put == ['{"n": 1}'] and len(bus.calls) == 2


def test_an_entry_still_refused_after_the_attempts_raises(monkeypatch):
    bus = FakeBus(refuse={"b"}, refusals=100)
    monkeypatch.setattr(aws, "events", lambda: bus)
    monkeypatch.setattr(event_bus, "PUT_BACKOFF_SECONDS", 0.0)
    with pytest.raises(RuntimeError, match="PutEvents refused 1 event"):
        event_bus.put_events(entries("a", "b"))
    assert len(bus.calls) == event_bus.PUT_ATTEMPTS and bus.put == ["a"]
