"""Waiting for a slot on moto (worker/waiting.py): a chain that finds the slots full registers as
a waiter and parks its message; a slot freed while it registers sends it back at once, a yielding
chain wakes the waiters it read and looks again where its read is stale, and a fresh copy of a
long-waiting message keeps its place among the waiters.
"""

from __future__ import annotations

import pytest
from freeinference_batch.batches import dispatch
from freeinference_batch.core.schemas import RequestMessage
from freeinference_batch.store.leases import Leases, Waiter, account_slots_key, model_slots_key
from freeinference_batch.worker import FRESH_COPY_AFTER_RECEIVES, Done, Parked, Worker

from tests.conftest import sample_request
from tests.service.worker.helpers import (
    ACCOUNT,
    MODEL,
    attempts,
    fill_slots,
    hold_all_model_slots,
    message_for,
    now,
    received_record,
    received_record_now,
)


def test_a_slot_freed_while_a_chain_registers_to_wait_sends_it_back_at_once(harness, upstream, worker, monkeypatch):
    sim, _ = upstream
    hold_all_model_slots(harness, "running")
    batch = harness.create([sample_request("q-0", "Freed while registering")])
    record = received_record(harness, batch["id"], 0)
    add_waiter = worker.leases.add_waiter

    def release_then_register(*args, **kwargs):
        # The releasing worker looks for waiters before this one is on the list: it wakes no one
        Leases(harness.settings).release_one(model_slots_key(MODEL), "running-0")
        return add_waiter(*args, **kwargs)

    monkeypatch.setattr(worker.leases, "add_waiter", release_then_register)
    # When the chain finds the slots full and registers as a waiter
    outcome = worker.handle_record(record)
    # Then it looks again and comes back at once instead of sleeping through its park
    assert isinstance(outcome, Parked) and outcome.seconds == 0
    assert received_record_now(harness, batch["id"], 0)
    assert attempts(sim, batch["id"], 0) == 0
    final = harness.run_to_final(batch["id"])
    assert final["request_counts"] == {"total": 1, "completed": 1, "failed": 0}
    assert attempts(sim, batch["id"], 0) == 1


def register_waiter(harness, slots_key: dict, record: dict, remaining: int = 1) -> Waiter:
    """The record's chain registered as waiting on the slots item (as a parked delivery does)."""
    message = RequestMessage.model_validate_json(record["body"])
    waiter = Waiter(id=f"{message.batch_id}#0", batch_id=message.batch_id, model=message.model,
                    remaining=remaining, handle=record["receiptHandle"], until=now(harness) + 60, since=now(harness))
    leases = Leases(harness.settings)
    assert leases.add_waiter(slots_key, slots_item(harness, slots_key), waiter, now(harness)) is not None
    return waiter


def slots_item(harness, slots_key: dict) -> dict | None:
    return Worker(harness.settings).waiting.read_slots([slots_key])[0]


def test_a_yielding_chain_wakes_from_what_it_read_and_looks_again_where_that_is_stale(harness, upstream, worker):
    # Given a yielding chain's read of the slots: one batch waiting on the model's slots, none on
    # the account's
    fill_slots(harness, model_slots_key(MODEL), {})
    fill_slots(harness, account_slots_key(ACCOUNT), {})
    batches = [harness.create([sample_request("q-0", f"Waiting {n}")]) for n in range(3)]
    first, second, third = (received_record(harness, batch["id"], 0) for batch in batches)
    taken = register_waiter(harness, model_slots_key(MODEL), first)
    read = [slots_item(harness, model_slots_key(MODEL)), slots_item(harness, account_slots_key(ACCOUNT))]
    # and, since that read, the model's waiter woken by another worker, a second batch waiting
    # on the model and a third on the account
    assert Leases(harness.settings).take_waiter(model_slots_key(MODEL), taken)
    register_waiter(harness, model_slots_key(MODEL), second)
    register_waiter(harness, account_slots_key(ACCOUNT), third)
    # When the chain, having released its slots, wakes waiters from what it read
    worker.waiting.wake_waiters(message_for(harness, batches[0]["id"], 0), ACCOUNT, now(harness), known=read)
    # Then the waiters it could not know of are woken from a fresh read, and none is left listed
    assert received_record_now(harness, batches[1]["id"], 0)
    assert received_record_now(harness, batches[2]["id"], 0)
    assert not received_record_now(harness, batches[0]["id"], 0)  # taken by the other worker, not made visible here
    for slots_key in (model_slots_key(MODEL), account_slots_key(ACCOUNT)):
        assert not (slots_item(harness, slots_key) or {}).get("waiters")


def test_a_fresh_copy_of_a_long_waiting_message_keeps_its_place_among_the_waiters(harness, worker, monkeypatch):
    # Given a chain whose message has waited for a slot so often that it is replaced by a copy
    sent: list[RequestMessage] = []
    real_send = dispatch.send
    monkeypatch.setattr(dispatch, "send", lambda settings, messages, **kw: (sent.extend(messages),
                                                                             real_send(settings, messages, **kw)))
    batch = harness.create([sample_request("q-0")])
    sent.clear()
    hold_all_model_slots(harness, "others")
    record = received_record(harness, batch["id"], 0)
    began = float(record["attributes"]["SentTimestamp"]) / 1000 - 3600  # it waits for an hour
    record["attributes"] = {**record["attributes"], "SentTimestamp": str(int(began * 1000)),
                            "ApproximateReceiveCount": str(FRESH_COPY_AFTER_RECEIVES)}
    # When it is delivered again and still finds the slots full
    assert isinstance(worker.handle_record(record), Done)  # the copy replaces it
    # Then the copy carries when the wait began, so it stays ahead of chains that waited less
    (copy,) = sent
    assert (copy.batch_id, copy.position) == (batch["id"], 0)
    assert copy.waiting_since == pytest.approx(began, abs=1)
