"""The execution engine on the local stack: retries, owner re-checks, quota, tiers, slots,
fairness and exact cost (the spec's "How batches run").

The stacks here call a simulated upstream that runs in this test process, so the tests read its
counters directly: attempts per request (`"<batch_id>:<position>"`, the worker's request id
header) and the most chat requests it served at once. Each test waits for its batches to
finish, so the counters of one test are not disturbed by another's requests.

Where the API cannot show something (every call with a key whose quota is used up answers 429;
a suspended account's keys answer 401), the tests read the batch item from the stack's moto
server, found through the stack's state file.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

# tests/e2e is not a package: pytest imports its conftest as the top-level module `conftest`.
from conftest import SHORT_TIMINGS, Api, StackProcess, launch_stack, wait_for
from freeinference_batch.core import clock
from freeinference_batch.core.catalog import NANO_PER_USD, load_catalog
from freeinference_batch.store.accounts_table import usage_item_key
from freeinference_batch.store.batch_keys import meta_key
from freeinference_batch.store.dynamo import from_item
from freeinference_batch.worker import ACCESS_WAIT_SECONDS
from freeinference_batch_local.upstream_sim import UpstreamSimulator, prompt_tokens, reply_for

pytestmark = pytest.mark.e2e

FLASH = "glm-5.3-flash"
QWEN = "qwen3.6-35b"
FINAL = ("completed", "failed", "expired", "cancelled")
# Fast retries: a request that is retried 8 times still settles in a few seconds.
FAST_RETRIES = {"BATCH_RETRY_BASE_SECONDS": "0.05", "BATCH_RETRY_MAX_SECONDS": "0.5", "BATCH_SCHEDULE_SECONDS": "1"}
CATALOG = load_catalog()
POLL = 0.25  # seconds between polls of the API


# ---------------------------------------------------------------- helpers


def item(custom_id: str, content: str = "Say hello.", model: str = FLASH, **body: Any) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": [{"role": "user", "content": content}], **body},
    }


def submit(api: Api, items: list[dict]) -> dict:
    answer = api.create_batch(items)
    assert answer.status_code == 200, answer.text
    return answer.json()


def statuses(results: list[dict]) -> dict[str, int]:
    counted: dict[str, int] = {}
    for result in results:
        counted[result["status"]] = counted.get(result["status"], 0) + 1
    return counted


def expected_cost_nano(results: list[dict]) -> int:
    """What the completed results should have cost: their usage times the catalog's prices."""
    total = 0
    for result in results:
        if result["status"] != "completed":
            continue
        body = result["response"]["body"]
        usage = body["usage"]
        total += CATALOG.models[body["model"]].cost_nano(usage["prompt_tokens"], usage["completion_tokens"])
    return total


def predicted_cost_nano(content: str, model: str = FLASH) -> int:
    """The cost of one request before it runs (the simulator's replies are deterministic)."""
    messages = [{"role": "user", "content": content}]
    text, _ = reply_for(model, messages, None)
    return CATALOG.models[model].cost_nano(prompt_tokens(messages), len(text.split()))


class Store:
    """Direct reads of a stack's tables on its moto server (what the API cannot show)."""

    def __init__(self, stack: StackProcess) -> None:
        env = json.loads(stack.state_file.read_text())["env"]
        self.batch_table = env["BATCH_TABLE_NAME"]
        self.accounts_table = env["ACCOUNTS_TABLE_NAME"]
        self.client = boto3.client(
            "dynamodb",
            endpoint_url=env["AWS_ENDPOINT_URL"],
            region_name=env.get("AWS_DEFAULT_REGION", "us-east-1"),
            aws_access_key_id=env.get("AWS_ACCESS_KEY_ID", "test"),
            aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY", "test"),
        )

    def meta(self, batch_id: str) -> dict:
        answer = self.client.get_item(TableName=self.batch_table, Key=meta_key(batch_id), ConsistentRead=True)
        found = from_item(answer.get("Item"))
        assert found is not None, f"no batch item for {batch_id}"
        return found

    def usage_nano(self, account_id: str, day: str) -> int:
        answer = self.client.get_item(
            TableName=self.accounts_table, Key=usage_item_key(account_id, day), ConsistentRead=True
        )
        found = from_item(answer.get("Item")) or {}
        return int(found.get("cost_nano", 0))


def attempts(sim: UpstreamSimulator, batch_id: str, position: int) -> int:
    return sim.attempts_by_request.get(f"{batch_id}:{position}", 0)


