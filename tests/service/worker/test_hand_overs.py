"""A chain running on in one worker invocation, on moto (worker/settling.py, worker/chains.py):
each request settles alone and the chain's next one is claimed under the same hold on the slots
(one block of the invocation's, renewed only when it runs low), each counted once; a chain short
of time, or whose model interactive load takes, hands over by a new message, and a big batch's
chain yields its slot to a small waiting batch.

Each test hands a chain's first message to `Worker.process` itself, as the handler would after
parsing an SQS record; the messages create queued stay on the queue until a test runs the batch
to its end, and are late duplicates then.
"""

from __future__ import annotations

import time

import pytest
from freeinference_batch.core.catalog import load_catalog
from freeinference_batch.store import accounts_table
from freeinference_batch.store.leases import Leases, account_slots_key, entry_expiry, model_slots_key
from freeinference_batch.worker import Done, InvocationState, Parked, Worker, gates
from freeinference_batch.worker import upstream as upstream_client
from freeinference_batch.worker.slot_blocks import BlockLeases, SlotBlock

from tests.conftest import sample_request
from tests.service.worker.helpers import (
    ACCOUNT,
    MODEL,
    NO_RECORD,
    TIME_LEFT,
    attempts,
    message_for,
    meta_of,
    now,
    one_cost,
    queued_messages,
    received_record,
    received_record_now,
    state_of,
    usage_today,
)


def test_a_chain_runs_on_in_one_invocation_and_each_request_counts_once(harness, upstream, worker):
    sim, _ = upstream
    # Given an 8-request batch: 4 chains (the model's batch concurrency) of 2 requests each
    contents = [f"Chain request {n}" for n in range(8)]
    batch = harness.create([sample_request(f"q-{n}", text) for n, text in enumerate(contents)])
    first = message_for(harness, batch["id"], 0)
    second = message_for(harness, batch["id"], 4)
    assert second.index == first.index + 4
    queued = queued_messages(harness)
    # When chain 0's first message is processed with time left in the invocation
    assert isinstance(worker.process(first, NO_RECORD, deadline=time.monotonic() + TIME_LEFT), Done)
    # Then both of its requests ran, each once, handing the slots over without a new message
    assert attempts(sim, batch["id"], 0) == attempts(sim, batch["id"], 4) == 1
    assert queued_messages(harness) == queued
    assert state_of(harness, batch["id"], 0)["status"] == state_of(harness, batch["id"], 4)["status"] == "completed"
    meta = meta_of(harness, batch["id"])
    assert (meta.completed, meta.failed, meta.running) == (2, 0, 0)
    assert meta.cost_nano == usage_today(harness) == one_cost(contents[0]) + one_cost(contents[4])
    assert Leases(harness.settings).holders(model_slots_key(MODEL)) == {}
    assert Leases(harness.settings).holders(account_slots_key(ACCOUNT)) == {}
    # And when every queued message (chain 0's among them, now a duplicate) is delivered, each
    # request ends counted and charged once
    final = harness.run_to_final(batch["id"])
    assert final["request_counts"] == {"total": 8, "completed": 8, "failed": 0}
    assert all(attempts(sim, batch["id"], n) == 1 for n in range(8))
    assert meta_of(harness, batch["id"]).cost_nano == usage_today(harness) == sum(map(one_cost, contents))


def test_the_chains_of_one_invocation_share_one_block_and_one_read_of_their_owner(harness, upstream, monkeypatch):
    # Given two chains of one batch in one worker invocation
    batch = harness.create([sample_request(f"q-{n}", f"Shared {n}") for n in range(8)])
    invocation = InvocationState.new(harness.settings)
    real_call = upstream_client.call
    seen: list[dict] = []

    def call_and_look(*args, **kwargs):
        seen.append(Leases(harness.settings).holders(model_slots_key(MODEL)))
        return real_call(*args, **kwargs)

    monkeypatch.setattr(upstream_client, "call", call_and_look)
    # When both run on to their chain's end
    for chain in (0, 1):
        assert isinstance(Worker(harness.settings, invocation=invocation).process(
            message_for(harness, batch["id"], chain), NO_RECORD, deadline=time.monotonic() + TIME_LEFT), Done)
    # Then their slots were one entry of the model's item, held by the invocation's block
    assert len(seen) == 4 and all(len(holders) == 1 for holders in seen)
    assert len({next(iter(holders)) for holders in seen}) == 1
    assert harness.batch(batch["id"])["request_counts"]["completed"] == 4
    # And a chain running on reuses the owner's items another chain of the invocation read
    read: list[set[str]] = []
    real_batch_get = gates.batch_get

    def recording_batch_get(request: dict) -> dict:
        read.append({f"{k['pk']['S']}/{k['sk']['S']}" for keys in request.values() for k in keys["Keys"]})
        return real_batch_get(request)

    monkeypatch.setattr(gates, "batch_get", recording_batch_get)
    second = InvocationState.new(harness.settings)
    for chain in (2, 3):
        Worker(harness.settings, invocation=second).gates.read(message_for(harness, batch["id"], chain), now(harness),
                                                                reuse_owner=True)
    owner = {f"SETTINGS#{ACCOUNT}/SETTINGS", f"MODEL#{MODEL}/BACKOFF"}
    assert owner <= read[0] and not owner & read[1], read


