"""Counting that keeps its promises (issue 30), on moto: near its quota an account's chains count
each request as it settles and read its usage consistently before each claim; usage is charged to
the UTC day each request finished, whoever counts it and however late (a run or the sweep); and a
long call does not hold back the counts of what its run settled before it."""

from __future__ import annotations

import time

import pytest
from freeinference_batch import accounts, worker
from freeinference_batch.core import clock
from freeinference_batch.core.catalog import NANO_PER_USD
from freeinference_batch.ops import schedules
from freeinference_batch.store import accounts_table, runs
from freeinference_batch.worker import upstream as upstream_client
from freeinference_batch.worker.gates import UNCOUNTED_PER_SLOT, near_quota

from tests.conftest import sample_request
from tests.service.worker.helpers import (
    ACCOUNT,
    NO_RECORD,
    TIME_LEFT,
    attempts,
    expire_leases,
    message_for,
    meta_of,
    now,
    one_cost,
    usage_today,
)

# The harness's account may run 16 requests at once; its requests here cost about 2,500 nano-USD
# (4,096 to the power of two above): a $0.002 quota is within 16 x 48 x 4,096 of any usage.
NEAR_QUOTA_USD = 0.002


def usage_on(harness, day: str) -> int:
    return accounts_table.get_account_and_usage(harness.settings, ACCOUNT, day)[1]


def run_chain(harness, batch_id: str) -> object:
    return worker.Worker(harness.settings).process(message_for(harness, batch_id, 0), NO_RECORD,
                                                   deadline=time.monotonic() + TIME_LEFT)


def test_near_quota_is_what_the_uncounted_and_in_flight_requests_could_spend():
    # Far: usage plus 16 slots x 48 requests x the dearest request stays below the quota
    assert not near_quota(0, 10**9, 16, 8192)
    assert UNCOUNTED_PER_SLOT == 2 * runs.FLUSH_EVERY_REQUESTS
    edge = 10**9 - 16 * UNCOUNTED_PER_SLOT * 8192
    assert not near_quota(edge - 1, 10**9, 16, 8192)
    # Near: at that edge and past it
    assert near_quota(edge, 10**9, 16, 8192)
    # And with nothing charged today there is no estimate: counted exactly until there is
    assert near_quota(0, 10**9, 16, 0)


def test_near_its_quota_a_chain_counts_each_request_before_it_claims_the_next(harness, upstream, monkeypatch):
    # Given an account near its quota and chain 0 of a 16-request batch (requests 0, 4, 8, 12)
    accounts.set_account(harness.settings, ACCOUNT, daily_quota_usd=NEAR_QUOTA_USD)
    contents = [f"Near {n}" for n in range(16)]
    batch = harness.create([sample_request(f"q-{n}", text) for n, text in enumerate(contents)])
    real_call = upstream_client.call
    seen: list[tuple[int, int]] = []

    def call_and_look(*args, **kwargs):
        seen.append((meta_of(harness, batch["id"]).completed, usage_today(harness)))
        return real_call(*args, **kwargs)

    monkeypatch.setattr(upstream_client, "call", call_and_look)
    # When the chain runs on in one invocation
    run_chain(harness, batch["id"])
    # Then each call began with every request before it counted, in the batch and the day's usage
    costs = [one_cost(contents[n]) for n in (0, 4, 8, 12)]
    assert seen == [(n, sum(costs[:n])) for n in range(4)]
    assert usage_today(harness) == meta_of(harness, batch["id"]).cost_nano == sum(costs)


def test_near_its_quota_a_run_that_dies_after_a_hand_over_leaves_nothing_settled_uncounted(
        harness, upstream, monkeypatch):
    # Given an account near its quota and chain 0 of a 16-request batch whose run dies right after
    # its second hand-over: its slot is another chain's once its lease runs out, long before the
    # sweep would count for it
    accounts.set_account(harness.settings, ACCOUNT, daily_quota_usd=NEAR_QUOTA_USD)
    contents = [f"Dies near {n}" for n in range(16)]
    batch = harness.create([sample_request(f"q-{n}", text) for n, text in enumerate(contents)])
    steps: list[str] = []

    def die_the_second_time(self, step: str) -> None:
        steps.append(step)
        if steps.count("between a settle and the next claim") == 2:
            raise worker.SimulatedCrash(step)

    monkeypatch.setattr(worker.Worker, "_maybe_crash", die_the_second_time)
    # When the run dies there
    with pytest.raises(worker.SimulatedCrash):
        run_chain(harness, batch["id"])
    # Then both requests it settled are in the day's usage and the batch's counts already: the
    # reads of the account's other chains see them, with no sweep
    meta = meta_of(harness, batch["id"])
    assert (meta.completed, meta.cost_nano) == (2, one_cost(contents[0]) + one_cost(contents[4]))
    assert usage_today(harness) == meta.cost_nano


