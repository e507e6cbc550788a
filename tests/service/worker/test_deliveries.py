"""Deliveries the worker must count once, on moto: a duplicate of a settled request's message is
dropped, one arriving while the request runs is kept until it settles, and a settle after the
sweep took the claim back changes nothing.

`Worker.process` is called directly with a request message, as the handler would after parsing
one SQS record, so each test decides exactly which delivery happens when. The messages that
create put on the queue stay there unless a test pumps them (then they are late duplicates).
"""

from __future__ import annotations

from freeinference_batch.ops import schedules
from freeinference_batch.store.leases import Leases, account_slots_key, model_slots_key
from freeinference_batch.worker import Done, Parked, Worker
from freeinference_batch.worker import upstream as upstream_client

from tests.conftest import sample_request
from tests.service.worker.helpers import (
    ACCOUNT,
    MODEL,
    NO_RECORD,
    attempts,
    message_for,
    meta_of,
    one_cost,
    state_of,
    usage_today,
)


def test_duplicate_of_a_settled_request_is_dropped_without_counting_twice(harness, upstream, worker):
    sim, _ = upstream
    # Given a two-request batch whose first request has run and settled
    batch = harness.create([sample_request("q-0", "First one"), sample_request("q-1", "Second one")])
    first = message_for(harness, batch["id"], 0)
    assert isinstance(worker.process(first, NO_RECORD), Done)
    meta = meta_of(harness, batch["id"])
    assert meta.status == "in_progress" and meta.completed == 1
    usage = usage_today(harness)
    assert usage == meta.cost_nano == one_cost("First one")
    # When a duplicate of its message arrives (the batch still runs)
    outcome = worker.process(first, NO_RECORD)
    # Then it is dropped: no upstream call, no count, no cost, no usage
    assert isinstance(outcome, Done)
    assert attempts(sim, batch["id"], 0) == 1
    again = meta_of(harness, batch["id"])
    assert (again.completed, again.failed, again.running, again.cost_nano) == (
        1,
        0,
        0,
        meta.cost_nano,
    )
    assert usage_today(harness) == usage
    assert state_of(harness, batch["id"], 0)["attempts"] == 1
    # And when every queued message (including the create-time copy of the first) is delivered,
    # the batch ends with each request counted once
    final = harness.run_to_final(batch["id"])
    assert final["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
    assert attempts(sim, batch["id"], 0) == 1 and attempts(sim, batch["id"], 1) == 1
    assert meta_of(harness, batch["id"]).cost_nano == one_cost("First one") + one_cost("Second one")
    assert usage_today(harness) == one_cost("First one") + one_cost("Second one")


def test_duplicate_arriving_while_the_request_runs_is_kept_until_it_settles(harness, upstream, worker, monkeypatch):
    sim, _ = upstream
    batch = harness.create([sample_request("q-0", "Running now")])
    message = message_for(harness, batch["id"], 0)
    real_call = upstream_client.call
    seen: list = []
    holders: list[int] = []

    def call_with_a_duplicate(*args, **kwargs):
        # While the first delivery waits on the model, a second delivery of the same message
        seen.append(Worker(harness.settings).process(message, NO_RECORD))
        holders.append(len(Leases(harness.settings).holders(model_slots_key(MODEL))))
        return real_call(*args, **kwargs)

    monkeypatch.setattr(upstream_client, "call", call_with_a_duplicate)
    assert isinstance(worker.process(message, NO_RECORD), Done)
    monkeypatch.setattr(upstream_client, "call", real_call)
    # Then the duplicate did not call the model and was kept until the run's lease ends (it may be
    # the very message the run holds, made visible again through an older receipt handle: deleting
    # it could lose the chain's token); once the request has settled, a delivery drops it
    assert len(seen) == 1 and isinstance(seen[0], Parked) and seen[0].seconds >= 1
    # (it gave back the slot it took before its claim failed: only the run's is held)
    assert holders == [1]
    assert Leases(harness.settings).holders(model_slots_key(MODEL)) == {}
    assert isinstance(Worker(harness.settings).process(message, NO_RECORD), Done)
    assert attempts(sim, batch["id"], 0) == 1
    final = harness.batch(batch["id"])
    assert final["status"] == "completed"
    assert final["request_counts"] == {"total": 1, "completed": 1, "failed": 0}
    assert meta_of(harness, batch["id"]).cost_nano == usage_today(harness) == one_cost("Running now")


def test_settle_after_the_claim_was_taken_back_changes_nothing(harness, upstream, worker, monkeypatch):
    sim, _ = upstream
    # Given a request whose worker stalls in the upstream call past its lease, so that the sweep
    # takes the request back and re-sends it
    batch = harness.create([sample_request("q-0", "Slow worker")])
    message = message_for(harness, batch["id"], 0)
    real_call = upstream_client.call
    swept: list[dict] = []

    def stalled_call(*args, **kwargs):
        harness.advance_clock(harness.settings.lease_seconds + harness.settings.batch_dispatch_lease_seconds + 60)
        swept.append(schedules.sweep(harness.settings))
        return real_call(*args, **kwargs)

    monkeypatch.setattr(upstream_client, "call", stalled_call)
    # When the stalled worker gets its (successful) answer and tries to settle
    outcome = worker.process(message, NO_RECORD)
    monkeypatch.setattr(upstream_client, "call", real_call)
    # Then the settle does nothing: not completed, not charged; the request is queued again
    assert isinstance(outcome, Done)
    assert swept and swept[0]["recovered"] == 1 and swept[0]["resent"] == 1
    meta = meta_of(harness, batch["id"])
    assert meta.completed == 0 and meta.running == 0 and meta.cost_nano == 0
    assert usage_today(harness) == 0
    state = state_of(harness, batch["id"], 0)
    assert state["status"] == "queued" and "claim" not in state and "response" not in state
    assert Leases(harness.settings).holders(model_slots_key(MODEL)) == {}
    assert Leases(harness.settings).holders(account_slots_key(ACCOUNT)) == {}
    # And the re-sent message runs it again, and that run alone counts
    final = harness.run_to_final(batch["id"])
    assert final["status"] == "completed"
    assert final["request_counts"] == {"total": 1, "completed": 1, "failed": 0}
    assert attempts(sim, batch["id"], 0) == 2
    assert meta_of(harness, batch["id"]).cost_nano == usage_today(harness) == one_cost("Slow worker")
    assert state_of(harness, batch["id"], 0)["attempts"] == 2
