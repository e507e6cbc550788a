"""The engine re-checks a batch's owner on the local stack (the spec's "How batches run"): revoking
the creating key or suspending the account mid-batch fails the batch once its running requests
finish; a used-up daily quota pauses the owner's batches and answers 429 until the next 00:00 UTC,
then they resume; a tier without batch access makes them wait, and regaining it resumes them.
Each wait shows as the batch's `waiting` (issue 33), cleared when a request starts again.

Where the API cannot show something (every call with a key whose quota is used up answers 429;
a suspended account's keys answer 401), the tests read the batch item from the stack's moto
server, found through the stack's state file. The stacks call a simulated upstream in this test
process (conftest.py's `sim`), whose counters the tests read directly. Each test waits for its
batches to finish, so the counters of one test are not disturbed by another's requests.
"""

from __future__ import annotations

import hashlib
import json
import time

import pytest

# tests/e2e is not a package: pytest imports its conftest, and its tests their helpers, as top-level modules.
from conftest import Api, wait_for
from engine_helpers import (
    FLASH,
    POLL,
    QWEN,
    answered_cost_nano,
    attempts,
    expected_cost_nano,
    hold_for,
    item,
    predicted_cost_nano,
    statuses,
    submit,
    wait_final,
    wait_status,
)
from freeinference_batch.core import clock
from freeinference_batch.core.catalog import NANO_PER_USD
from freeinference_batch.worker import ACCESS_WAIT_SECONDS
from stored_state import BusEvents, StoredState

pytestmark = pytest.mark.e2e


def _running_snapshot(api: Api, batch_id: str) -> set[str]:
    return {r["custom_id"] for r in api.results(batch_id) if r["status"] == "running"}


# A batch of slow requests whose owner loses access mid-batch: 6 per chain at 1.5 s each.
REQUESTS = 24


def _check_failed_batch(final: dict, results: list[dict], running_before: set[str]) -> None:
    assert final["status"] == "failed"
    assert final["failed_at"] and final["failed_at"] >= final["created_at"]
    assert final["error"]["code"] == "owner_unauthorized" and final["error"]["message"]
    by_status = statuses(results)
    assert set(by_status) <= {"completed", "failed"}, by_status
    # Requests running when the owner lost access finished, with their results.
    for result in results:
        if result["custom_id"] in running_before:
            assert result["status"] == "completed", result
            assert result["response"]["status_code"] == 200
    # Requests that had not started read failed / batch_failed.
    never_run = [r for r in results if r["status"] == "failed"]
    assert never_run, "some requests should not have started"
    assert all(r["error"]["code"] == "batch_failed" for r in never_run)
    counts = final["request_counts"]
    assert counts["total"] == len(results)
    assert counts["completed"] == by_status.get("completed", 0)
    assert counts["failed"] == len(never_run)
    assert counts["completed"] + counts["failed"] == counts["total"]
    assert final["cost_usd"] == round(expected_cost_nano(results) / NANO_PER_USD, 9)


def test_revoking_the_key_mid_batch_fails_the_batch(engine, sim):
    # Given a batch of slow requests, created with one key of an account that has two
    creator = engine.create_key("revoke-acct", tier="internal")
    reader = engine.api(engine.create_key("revoke-acct"))
    api = engine.api(creator)
    # (each chain's requests outlast the 5 s a running chain may reuse its owner's state for:
    # worker/gates.py OWNER_REUSE_SECONDS)
    batch = submit(api, [item(f"q-{i}", f"Slow question {i} [sim:latency=1.5]") for i in range(REQUESTS)])
    running = wait_for(
        lambda: _running_snapshot(api, batch["id"]), timeout=20, interval=0.1, message="a running request"
    )
    # When the creating key is revoked while some requests run
    engine.admin("revoke-key", "--hash", hashlib.sha256(creator.encode()).hexdigest())
    # Then calls with it are refused, and the batch fails once its running requests finish
    assert api.get(f"/batches/{batch['id']}").status_code == 401
    final = wait_for(
        lambda: (
            (b := reader.batch(batch["id"]))["status"] == "failed"
            and b["request_counts"]["completed"] + b["request_counts"]["failed"] == REQUESTS
            and b
        ),
        timeout=30,
        interval=POLL,
        message="failed batch with every request settled",
    )
    results = reader.results(batch["id"])
    _check_failed_batch(final, results, running)
    assert len(results) == REQUESTS
    # Nothing more runs for it afterwards.
    ran = sum(attempts(sim, batch["id"], p) for p in range(REQUESTS))
    assert ran == final["request_counts"]["completed"]