def test_a_chain_keeps_its_slots_across_hand_overs_and_renews_them_only_when_they_run_low(
        harness, upstream, worker, monkeypatch):
    # Given a 16-request batch: chain 0 runs requests 0, 4, 8 and 12
    batch = harness.create([sample_request(f"q-{n}", f"Held {n}") for n in range(16)])
    lease = harness.settings.lease_seconds
    real_call = upstream_client.call
    seen: list[tuple[dict, dict, str]] = []

    def call_and_look(*args, **kwargs):
        request = int(kwargs["request_ref"].rsplit(":", 1)[1])
        seen.append((Leases(harness.settings).holders(model_slots_key(MODEL)),
                     Leases(harness.settings).holders(account_slots_key(ACCOUNT)),
                     state_of(harness, batch["id"], request)["claim"]))
        if len(seen) == 2:  # the chain runs on for longer than a request's lease
            harness.advance_clock(1.1 * lease)
        return real_call(*args, **kwargs)

    monkeypatch.setattr(upstream_client, "call", call_and_look)
    # When chain 0 runs on in one invocation
    assert isinstance(worker.process(message_for(harness, batch["id"], 0), NO_RECORD,
                                     deadline=time.monotonic() + TIME_LEFT), Done)
    # Then each request had a claim of its own, but the chain held the same one slot of the model
    # and of the account throughout
    assert len(seen) == 4 and len({claim for _, _, claim in seen}) == 4
    for model_slots, account_slots, _ in seen:
        assert len(model_slots) == len(account_slots) == 1 and model_slots.keys() == account_slots.keys()
        assert model_slots.keys() == seen[0][0].keys()
    expiries = [entry_expiry(model_slots[next(iter(model_slots))]) for model_slots, _, _ in seen]
    # and its hand-overs wrote the slots only once less than a request's lease of them was left
    assert expiries[1] == expiries[0]
    assert expiries[2] > expiries[1] + lease
    assert expiries[3] == expiries[2]
    # And at the chain's end both slots are free, every request counted once
    assert Leases(harness.settings).holders(model_slots_key(MODEL)) == {}
    assert Leases(harness.settings).holders(account_slots_key(ACCOUNT)) == {}
    assert meta_of(harness, batch["id"]).completed == 4


def test_a_chain_without_time_for_another_request_sends_its_next_message(harness, upstream, worker):
    sim, _ = upstream
    batch = harness.create([sample_request(f"q-{n}", f"Short of time {n}") for n in range(8)])
    queued = queued_messages(harness)
    # When a 900 s invocation has time for the message's request (a quick answer) but less left than
    # a hand-over needs: a call that would get the whole timeout (10 s) after the settle time
    harness.configure(BATCH_UPSTREAM_TIMEOUT_SECONDS=10)
    worker = Worker(harness.settings)
    too_little = harness.settings.batch_settle_seconds + 5
    outcome = worker.process(message_for(harness, batch["id"], 0), NO_RECORD, deadline=time.monotonic() + too_little,
                             invocation_seconds=900)
    # Then only the message's own request ran, and the chain goes on by a new message
    assert isinstance(outcome, Done)
    assert attempts(sim, batch["id"], 0) == 1 and attempts(sim, batch["id"], 4) == 0
    assert queued_messages(harness) == queued + 1
    assert Leases(harness.settings).holders(model_slots_key(MODEL)) == {}
    final = harness.run_to_final(batch["id"])
    assert final["request_counts"] == {"total": 8, "completed": 8, "failed": 0}
    assert all(attempts(sim, batch["id"], n) == 1 for n in range(8))


def test_a_failed_wake_does_not_stop_the_chain(harness, upstream, worker, monkeypatch):
    sim, _ = upstream
    batch = harness.create([sample_request(f"q-{n}", f"Wake fails {n}") for n in range(8)])
    queued = queued_messages(harness)

    def throttled(*args, **kwargs):
        raise RuntimeError("DynamoDB throttled the read")

    read_slots = worker.waiting.read_slots
    monkeypatch.setattr(worker.waiting, "read_slots", throttled)
    # When waking waiters fails after a request settled
    outcome = worker.process(message_for(harness, batch["id"], 0), NO_RECORD)
    # Then the request still counts once and the chain's next message is still sent
    assert isinstance(outcome, Done)
    assert queued_messages(harness) == queued + 1
    assert meta_of(harness, batch["id"]).completed == 1
    monkeypatch.setattr(worker.waiting, "read_slots", read_slots)
    final = harness.run_to_final(batch["id"])
    assert final["request_counts"] == {"total": 8, "completed": 8, "failed": 0}
    assert all(attempts(sim, batch["id"], n) == 1 for n in range(8))

