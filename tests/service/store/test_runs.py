"""Counting a chain's settled requests by its watermark (store/runs.py), on moto: a run counts
what it settled now and then, not per request; a run that dies leaves its settled requests to
the sweep, which counts each of them once."""

from __future__ import annotations

import time

import pytest
from freeinference_batch import accounts, worker
from freeinference_batch.core import clock
from freeinference_batch.ops import schedules
from freeinference_batch.store.batch_table import BatchTable
from freeinference_batch.store.dynamo import TransactionFailed, transact
from freeinference_batch.store.leases import Leases, account_slots_key, model_slots_key
from freeinference_batch.store.runs import FLUSH_SECONDS, RunWrites
from freeinference_batch.worker import upstream as upstream_client
from freeinference_batch.worker.gates import OWNER_REUSE_SECONDS

from tests.conftest import sample_request
from tests.service.helpers import position_of, take_messages
from tests.service.worker.helpers import (
    ACCOUNT,
    MODEL,
    NO_RECORD,
    TIME_LEFT,
    attempts,
    expire_leases,
    fill_slots,
    message_for,
    meta_of,
    now,
    one_cost,
    state_of,
    usage_today,
)


def test_a_run_counts_its_settled_requests_now_and_then_and_all_when_it_gives_the_chain_up(
        harness, upstream, monkeypatch):
    # Given chain 0 of a 16-request batch: requests 0, 4, 8 and 12
    contents = [f"Counted {n}" for n in range(16)]
    batch = harness.create([sample_request(f"q-{n}", text) for n, text in enumerate(contents)])
    real_call = upstream_client.call
    seen: list[tuple[int, int]] = []

    def call_and_look(*args, **kwargs):
        meta = meta_of(harness, batch["id"])
        seen.append((meta.completed, meta.running))
        if len(seen) == 2:  # the run goes on past the flush interval
            harness.advance_clock(FLUSH_SECONDS + 1)
        return real_call(*args, **kwargs)

    monkeypatch.setattr(upstream_client, "call", call_and_look)
    # When the chain runs on in one invocation
    outcome = worker.Worker(harness.settings).process(message_for(harness, batch["id"], 0), NO_RECORD,
                                                      deadline=time.monotonic() + TIME_LEFT)
    # Then the batch counted nothing per request: the first two settled requests were counted
    # together once the interval had passed, the last two when the run gave the chain up
    assert isinstance(outcome, worker.Done)
    assert seen == [(0, 1), (0, 1), (2, 1), (2, 1)]
    meta = meta_of(harness, batch["id"])
    assert (meta.completed, meta.failed, meta.running) == (4, 0, 0)
    chain_cost = sum(one_cost(contents[n]) for n in (0, 4, 8, 12))
    assert meta.cost_nano == usage_today(harness) == chain_cost


@pytest.mark.parametrize("dies", ["between a settle and the next claim", "after upstream call"])
def test_the_sweep_counts_once_what_a_dead_run_settled(harness, upstream, monkeypatch, dies):
    sim, _ = upstream
    # Given a run of chain 0 that settles requests 0 and 4 without counting them, and dies either
    # before claiming request 8 or while running it
    contents = [f"Left behind {n}" for n in range(12)]
    batch = harness.create([sample_request(f"q-{n}", text) for n, text in enumerate(contents)])
    steps: list[str] = []

    def die_the_second_time(self, step: str) -> None:
        steps.append(step)
        if steps.count(dies) == (2 if dies.startswith("between") else 3):
            raise worker.SimulatedCrash(step)

    monkeypatch.setattr(worker.Worker, "_maybe_crash", die_the_second_time)
    with pytest.raises(worker.SimulatedCrash):
        worker.Worker(harness.settings).process(message_for(harness, batch["id"], 0), NO_RECORD,
                                                deadline=time.monotonic() + TIME_LEFT)
    monkeypatch.setattr(worker.Worker, "_maybe_crash", lambda self, step: None)
    meta = meta_of(harness, batch["id"])
    assert (meta.completed, meta.running) == (0, 1)
    # When the run's leases have run out and the sweep runs
    expire_leases(harness)
    swept = schedules.sweep(harness.settings)
    # Then it counts the two settled requests, frees the chain and sends its next request
    assert swept["counted"] == 2 and swept["recovered"] == 1 and swept["resent"] >= 1
    meta = meta_of(harness, batch["id"])
    assert (meta.completed, meta.running) == (2, 0)
    # The dead run's slots are its invocation's block's: the sweep leaves them, and they are free
    # once the block expires (whoever next finds the slots full reaps it)
    leases = Leases(harness.settings)
    harness.advance_clock(harness.settings.slot_lease_seconds)
    later = clock.now(harness.clock_file)
    assert leases.reap(model_slots_key(MODEL), later) == leases.reap(account_slots_key(ACCOUNT), later) == 0
    assert leases.holders(model_slots_key(MODEL)) == leases.holders(account_slots_key(ACCOUNT)) == {}
    # And a second sweep counts nothing again
    assert schedules.sweep(harness.settings)["counted"] == 0
    # And the batch then completes, every request counted and charged once
    final = harness.run_to_final(batch["id"])
    assert final["request_counts"] == {"total": 12, "completed": 12, "failed": 0}
    assert attempts(sim, batch["id"], 0) == attempts(sim, batch["id"], 4) == 1
    assert meta_of(harness, batch["id"]).cost_nano == usage_today(harness) == sum(map(one_cost, contents))


