"""Claiming a request's slots on moto (worker/claims.py, worker/gates.py): a claim waits while the
model's or the account's slots are full or the model's interactive load leaves no room, reaps dead
workers' slots once their leases expire, and takes slots freed since the gates were read at once.

Each test hands a request's message to `Worker.process` (or a received record to
`handle_record`) itself, deciding when each delivery happens.
"""

from __future__ import annotations

import time

import pytest
from freeinference_batch.core.catalog import load_catalog
from freeinference_batch.store import accounts_table
from freeinference_batch.store.leases import Leases, account_slots_key, model_slots_key
from freeinference_batch.worker import Done, Parked

from tests.conftest import sample_request
from tests.service.worker.helpers import (
    ACCOUNT,
    MODEL,
    NO_RECORD,
    attempts,
    fill_slots,
    hold_all_model_slots,
    message_for,
    meta_of,
    now,
    received_record,
    received_record_now,
    state_of,
)


def test_claim_is_refused_while_model_slots_are_full_and_succeeds_after_expired_leases_are_reaped(
    harness, upstream, worker
):
    sim, _ = upstream
    # Given the model's 4 batch slots held by workers that died, their leases running 30 s more
    dead = hold_all_model_slots(harness, "dead-worker", seconds=30)
    batch = harness.create([sample_request("q-0", "Waiting for a slot")])
    message = message_for(harness, batch["id"], 0)
    # When its message is delivered
    outcome = worker.process(message, NO_RECORD)
    # Then the claim is refused: the message waits a little, the request did not start, and a
    # wait is not an attempt
    assert isinstance(outcome, Parked) and 0 < outcome.seconds <= 5
    assert attempts(sim, batch["id"], 0) == 0
    state = state_of(harness, batch["id"], 0)
    assert state is None or (state["status"] == "queued" and not state.get("attempts"))
    assert meta_of(harness, batch["id"]).running == 0
    assert set(Leases(harness.settings).holders(model_slots_key(MODEL))) == set(dead)
    # When the dead workers' leases have expired
    harness.advance_clock(31)
    outcome = worker.process(message, NO_RECORD)
    # Then the worker reaps them, claims a slot and runs the request; its own lease is released
    assert isinstance(outcome, Done)
    assert attempts(sim, batch["id"], 0) == 1
    assert harness.batch(batch["id"])["status"] == "completed"
    assert state_of(harness, batch["id"], 0)["attempts"] == 1
    assert Leases(harness.settings).holders(model_slots_key(MODEL)) == {}


def test_claim_waits_while_the_account_slots_are_used_by_interactive_requests(harness, upstream, worker):
    sim, _ = upstream
    # Given an account whose 16 concurrent-request slots its interactive requests all hold
    limit = 16
    interactive = {f"interactive-{n}": now(harness) + 3600 for n in range(limit)}
    fill_slots(harness, account_slots_key(ACCOUNT), interactive)
    batch = harness.create([sample_request("q-0", "Behind interactive traffic")])
    message = message_for(harness, batch["id"], 0)
    # Then its batch request waits without starting
    assert isinstance(worker.process(message, NO_RECORD), Parked)
    assert attempts(sim, batch["id"], 0) == 0
    assert Leases(harness.settings).holders(model_slots_key(MODEL)) == {}
    # When one interactive request finishes, Then the batch request takes its slot and runs
    Leases(harness.settings).release_one(account_slots_key(ACCOUNT), "interactive-0")
    assert isinstance(worker.process(message, NO_RECORD), Done)
    assert attempts(sim, batch["id"], 0) == 1
    assert harness.batch(batch["id"])["status"] == "completed"
    assert set(Leases(harness.settings).holders(account_slots_key(ACCOUNT))) == set(interactive) - {"interactive-0"}


@pytest.mark.parametrize("delivered", ["directly", "as an SQS record"])
def test_slots_freed_after_the_gates_were_read_are_taken_at_once(harness, upstream, worker, monkeypatch, delivered):
    sim, _ = upstream
    # Given the model's slots all held as the worker reads its gates, and given back just after
    # (their requests finished, or the item was being created by another worker)
    holders = hold_all_model_slots(harness, "finishing")
    batch = harness.create([sample_request("q-0", "A slot just freed")])
    read_gates = worker.gates.read

    def read_then_release(*args, **kwargs):
        gates = read_gates(*args, **kwargs)
        for holder in holders:
            Leases(harness.settings).release_one(model_slots_key(MODEL), holder)
        return gates

    monkeypatch.setattr(worker.gates, "read", read_then_release)
    if delivered == "directly":
        # Then the worker sees the freed slots on its second look and runs the request, not waits
        assert isinstance(worker.process(message_for(harness, batch["id"], 0), NO_RECORD), Done)
    else:
        # Then registering to wait shows the freed slots: the message comes back at once
        outcome = worker.handle_record(received_record(harness, batch["id"], 0))
        assert isinstance(outcome, Parked) and outcome.seconds == 0
        assert received_record_now(harness, batch["id"], 0)
        monkeypatch.setattr(worker.gates, "read", read_gates)
        assert harness.run_to_final(batch["id"])["request_counts"] == {"total": 1, "completed": 1, "failed": 0}
    assert attempts(sim, batch["id"], 0) == 1


def test_no_claim_while_interactive_load_fills_the_model(harness, upstream, worker):
    sim, _ = upstream
    # Given a model whose interactive load leaves no room for batch requests
    accounts_table.put_model_load(
        harness.settings, MODEL, load_catalog().models[MODEL].interactive_capacity, at=int(time.time())
    )
    batch = harness.create([sample_request("q-0", "Model busy")])
    message = message_for(harness, batch["id"], 0)
    assert isinstance(worker.process(message, NO_RECORD), Parked)
    assert attempts(sim, batch["id"], 0) == 0
    # When the load drops, Then it runs
    accounts_table.put_model_load(harness.settings, MODEL, 0, at=int(time.time()))
    assert isinstance(worker.process(message, NO_RECORD), Done)
    assert harness.batch(batch["id"])["request_counts"] == {"total": 1, "completed": 1, "failed": 0}