def test_a_chain_stops_handing_over_when_interactive_load_takes_the_model(harness, upstream, worker, monkeypatch):
    sim, _ = upstream
    batch = harness.create([sample_request(f"q-{n}", f"Load rises {n}") for n in range(8)])
    real_call = upstream_client.call

    def call_while_load_rises(*args, **kwargs):
        # The interactive gateway reports the model full while the batch request runs
        accounts_table.put_model_load(
            harness.settings, MODEL, load_catalog().models[MODEL].interactive_capacity, at=int(time.time()))
        return real_call(*args, **kwargs)

    monkeypatch.setattr(upstream_client, "call", call_while_load_rises)
    outcome = worker.process(message_for(harness, batch["id"], 0), NO_RECORD, deadline=time.monotonic() + TIME_LEFT)
    monkeypatch.setattr(upstream_client, "call", real_call)
    # Then the running request finished and gave its slot back; the next one did not start
    assert isinstance(outcome, Done)
    assert attempts(sim, batch["id"], 0) == 1 and attempts(sim, batch["id"], 4) == 0
    assert meta_of(harness, batch["id"]).completed == 1
    assert Leases(harness.settings).holders(model_slots_key(MODEL)) == {}
    # And the chain's next request waits for the load to drop, then runs
    assert isinstance(worker.process(message_for(harness, batch["id"], 4), NO_RECORD), Parked)
    accounts_table.put_model_load(harness.settings, MODEL, 0, at=int(time.time()))
    final = harness.run_to_final(batch["id"])
    assert final["request_counts"] == {"total": 8, "completed": 8, "failed": 0}
    assert all(attempts(sim, batch["id"], n) == 1 for n in range(8))


@pytest.mark.parametrize("other_holders_are", ["the big batch's other chains", "another batch"])
def test_a_big_batch_yields_its_slot_to_a_small_waiting_batch(harness, upstream, worker, monkeypatch,
                                                                     other_holders_are):
    sim, _ = upstream
    # Given a big batch and a small one on the same model, the small one's first message delivered
    big = harness.create([sample_request(f"big-{n}", f"Big {n}") for n in range(8)])
    small = harness.create([sample_request(f"small-{n}", f"Small {n}") for n in range(2)])
    small_record = received_record(harness, small["id"], 0)
    # and the model's other 3 slots held (for an hour) by another invocation's block of the big
    # batch's chains 0-2 (named to come first in the batch's order of blocks: fairness.keeps_slot),
    # or of a third batch's
    owner = big["id"] if other_holders_are == "the big batch's other chains" else "batch_other"
    others = SlotBlock(f"{owner}.0", None, 3600)
    leases = BlockLeases(harness.settings)
    for _ in range(3):
        assert leases.take(model_slots_key(MODEL), others, 4, now(harness))
    real_call = upstream_client.call
    small_outcomes: list = []

    def call_while_the_small_batch_arrives(*args, **kwargs):
        if not small_outcomes:  # all 4 slots are taken now: the small batch's chain must wait
            small_outcomes.append(Worker(harness.settings).handle_record(small_record))
        return real_call(*args, **kwargs)

    monkeypatch.setattr(upstream_client, "call", call_while_the_small_batch_arrives)
    # When the big batch's chain 3 finishes its request with time left to run on
    outcome = worker.process(message_for(harness, big["id"], 3), NO_RECORD, deadline=time.monotonic() + TIME_LEFT)
    monkeypatch.setattr(upstream_client, "call", real_call)
    assert isinstance(outcome, Done) and isinstance(small_outcomes[0], Parked)
    assert attempts(sim, big["id"], 3) == 1 and attempts(sim, small["id"], 0) == 0
    slots = Leases(harness.settings).holders(model_slots_key(MODEL))
    woken = received_record_now(harness, small["id"], 0)
    # Then it yields its slot to the small batch (a batch with few requests left goes first, even
    # when this is the big batch's last slot): its next request waits for a message of its own,
    # and the small batch's parked message is made visible at once
    assert attempts(sim, big["id"], 7) == 0
    assert set(slots) == {others.holder}
    assert woken
    # And when the other holders finish, everything ends counted once
    for _ in range(3):
        leases.give(model_slots_key(MODEL), others)
    for batch in (big, small):
        assert harness.run_to_final(batch["id"])["status"] == "completed"
    assert all(attempts(sim, big["id"], n) == 1 for n in range(8))
    assert all(attempts(sim, small["id"], n) == 1 for n in range(2))