def test_a_running_chain_stops_within_the_owner_reuse_window_once_its_key_is_revoked(harness, upstream, monkeypatch):
    sim, _ = upstream
    # Given chain 0 of a 16-request batch (requests 0, 4, 8, 12) running on in one invocation,
    # whose key is revoked while its first request runs
    batch = harness.create([sample_request(f"q-{n}", f"Revoked {n}") for n in range(16)])
    real_call = upstream_client.call
    calls: list[int] = []

    def call_then(*args, **kwargs):
        calls.append(int(kwargs["request_ref"].rsplit(":", 1)[1]))
        if len(calls) == 1:
            assert accounts.revoke_key(harness.settings, harness.key)
        if len(calls) == 2:  # the owner's items as the run read them are now too old to reuse
            harness.advance_clock(OWNER_REUSE_SECONDS + 1)
        return real_call(*args, **kwargs)

    monkeypatch.setattr(upstream_client, "call", call_then)
    worker.Worker(harness.settings).process(message_for(harness, batch["id"], 0), NO_RECORD,
                                            deadline=time.monotonic() + TIME_LEFT)
    # Then the run reused what it read for one more request, within the window, and no more
    assert calls == [0, 4]
    assert attempts(sim, batch["id"], 8) == 0
    # And the chain's next message fails the batch, every settled request counted once
    harness.run_until(lambda: meta_of(harness, batch["id"]).status == "failed")
    final = meta_of(harness, batch["id"])
    assert final.error["code"] == "owner_unauthorized"
    assert (final.completed, final.failed, final.running) == (2, 0, 0)


def test_a_run_whose_slot_renewal_fails_gives_the_chain_up_without_claiming_more(harness, upstream, monkeypatch):
    sim, _ = upstream
    # Given chain 0 of a 16-request batch (requests 0, 4, 8, 12), whose hold on the slots runs low
    # while its second request runs, and whose model's slots fill past its capacity (a cap lowered
    # under other chains) between the hand-over's read of them and its write
    batch = harness.create([sample_request(f"q-{n}", f"Renewed {n}") for n in range(16)])
    run = worker.Worker(harness.settings)
    real_call, real_read = upstream_client.call, run.gates.read
    calls: list[int] = []

    def call_then(*args, **kwargs):
        calls.append(int(kwargs["request_ref"].rsplit(":", 1)[1]))
        if len(calls) == 2:
            harness.advance_clock(1.1 * harness.settings.lease_seconds)
        return real_call(*args, **kwargs)

    def read_then_fill(*args, **kwargs):
        gates = real_read(*args, **kwargs)
        if len(calls) == 2:
            fill_slots(harness, model_slots_key(MODEL), {f"other-{n}": now(harness) + 3600 for n in range(4)})
        return gates

    monkeypatch.setattr(upstream_client, "call", call_then)
    monkeypatch.setattr(run.gates, "read", read_then_fill)
    # When the run hands over after its second request
    assert isinstance(run.process(message_for(harness, batch["id"], 0), NO_RECORD,
                                  deadline=time.monotonic() + TIME_LEFT), worker.Done)
    # Then it claimed nothing more: both settled requests are counted, the chain is free and its
    # next request waits for a message of its own
    assert calls == [0, 4] and attempts(sim, batch["id"], 8) == 0
    assert (state_of(harness, batch["id"], 8) or {}).get("status", "queued") == "queued"
    meta = meta_of(harness, batch["id"])
    assert (meta.completed, meta.running) == (2, 0)
    assert all(holder.startswith("other-") for holder in Leases(harness.settings).holders(model_slots_key(MODEL)))
    assert 8 in [position_of(m) for m in take_messages(harness)]