def wait_status(api: Api, batch_id: str, wanted: tuple[str, ...], timeout: float = 60.0) -> dict:
    """Poll the batch (not too often: the local moto server serializes every call) until its
    status is one of `wanted`."""
    last: dict = {}

    def reached() -> dict | None:
        nonlocal last
        last = api.batch(batch_id)
        return last if last["status"] in wanted else None

    try:
        return wait_for(reached, timeout=timeout, interval=POLL, message=f"batch {batch_id} in {wanted}")
    except AssertionError as error:
        raise AssertionError(f"{error}; last seen: {last}") from None


def wait_final(api: Api, batch_id: str, timeout: float = 60.0) -> dict:
    return wait_status(api, batch_id, FINAL, timeout)


def hold_for(seconds: float, invariant, message: str) -> None:
    """Assert `invariant()` stays true for `seconds` (polling): for things that must NOT happen."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert invariant(), message
        time.sleep(0.1)


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def sim() -> Iterator[UpstreamSimulator]:
    simulator = UpstreamSimulator()
    simulator.start()
    yield simulator
    simulator.stop()


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory, sim: UpstreamSimulator) -> Iterator[StackProcess]:
    """One stack for most tests: default limits, fast retries, the test process's simulator."""
    process = launch_stack(
        tmp_path_factory.mktemp("engine"), **{**SHORT_TIMINGS, **FAST_RETRIES, "UPSTREAM_BASE_URL": sim.base_url}
    )
    yield process
    process.stop()


@pytest.fixture
def own_stack(tmp_path: Path, sim: UpstreamSimulator) -> Iterator:
    """`own_stack(**env)`: a stack of the test's own, calling the test process's simulator."""
    mine: list[StackProcess] = []

    def start(**env: str) -> StackProcess:
        process = launch_stack(
            tmp_path / f"stack-{len(mine)}",
            **{**SHORT_TIMINGS, **FAST_RETRIES, "UPSTREAM_BASE_URL": sim.base_url, **env},
        )
        mine.append(process)
        return process

    yield start
    for process in mine:
        process.stop()


# ---------------------------------------------------------------- retries and error codes

# (directive, final status, error code, HTTP status, attempts the simulator sees)
OUTCOMES = {
    "fail-503-twice": ("[sim:fail=503*2]", "completed", None, None, 3),
    "status-400": ("[sim:status=400]", "failed", "invalid_request", 400, 1),
    "status-422": ("[sim:status=422]", "failed", "invalid_request", 422, 1),
    "status-403": ("[sim:status=403]", "failed", "forbidden", 403, 1),
    "status-404": ("[sim:status=404]", "failed", "model_not_found", 404, 1),
    "status-429": ("[sim:status=429]", "failed", "rate_limited", 429, 8),
    "status-503": ("[sim:status=503]", "failed", "service_unavailable", 503, 8),
    "status-500": ("[sim:status=500]", "failed", "upstream_error", 500, 8),
    "status-502": ("[sim:status=502]", "failed", "upstream_error", 502, 8),
}


@pytest.fixture(scope="module")
def outcomes(engine: StackProcess, sim: UpstreamSimulator) -> dict:
    """One batch with a request per case of OUTCOMES, run to its end."""
    api = engine.api()
    names = list(OUTCOMES)
    batch = submit(api, [item(name, f"Case {name} {OUTCOMES[name][0]}") for name in names])
    final = wait_final(api, batch["id"], timeout=150)
    results = {r["custom_id"]: r for r in api.results(batch["id"])}
    seen = {name: attempts(sim, batch["id"], position) for position, name in enumerate(names)}
    return {"batch": final, "results": results, "attempts": seen}


@pytest.mark.parametrize("case", list(OUTCOMES))
def test_upstream_outcome_sets_result_status_error_code_and_attempts(outcomes, case):
    # Given a request whose upstream answers as OUTCOMES[case] says (default BATCH_MAX_ATTEMPTS=8)
    _, status, code, http_status, expected_attempts = OUTCOMES[case]
    result = outcomes["results"][case]
    # Then it ends with the spec's status and error code, after exactly the expected attempts
    assert result["status"] == status, result
    if status == "completed":
        assert result["error"] is None
        assert result["response"]["status_code"] == 200
        assert result["response"]["body"]["choices"][0]["message"]["content"].startswith("Simulated reply")
    else:
        assert result["response"] is None
        assert result["error"]["code"] == code, result
        assert result["error"]["status"] == http_status, result
        assert result["error"]["message"]
    assert outcomes["attempts"][case] == expected_attempts