def test_near_its_quota_a_chain_claims_nothing_once_another_count_used_it_up(harness, upstream, monkeypatch):
    sim, _ = upstream
    # Given an account near its quota and chain 0 of a 16-request batch running on
    accounts.set_account(harness.settings, ACCOUNT, daily_quota_usd=NEAR_QUOTA_USD)
    batch = harness.create([sample_request(f"q-{n}", f"Used up {n}") for n in range(16)])
    real_call = upstream_client.call
    calls: list[int] = []

    def call_then(*args, **kwargs):
        calls.append(int(kwargs["request_ref"].rsplit(":", 1)[1]))
        if len(calls) == 2:
            # another chain of the account counts what uses the quota up, while this call runs
            quota = round(NEAR_QUOTA_USD * NANO_PER_USD)
            accounts_table.transact([accounts_table.add_usage_element(
                harness.settings, ACCOUNT, quota, clock.utc_day(now(harness)), now(harness))])
        return real_call(*args, **kwargs)

    monkeypatch.setattr(upstream_client, "call", call_then)
    # When the chain runs on in one invocation
    outcome = run_chain(harness, batch["id"])
    # Then it claimed no request after that count, though the owner's items as it read them a
    # moment before are within the window a chain far from its quota reuses them for
    assert calls == [0, 4]
    assert attempts(sim, batch["id"], 8) == 0
    assert isinstance(outcome, worker.Done)
    meta = meta_of(harness, batch["id"])
    assert (meta.completed, meta.running) == (2, 0)


def _to_just_before_midnight(harness, seconds: float = 30) -> tuple[str, str]:
    """Move the clock to `seconds` before the next 00:00 UTC: (the day ending, the next day)."""
    midnight = clock.next_utc_midnight(now(harness))
    harness.advance_clock(midnight - seconds - now(harness))
    return clock.utc_day(midnight - 1), clock.utc_day(midnight)


def test_a_chain_charges_each_request_to_the_day_it_finished(harness, upstream, monkeypatch):
    # Given chain 0 of an 8-request batch (requests 0 and 4) that runs across 00:00 UTC: request 0
    # finishes before it, request 4 after, and both are counted together when the run leaves
    contents = [f"Midnight {n}" for n in range(8)]
    batch = harness.create([sample_request(f"q-{n}", text) for n, text in enumerate(contents)])
    old_day, new_day = _to_just_before_midnight(harness)
    real_call = upstream_client.call
    calls: list[int] = []

    def call_then(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            harness.advance_clock(60)
        return real_call(*args, **kwargs)

    monkeypatch.setattr(upstream_client, "call", call_then)
    # When the chain runs
    run_chain(harness, batch["id"])
    # Then each request's cost is the usage of the day it finished
    assert meta_of(harness, batch["id"]).completed == 2
    assert usage_on(harness, old_day) == one_cost(contents[0])
    assert usage_on(harness, new_day) == one_cost(contents[4])


def test_the_sweep_charges_a_dead_runs_requests_to_the_day_they_finished(harness, upstream, monkeypatch):
    # Given a run of chain 0 that settles requests 0 and 4 just before 00:00 UTC without counting
    # them, and dies before claiming request 8
    contents = [f"Swept late {n}" for n in range(12)]
    batch = harness.create([sample_request(f"q-{n}", text) for n, text in enumerate(contents)])
    old_day, new_day = _to_just_before_midnight(harness)
    steps: list[str] = []

    def die_the_second_time(self, step: str) -> None:
        steps.append(step)
        if steps.count("between a settle and the next claim") == 2:
            raise worker.SimulatedCrash(step)

    monkeypatch.setattr(worker.Worker, "_maybe_crash", die_the_second_time)
    with pytest.raises(worker.SimulatedCrash):
        run_chain(harness, batch["id"])
    assert meta_of(harness, batch["id"]).completed == 0
    # When the sweep counts them after 00:00, once the run's leases have run out
    expire_leases(harness)
    assert clock.utc_day(now(harness)) == new_day
    assert schedules.sweep(harness.settings)["counted"] == 2
    # Then they are the usage of the day they finished, not of the day they were counted
    assert meta_of(harness, batch["id"]).completed == 2
    assert usage_on(harness, old_day) == one_cost(contents[0]) + one_cost(contents[4])
    assert usage_on(harness, new_day) == 0


def test_a_long_call_does_not_hold_back_the_counts_of_what_its_run_settled(harness, upstream, monkeypatch):
    # Given chain 0 of an 8-request batch whose run counts what it settled once it is 0.3 s old
    # (COUNT_AGE_SECONDS, 115 s deployed), far from the account's quota
    monkeypatch.setattr(runs, "COUNT_AGE_SECONDS", 0.3)
    contents = [f"Long call {n}" for n in range(8)]
    batch = harness.create([sample_request(f"q-{n}", text) for n, text in enumerate(contents)])
    real_call = upstream_client.call
    counted_during_call: list[bool] = []

    def long_second_call(*args, **kwargs):
        if kwargs["request_ref"].rsplit(":", 1)[1] == "4":
            # the second call runs until request 0 is counted (or 10 s: a call far longer than the age)
            deadline = time.monotonic() + 10
            while meta_of(harness, batch["id"]).completed < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            counted_during_call.append(meta_of(harness, batch["id"]).completed == 1)
        return real_call(*args, **kwargs)

    monkeypatch.setattr(upstream_client, "call", long_second_call)
    # When the chain runs
    run_chain(harness, batch["id"])
    # Then request 0 was counted, batch and day, while request 4's call still ran
    assert counted_during_call == [True]
    meta = meta_of(harness, batch["id"])
    assert (meta.completed, meta.running) == (2, 0)
    assert meta.cost_nano == usage_today(harness) == one_cost(contents[0]) + one_cost(contents[4])