def test_a_stalled_run_the_sweep_took_for_dead_cannot_claim_the_chain_back(harness, upstream, monkeypatch):
    sim, _ = upstream
    # Given a run of chain 0 that stalls between settling request 0 and claiming request 4, for
    # longer than its chain's dispatch lease, while the sweep runs
    contents = [f"Stalled {n}" for n in range(8)]
    batch = harness.create([sample_request(f"q-{n}", text) for n, text in enumerate(contents)])
    swept: list[dict] = []

    def stall_and_sweep(self, step: str) -> None:
        if step == "between a settle and the next claim" and not swept:
            expire_leases(harness)
            swept.append(schedules.sweep(harness.settings))

    monkeypatch.setattr(worker.Worker, "_maybe_crash", stall_and_sweep)
    outcome = worker.Worker(harness.settings).process(message_for(harness, batch["id"], 0), NO_RECORD,
                                                      deadline=time.monotonic() + TIME_LEFT)
    # Then the sweep counted request 0, freed the chain and fenced request 4 off from the stalled
    # run, which then stops without running it
    assert swept[0]["counted"] == 1 and swept[0]["recovered"] == 1
    assert isinstance(outcome, worker.Done)
    assert attempts(sim, batch["id"], 4) == 0
    meta = meta_of(harness, batch["id"])
    assert (meta.completed, meta.running) == (1, 0)
    # And the batch completes from the chain's new message, every request run and counted once
    monkeypatch.setattr(worker.Worker, "_maybe_crash", lambda self, step: None)
    final = harness.run_to_final(batch["id"])
    assert final["request_counts"] == {"total": 8, "completed": 8, "failed": 0}
    assert all(attempts(sim, batch["id"], n) == 1 for n in range(8))
    assert meta_of(harness, batch["id"]).cost_nano == usage_today(harness) == sum(map(one_cost, contents))


def test_marking_a_chain_due_leaves_a_chain_a_run_has_alone(harness):
    # Given a chain a run has taken (as a run's first claim does)
    batch = harness.create([sample_request(f"q-{n}") for n in range(4)])
    table = BatchTable(harness.settings)
    transact([table.chain_start_element(batch["id"], MODEL, 0, 0, "run-1", now(harness) + 600)])
    # When dispatch marks the chain due (as a create whose messages failed does), then it is left
    # alone: the sweep must not take a live run's chain over; a chain no run has is marked
    assert not table.set_lane_lease(batch["id"], MODEL, 0, 0, now(harness))
    assert table.set_lane_lease(batch["id"], MODEL, 1, 1, now(harness))


def test_a_run_counts_often_enough_to_keep_a_short_dispatch_lease_from_running_out(harness, upstream, monkeypatch):
    # Given a dispatch lease far shorter than the usual count interval, and chain 0 of a
    # 16-request batch running on, each request taking a third of that lease
    harness.configure(BATCH_DISPATCH_LEASE_SECONDS="3")
    batch = harness.create([sample_request(f"q-{n}", f"Short lease {n}") for n in range(16)])
    real_call = upstream_client.call
    leases: list[float] = []

    def call_and_look(*args, **kwargs):
        lanes = BatchTable(harness.settings).get_lanes(batch["id"])
        leases.append(lanes[0]["leases"][0] - now(harness))
        harness.advance_clock(1.0)
        return real_call(*args, **kwargs)

    monkeypatch.setattr(upstream_client, "call", call_and_look)
    # When the chain runs its 4 requests in one invocation
    worker.Worker(harness.settings).process(message_for(harness, batch["id"], 0), NO_RECORD,
                                            deadline=time.monotonic() + TIME_LEFT)
    # Then its dispatch lease never ran out while it ran, so the sweep never took it for dead
    assert len(leases) == 4 and all(left > 0 for left in leases), leases


def test_a_request_failed_unrun_is_never_counted_once_its_batch_is_final(harness):
    # Given a batch read while it ran, then cancelled (final at once: nothing was running)
    batch = harness.create([sample_request("q-0"), sample_request("q-1")])
    table = BatchTable(harness.settings)
    read_while_running = table.get_meta(batch["id"])
    assert harness.call("POST", f"/v1/batches/{batch['id']}/cancel")[1]["status"] == "cancelled"
    # When a worker that read it before fails one of its requests unrun (its model left the catalog)
    error = {"code": "model_not_found", "status": 404, "message": "gone"}
    writes = RunWrites(harness.settings, table)
    with pytest.raises(TransactionFailed):
        transact(writes.fail_unrun(message_for(harness, batch["id"], 0), read_while_running, error, now(harness)))
    # Then the final counts are as the cancel left them
    assert harness.batch(batch["id"])["request_counts"] == {"total": 2, "completed": 0, "failed": 0}


def test_a_request_failed_unrun_is_counted_at_once_while_its_batch_runs(harness):
    batch = harness.create([sample_request("q-0"), sample_request("q-1")])
    table = BatchTable(harness.settings)
    error = {"code": "model_not_found", "status": 404, "message": "gone"}
    transact(RunWrites(harness.settings, table).fail_unrun(message_for(harness, batch["id"], 0),
                                                           table.get_meta(batch["id"]), error, now(harness)))
    assert table.get_meta(batch["id"]).failed == 1
