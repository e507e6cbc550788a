"""AIMD of a model's batch cap (model_backoff.py): its arithmetic, without AWS; and on moto, an
overloaded model's batch traffic backing off and winning its cap back as calls succeed."""

from __future__ import annotations

from freeinference_batch.core import aws
from freeinference_batch.store import accounts_table
from freeinference_batch.store.leases import Leases, model_slots_key
from freeinference_batch.worker import Done, Parked, Worker
from freeinference_batch.worker.model_backoff import Backoff, capped, lowered, raised

from tests.conftest import sample_request
from tests.service.worker.helpers import MODEL, NO_RECORD, fill_slots, message_for, now


def test_the_cap_bounds_the_capacity_only_while_backing_off():
    assert capped(8, None) == 8
    assert capped(8, Backoff(cap=3, changed_at=0)) == 3
    assert capped(2, Backoff(cap=3, changed_at=0)) == 2  # interactive load may lower it further


def test_an_overload_halves_the_cap_once_per_cooldown():
    assert lowered(8, None, now=100, cooldown=10) == 4
    assert lowered(8, Backoff(cap=4, changed_at=95), now=100, cooldown=10) is None  # already answered
    assert lowered(8, Backoff(cap=4, changed_at=90), now=100, cooldown=10) == 2
    assert lowered(8, Backoff(cap=1, changed_at=0), now=100, cooldown=10) is None  # one slot stays
    assert lowered(3, None, now=100, cooldown=10) == 1


def test_successes_grow_the_cap_one_slot_per_interval_up_to_the_configured_one():
    assert raised(8, None, now=100, interval=30) is None
    assert raised(8, Backoff(cap=2, changed_at=80), now=100, interval=30) is None
    assert raised(8, Backoff(cap=2, changed_at=70), now=100, interval=30) == 3
    assert raised(8, Backoff(cap=7, changed_at=0), now=100, interval=30) == 8  # the backoff is over


def backoff_cap(harness) -> int | None:
    item = aws.dynamodb().get_item(TableName=harness.settings.accounts_table_name,
                                   Key=accounts_table.backoff_item_key(MODEL), ConsistentRead=True).get("Item")
    return int(item["cap"]["N"]) if item and "cap" in item else None


def test_an_overloaded_model_halves_its_batch_cap_and_wins_it_back_as_calls_succeed(harness):
    # Given a model running 4 batch requests at once, and requests that meet a 429 or succeed
    harness.configure(BATCH_BACKOFF_COOLDOWN_SECONDS="10", BATCH_RECOVERY_SECONDS="30")
    busy = [sample_request(f"busy-{i}", f"Busy {i} [sim:fail=429*1]") for i in range(3)]
    fine = [sample_request(f"fine-{i}", f"Fine {i}") for i in range(5)]
    batch = harness.create(busy + fine)

    def run(position: int) -> Done | Parked:
        return Worker(harness.settings).process(message_for(harness, batch["id"], position), NO_RECORD)

    # When the model answers 429
    assert isinstance(run(0), Parked)  # the request waits for its retry
    # Then the cap halves: with 2 slots held elsewhere, another batch request now waits
    assert backoff_cap(harness) == 2
    slots = model_slots_key(MODEL)
    fill_slots(harness, slots, {"interactive-a": now(harness) + 3600, "interactive-b": now(harness) + 3600})
    assert isinstance(run(3), Parked)
    for holder in ("interactive-a", "interactive-b"):
        Leases(harness.settings).release_one(slots, holder)
    # A second 429 within the cooldown does not halve it again; one after it does
    assert isinstance(run(1), Parked) and backoff_cap(harness) == 2
    harness.advance_clock(11)
    assert isinstance(run(2), Parked) and backoff_cap(harness) == 1
    # And while calls succeed (the busy requests' retries among them: a chain runs its requests in
    # order), the cap grows back one slot per interval, then the backoff ends
    assert isinstance(run(3), Done) and backoff_cap(harness) == 1  # within the interval
    for position, expected in ((0, 2), (1, 3), (2, None)):
        harness.advance_clock(31)
        assert isinstance(run(position), Done)
        assert backoff_cap(harness) == expected
    harness.advance_clock(31)
    assert isinstance(run(7), Done) and backoff_cap(harness) is None
    # And the next overload halves it again
    more = harness.create([sample_request("busy-again", "Busy again [sim:fail=503*1]")])
    assert isinstance(Worker(harness.settings).process(message_for(harness, more["id"], 0), NO_RECORD), Parked)
    assert backoff_cap(harness) == 2