def test_batch_of_mixed_outcomes_completes_with_exact_counts(outcomes):
    batch = outcomes["batch"]
    assert batch["status"] == "completed"
    succeeded = sum(1 for spec in OUTCOMES.values() if spec[1] == "completed")
    assert batch["request_counts"] == {
        "total": len(OUTCOMES),
        "completed": succeeded,
        "failed": len(OUTCOMES) - succeeded,
    }
    # Only the completed request costs anything.
    assert batch["cost_usd"] == round(expected_cost_nano(list(outcomes["results"].values())) / NANO_PER_USD, 9)


def test_waiting_for_a_retry_shows_queued_with_the_last_error(own_stack, sim):
    # Given a stack whose first retry waits 1-2 s, and requests that fail once with a transient error
    stack = own_stack(BATCH_RETRY_BASE_SECONDS="2", BATCH_RETRY_MAX_SECONDS="2")
    api = stack.api()
    batch = submit(api, [item("q-503", "Once [sim:fail=503*1]"), item("q-429", "Once [sim:fail=429*1]")])
    expected = {"q-503": ("service_unavailable", 503), "q-429": ("rate_limited", 429)}
    seen: dict[str, dict] = {}

    def both_seen_waiting() -> bool:
        for result in api.results(batch["id"]):
            if result["status"] == "queued" and result["error"]:
                seen.setdefault(result["custom_id"], result)
        return set(seen) == set(expected)

    # When they wait for their second attempt, Then their results read queued with the last error
    wait_for(both_seen_waiting, timeout=20, interval=0.05, message="both requests queued with their last error")
    for custom_id, (code, status) in expected.items():
        assert seen[custom_id]["response"] is None
        assert seen[custom_id]["error"]["code"] == code and seen[custom_id]["error"]["status"] == status
    # And they then complete on their second attempt
    final = wait_final(api, batch["id"], timeout=30)
    assert final["status"] == "completed"
    assert final["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
    results = api.results(batch["id"])
    assert all(r["status"] == "completed" and r["error"] is None for r in results)
    assert [attempts(sim, batch["id"], p) for p in (0, 1)] == [2, 2]


def test_hanging_upstream_ends_in_timeout_after_one_attempt(own_stack, sim):
    # Given a 1 s upstream timeout and up to 2 attempts
    stack = own_stack(BATCH_UPSTREAM_TIMEOUT_SECONDS="1", BATCH_MAX_ATTEMPTS="2")
    api = stack.api()
    # When a request never gets an answer
    batch = submit(api, [item("hang", "Wait forever [sim:hang]"), item("fine", "A normal question")])
    final = wait_final(api, batch["id"], timeout=45)
    # Then it fails with timeout (504) after its one call had the most a batch request may run (a
    # second would burn as much again); the other request is unaffected
    assert final["status"] == "completed"
    assert final["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
    hang, fine = api.results(batch["id"])
    assert hang["status"] == "failed" and hang["error"]["code"] == "timeout" and hang["error"]["status"] == 504
    assert "took longer than the 1 s a batch request may run" in hang["error"]["message"]
    assert fine["status"] == "completed"
    assert attempts(sim, batch["id"], 0) == 1


# ---------------------------------------------------------------- owner re-checks


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
    store = Store(engine)
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
    content = "Say hello."
    one = predicted_cost_nano(content)
    quota_usd = one * 1.6 / NANO_PER_USD
    key = stack.create_key("quota-acct", tier="internal", daily_quota_usd=quota_usd, concurrency=1)
    api = stack.api(key)
    store = Store(stack)
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
    assert final["status"] == "completed"
    assert final["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    assert final["cost_usd"] == round(3 * one / NANO_PER_USD, 9)
    new_day = clock.utc_day(clock.now(stack.env["BATCH_CLOCK_OFFSET_FILE"]))
    assert new_day != day
    assert store.usage_nano("quota-acct", new_day) == one
    assert [attempts(sim, batch["id"], p) for p in range(3)] == [1, 1, 1]


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
    store = Store(stack)
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
    waiting = api.batch(batch["id"])
    assert waiting["status"] == "in_progress"
    assert waiting["request_counts"]["completed"] == ran

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
    # Then the batch resumes by itself and completes
    final = wait_final(api, batch["id"], timeout=60)
    assert final["status"] == "completed"
    assert final["request_counts"] == {"total": TIER_REQUESTS, "completed": TIER_REQUESTS, "failed": 0}
    assert [attempts(sim, batch["id"], p) for p in range(TIER_REQUESTS)] == [1] * TIER_REQUESTS


# ---------------------------------------------------------------- concurrency


def _run_and_measure(api: Api, sim: UpstreamSimulator, items: list[dict]) -> tuple[dict, int]:
    """Run a batch alone on the simulator; returns the final batch and the most calls at once."""
    wait_for(lambda: sim.concurrent == 0, timeout=30, message="an idle upstream")
    sim.reset_counters()
    batch = submit(api, items)
    final = wait_final(api, batch["id"], timeout=90)
    return final, sim.max_concurrent


def test_model_runs_fewer_at_once_while_its_interactive_load_is_high(engine, sim):
    api = engine.api(engine.create_key("load-acct", tier="internal"))
    slow = [item(f"q-{i}", f"Question {i} [sim:latency=0.3]") for i in range(5)]
    # Given an idle model: a batch runs several requests at once (the model's batch_concurrency 4)
    final, idle_peak = _run_and_measure(api, sim, slow)
    assert final["status"] == "completed" and idle_peak >= 2
    # When the model's interactive load is high (48 of 64: room for one batch request)
    engine.admin("set-load", FLASH, "48")
    try:
        final, busy_peak = _run_and_measure(api, sim, slow)
    finally:
        engine.admin("set-load", FLASH, "0")
    # Then batch requests run one at a time
    assert final["status"] == "completed"
    assert final["request_counts"] == {"total": 5, "completed": 5, "failed": 0}
    assert busy_peak == 1


def test_account_concurrency_limit_caps_running_requests(engine, sim):
    # Given an account allowed one concurrent request
    api = engine.api(engine.create_key("one-at-a-time", tier="internal", concurrency=1))
    peak_running = 0

    # When its batch runs (observed through the results too)
    wait_for(lambda: sim.concurrent == 0, timeout=30, message="an idle upstream")
    sim.reset_counters()
    batch = submit(api, [item(f"q-{i}", f"Question {i} [sim:latency=0.3]") for i in range(6)])

    def finished() -> bool:
        nonlocal peak_running
        peak_running = max(peak_running, statuses(api.results(batch["id"])).get("running", 0))
        return api.batch(batch["id"])["status"] in FINAL

    wait_for(finished, timeout=60, message="the batch to finish")
    # Then never more than one ran at once
    assert api.batch(batch["id"])["request_counts"] == {"total": 6, "completed": 6, "failed": 0}
    assert peak_running == 1
    assert sim.max_concurrent == 1


# ---------------------------------------------------------------- fairness


def test_small_batch_behind_a_large_one_finishes_first(engine, sim):
    # Given a large batch running on a model
    api = engine.api(engine.create_key("fair-acct", tier="internal"))
    large = submit(api, [item(f"big-{i}", f"Big {i} [sim:latency=0.2]") for i in range(40)])
    wait_status(api, large["id"], ("in_progress",), timeout=20)
    # When a small batch is submitted behind it on the same model
    small = submit(api, [item(f"small-{i}", f"Small {i} [sim:latency=0.2]") for i in range(4)])
    small_final = wait_final(api, small["id"], timeout=90)
    # Then the small batch finishes while the large one still has work left
    large_then = api.batch(large["id"])
    assert small_final["status"] == "completed"
    assert large_then["status"] == "in_progress", large_then
    assert large_then["request_counts"]["completed"] < 40
    final = wait_final(api, large["id"], timeout=120)
    assert final["status"] == "completed" and final["completed_at"] >= small_final["completed_at"]


# ---------------------------------------------------------------- exactly once


def test_cost_is_usage_times_prices_and_charged_once_to_the_day(engine):
    # Given an account with no usage yet, and a batch over two models with replies of several sizes
    api = engine.api(engine.create_key("cost-acct", tier="internal"))
    store = Store(engine)
    started = clock.now(engine.env["BATCH_CLOCK_OFFSET_FILE"])
    items = [
        item(
            f"q-{i}",
            " ".join(["word"] * (i + 1)) + f" number {i}",
            model=(FLASH, QWEN)[i % 2],
            **({"max_tokens": 3} if i % 3 == 0 else {}),
        )
        for i in range(10)
    ]
    items.append(item("bad", "Refused [sim:status=400]"))
    batch = submit(api, items)
    # When it completes
    final = wait_final(api, batch["id"], timeout=60)
    ended = clock.now(engine.env["BATCH_CLOCK_OFFSET_FILE"])
    assert final["status"] == "completed"
    assert final["request_counts"] == {"total": 11, "completed": 10, "failed": 1}
    # Then its cost is the sum over its results of usage x the catalog's prices
    results = api.results(batch["id"])
    total_nano = expected_cost_nano(results)
    assert total_nano > 0
    assert final["cost_usd"] == round(total_nano / NANO_PER_USD, 9)
    # And the account's daily usage grew by exactly that
    days = {clock.utc_day(started), clock.utc_day(ended)}
    assert sum(store.usage_nano("cost-acct", day) for day in days) == total_nano
    # And reading it again changes nothing
    assert api.batch(batch["id"])["cost_usd"] == final["cost_usd"]