def test_suspending_the_account_mid_batch_fails_the_batch(engine, sim):
    # Given a batch of slow requests of its own account
    key = engine.create_key("suspend-acct", tier="internal")
    api = engine.api(key)
    store = StoredState(engine)
    # (each chain's requests outlast the 5 s a running chain may reuse its owner's state for:
    # worker/gates.py OWNER_REUSE_SECONDS)
    batch = submit(api, [item(f"q-{i}", f"Slow question {i} [sim:latency=1.5]") for i in range(REQUESTS)])
    running = wait_for(
        lambda: _running_snapshot(api, batch["id"]), timeout=20, interval=0.1, message="a running request"
    )
    # When the account is suspended while some requests run
    engine.admin("set-account", "suspend-acct", "--status", "suspended")
    assert api.get(f"/batches/{batch['id']}").status_code == 401
    # Then the batch fails (seen in its item: the account's keys answer 401 meanwhile) and its
    # running requests finish
    meta = wait_for(
        lambda: (m := store.meta(batch["id"]))["status"] == "failed" and m.get("running", 0) == 0 and m,
        timeout=30,
        interval=POLL,
        message="failed batch with no running request",
    )
    assert meta["error"]["code"] == "owner_unauthorized"
    # And once the account is active again its owner reads the failed batch and its results
    engine.admin("set-account", "suspend-acct", "--status", "active")
    final = api.batch(batch["id"])
    results = api.results(batch["id"])
    _check_failed_batch(final, results, running)
    ran = sum(attempts(sim, batch["id"], p) for p in range(REQUESTS))
    assert ran == final["request_counts"]["completed"]


# ---------------------------------------------------------------- quota


