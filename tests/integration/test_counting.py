"""Counting a chain's settled requests by its watermark (store/runs.py), on moto: a run counts
what it settled now and then, not per request; a run that dies leaves its settled requests to
the sweep, which counts each of them once."""

from __future__ import annotations

import time

import pytest
from freeinference_batch import accounts, schedules, worker
from freeinference_batch import upstream as upstream_client
from freeinference_batch.store.leases import Leases, account_slots_key, model_slots_key
from freeinference_batch.store.runs import FLUSH_SECONDS
from freeinference_batch.worker.gates import OWNER_REUSE_SECONDS

from tests.integration.conftest import sample_request
from tests.integration.test_worker import (
    ACCOUNT,
    MODEL,
    NO_RECORD,
    TIME_LEFT,
    attempts,
    message_for,
    meta_of,
    one_cost,
    usage_today,
)
from tests.integration.test_worker_faults import expire_leases


def test_a_run_counts_its_settled_requests_now_and_then_and_all_when_it_gives_the_chain_up(
        harness, upstream, monkeypatch):
    # Given chain 0 of a 16-request batch: requests 0, 4, 8 and 12
    contents = [f"Counted {n}" for n in range(16)]
    batch = harness.create([sample_request(f"q-{n}", text) for n, text in enumerate(contents)])
    real_call = upstream_client.call
    seen: list[tuple[int, int]] = []

    def call_and_look(*args, **kwargs):
        meta = meta_of(harness, batch["id"])
        seen.append((meta["completed"], meta["running"]))
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
    assert (meta["completed"], meta.get("failed", 0), meta["running"]) == (4, 0, 0)
    chain_cost = sum(one_cost(contents[n]) for n in (0, 4, 8, 12))
    assert meta["cost_nano"] == usage_today(harness) == chain_cost


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
    assert (meta["completed"], meta["running"]) == (0, 1)
    # When the run's leases have run out and the sweep runs
    expire_leases(harness)
    swept = schedules.sweep(harness.settings)
    # Then it counts the two settled requests, frees the chain and sends its next request
    assert swept["counted"] == 2 and swept["recovered"] == 1 and swept["resent"] >= 1
    meta = meta_of(harness, batch["id"])
    assert (meta["completed"], meta["running"]) == (2, 0)
    assert Leases(harness.settings).holders(model_slots_key(MODEL)) == {}
    assert Leases(harness.settings).holders(account_slots_key(ACCOUNT)) == {}
    # And a second sweep counts nothing again
    assert schedules.sweep(harness.settings)["counted"] == 0
    # And the batch then completes, every request counted and charged once
    final = harness.run_to_final(batch["id"])
    assert final["request_counts"] == {"total": 12, "completed": 12, "failed": 0}
    assert attempts(sim, batch["id"], 0) == attempts(sim, batch["id"], 4) == 1
    assert meta_of(harness, batch["id"])["cost_nano"] == usage_today(harness) == sum(map(one_cost, contents))


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
    harness.run_until(lambda: meta_of(harness, batch["id"])["status"] == "failed")
    final = meta_of(harness, batch["id"])
    assert final["error"]["code"] == "owner_unauthorized"
    assert (final["completed"], final.get("failed", 0), final["running"]) == (2, 0, 0)