def test_used_up_quota_pauses_batches_answers_429_and_resumes_after_midnight(own_stack, sim):
    # Given a 3-day window (the clock will move by up to a day) and an account running one request
    # at a time whose daily quota is 1.6 requests' cost: the second request of a day uses it up
    stack = own_stack(BATCH_COMPLETION_WINDOW_SECONDS=str(3 * 86400))
    events = BusEvents(stack, "quota-events")
    content = "Say hello."
    one = predicted_cost_nano(content)
    quota_usd = one * 1.6 / NANO_PER_USD
    key = stack.create_key("quota-acct", tier="internal", daily_quota_usd=quota_usd, concurrency=1)
    api = stack.api(key)
    store = StoredState(stack)
    batch = submit(api, [item(f"q-{i}", content) for i in range(3)])
    # When its usage passes the quota (after two requests)
    meta = wait_for(
        lambda: (m := store.meta(batch["id"])).get("completed", 0) >= 2 and m.get("running", 0) == 0 and m,
        timeout=30,
        interval=POLL,
        message="two requests completed",
    )
    # Then the batch pauses: still in progress, its third request not run
    assert meta["completed"] == 2, meta

    def paused() -> bool:
        now_meta = store.meta(batch["id"])
        return (
            now_meta["status"] == "in_progress"
            and now_meta.get("completed", 0) == 2
            and sum(attempts(sim, batch["id"], p) for p in range(3)) == 2
        )

    hold_for(3.0, paused, "the paused batch must not run its last request")
    assert sum(attempts(sim, batch["id"], p) for p in range(3)) == 2
    # And it says why (issue 33): on its item, in `admin status` and on the bus, as the API answers 429
    wait_for(lambda: (store.meta(batch["id"]).get("waiting") or {}).get("reason") == "daily_quota", timeout=30,
             interval=POLL, message="the batch waiting for its quota")
    (listed,) = json.loads(stack.admin("status", "--json").stdout)["waiting"]
    assert (listed["batch_id"], listed["account_id"], listed["reason"]) == (batch["id"], "quota-acct", "daily_quota")
    assert "00:00 UTC" in listed["message"]
    wait_for(lambda: ("Batch Waiting Change", "in_progress", "daily_quota") in events.of(batch["id"]), timeout=30,
             interval=POLL, message="the wait told on the bus")
    day = clock.utc_day(clock.now(stack.env["BATCH_CLOCK_OFFSET_FILE"]))
    assert store.usage_nano("quota-acct", day) == 2 * one
    # And every call with the account's key answers 429, saying when the quota renews
    calls = [
        api.get(f"/batches/{batch['id']}"),
        api.get("/batches"),
        api.get(f"/batches/{batch['id']}/results"),
        api.create_batch([item("more")]),
    ]
    for answer in calls:
        assert answer.status_code == 429, answer.text
        assert "00:00 UTC" in answer.json()["error"]["message"], answer.text
    # When the clock passes the next 00:00 UTC (and the sweep's lease on the parked message)
    now = clock.now(stack.env["BATCH_CLOCK_OFFSET_FILE"])
    stack.set_clock_offset(clock.next_utc_midnight(now) + 2 * 3600 - time.time())
    # Then the batch resumes by itself and completes, its last request charged to the new day
    final = wait_final(api, batch["id"], timeout=60)
    assert final["status"] == "completed" and final["waiting"] is None
    assert "waiting" not in store.meta(batch["id"])
    assert final["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    assert final["cost_usd"] == round(3 * one / NANO_PER_USD, 9)
    new_day = clock.utc_day(clock.now(stack.env["BATCH_CLOCK_OFFSET_FILE"]))
    assert new_day != day
    assert store.usage_nano("quota-acct", new_day) == one
    assert [attempts(sim, batch["id"], p) for p in range(3)] == [1, 1, 1]


def test_a_used_up_quota_is_overrun_by_no_more_than_the_requests_in_flight(engine, sim):
    # Given an account running 8 requests at once (4 chains on each of two models, 0.5 s calls)
    # whose daily quota is about 10 requests' cost, and a batch of 40 requests on each model
    concurrency = 8
    content = "Spend it. [sim:latency=0.5]"
    quota_nano = 10 * predicted_cost_nano(content, QWEN)
    key = engine.create_key("bound-acct", tier="internal", daily_quota_usd=quota_nano / NANO_PER_USD,
                            concurrency=concurrency)
    api = engine.api(key)
    store = StoredState(engine)
    batches = [submit(api, [item(f"{model}-{i}", content, model=model) for i in range(40)]) for model in (FLASH, QWEN)]
    ids = {batch["id"] for batch in batches}
    day = clock.utc_day(clock.now(engine.env["BATCH_CLOCK_OFFSET_FILE"]))
    # When the quota is used up and every chain has stopped
    wait_for(lambda: store.usage_nano("bound-acct", day) >= quota_nano
             and all(store.meta(b)["running"] == 0 for b in ids), timeout=60, interval=POLL,
             message="the quota used up and the batches paused")
    hold_for(1.0, lambda: all(store.meta(b)["running"] == 0 for b in ids), "the paused batches must stay paused")
    # Then what the upstream answered past the quota is at most what a direct client with the same
    # concurrency could have in flight when it ran out: 8 requests
    answered, dearest = answered_cost_nano(sim, ids)
    assert answered - quota_nano <= concurrency * dearest, (answered, quota_nano, dearest)
    # And every answer is charged, once, to the day it finished
    assert store.usage_nano("bound-acct", day) == answered
    assert all(store.meta(b)["status"] == "in_progress" for b in ids)


# ---------------------------------------------------------------- tier


# Long enough chains (4 slots at most, 1 s each) that a chain running on after the tier change, for
# up to worker/gates.py OWNER_REUSE_SECONDS, cannot run the whole batch.
TIER_REQUESTS = 40


def test_losing_batch_access_makes_batches_wait_and_regaining_it_resumes_them(own_stack, sim):
    # Given an internal account's batch of slow requests (short dispatch leases: the sweep soon
    # re-sends a parked message once the clock passes its re-check time)
    stack = own_stack(BATCH_DISPATCH_LEASE_SECONDS="3")
    key = stack.create_key("tier-acct", tier="internal")
    api = stack.api(key)
    store = StoredState(stack)
    batch = submit(api, [item(f"q-{i}", f"Question {i} [sim:latency=1]") for i in range(TIER_REQUESTS)])
    other = submit(api, [item(f"o-{i}", f"Other {i} [sim:latency=1]") for i in range(8)])
    wait_for(lambda: _running_snapshot(api, batch["id"]), timeout=20, interval=0.1, message="a running request")
    # When the account moves to a tier without batch access
    stack.admin("set-account", "tier-acct", "--tier", "standard")
    # Then running requests finish, are counted (a chain counts what it ran when it stops: until
    # then its batch's counts lag), and the rest wait, queued. The batch item's running count says
    # when every chain has stopped: between two requests of a hand-over no request shows running
    # while the chain goes on (for up to worker/gates.py OWNER_REUSE_SECONDS after the change).
    def stopped() -> bool:
        ran = sum(attempts(sim, batch["id"], p) for p in range(TIER_REQUESTS))
        meta = store.meta(batch["id"])
        counted = meta.get("running", 0) == 0 and meta.get("completed", 0) == ran
        return counted and not _running_snapshot(api, batch["id"])

    wait_for(stopped, timeout=20, interval=POLL, message="no running request, and every one that ran counted")
    ran = sum(attempts(sim, batch["id"], p) for p in range(TIER_REQUESTS))
    assert 0 < ran < TIER_REQUESTS
    # And the batch says why it waits (issue 33: within two minutes of the change; here, as soon
    # as its last chain has stopped and its next request looked)
    waiting = wait_for(lambda: (b := api.batch(batch["id"]))["waiting"] and b, timeout=120, interval=POLL,
                       message="the batch waiting")
    assert waiting["status"] == "in_progress"
    assert waiting["request_counts"]["completed"] == ran
    assert waiting["waiting"]["reason"] == "batch_access" and "every minute" in waiting["waiting"]["message"]

    def still_waiting() -> bool:
        results = api.results(batch["id"])
        return (
            sum(attempts(sim, batch["id"], p) for p in range(TIER_REQUESTS)) == ran
            and statuses(results).get("queued", 0) == TIER_REQUESTS - ran
            and api.batch(batch["id"])["status"] == "in_progress"
        )

    hold_for(3.0, still_waiting, "requests must wait while the account may not batch")
    # And reading, listing and cancelling still work
    listed = api.get("/batches")
    assert listed.status_code == 200 and {batch["id"], other["id"]} <= {b["id"] for b in listed.json()["data"]}
    cancel = api.post(f"/batches/{other['id']}/cancel")
    assert cancel.status_code == 200, cancel.text
    assert wait_status(api, other["id"], ("cancelled",), timeout=20)["status"] == "cancelled"
    # And creating is refused
    assert api.create_batch([item("new")]).status_code == 403
    # When access returns (and the clock passes the time after which a waiting request re-checks)
    stack.admin("set-account", "tier-acct", "--tier", "internal")
    stack.set_clock_offset(ACCESS_WAIT_SECONDS + 3 + 60)
    # Then the batch resumes by itself, no longer waiting once a request starts, and completes
    resumed = wait_for(lambda: (b := api.batch(batch["id"]))["request_counts"]["completed"] > ran and b,
                       timeout=60, interval=POLL, message="the batch resumed")
    assert resumed["waiting"] is None, resumed
    final = wait_final(api, batch["id"], timeout=60)
    assert final["status"] == "completed" and final["waiting"] is None
    assert final["request_counts"] == {"total": TIER_REQUESTS, "completed": TIER_REQUESTS, "failed": 0}
    assert [attempts(sim, batch["id"], p) for p in range(TIER_REQUESTS)] == [1] * TIER_REQUESTS


# ---------------------------------------------------------------- concurrency


# ---------------------------------------------------------------- fairness


# ---------------------------------------------------------------- exactly once


