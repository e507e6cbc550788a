"""Chaos on the local stack: AWS on a bad day and everything else at once, and still every request
ends once with exact counts and cost.

At the same time:
- AWS faults (`LOCAL_AWS_FAULTS`, see README "AWS's bad days, on demand"): DynamoDB throttles,
  500s, lost answers (applied, then re-sent by botocore), transaction conflicts and reads up to 1 s
  stale; SQS duplicate deliveries, lost answers, batch entries Failed and deletes by an old receipt
  handle that delete nothing; S3 lost answers and 500s; EventBridge throttles, 500s, lost answers
  and refused entries; Secrets Manager throttles and 500s (CloudWatch's faults are off: the
  functions never call CloudWatch, their metrics go out in their logs);
- 30% of the requests fail their first attempt upstream with 503 (`[sim:fail=503*1]`);
- BATCH_FAULT_CRASH_RATE: at each of the worker's crash points a few runs die as a killed Lambda
  would (no cleanup, the message not deleted); short leases let the sweep take them back.

1,100 requests in 4 batches of 2 accounts on 2 models: one batch is cancelled mid-run, one is
deleted once it ends, and one create is sent twice with the same Idempotency-Key, as a client
does whose answer was lost. Beside them a third account with a small daily quota runs into it:
it is overrun by no more than its requests in flight, and charged exactly.

The seed (`LOCAL_AWS_FAULTS_SEED`, printed) fixes the moto server's fault schedule for a given
sequence of calls; the pollers' and workers' threads interleave differently from run to run, so
a seed reproduces the faults' rates and kinds, not one run call for call.
"""

from __future__ import annotations

import base64
import json
import os
import random
import time
from pathlib import Path
from typing import Any

import pytest
import requests

# tests/e2e is not a package: pytest imports its conftest, and its tests their helpers, as top-level modules.
from conftest import Api, StackProcess, wait_for
from engine_helpers import answered_cost_nano, predicted_cost_nano
from freeinference_batch.core import clock
from freeinference_batch.core.catalog import NANO_PER_USD, Catalog, load_catalog
from stored_state import StoredState

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(720)]

MODELS = tuple(load_catalog().models)  # the two packaged models
# EventBridge and Secrets Manager see a few dozen calls a run (a PutEvents per status change, a
# secret read per worker environment): their rates are high enough that each fault happens (a
# PutEvents refused through every retry fails its stream record, which the stream sends again;
# a worker whose first read fails every retry parks its messages for seconds, claiming nothing).
# SQS deletes by an old receipt handle (after a duplicate delivery) delete nothing half the time:
# AWS says such a delete succeeds but *may* not delete. CloudWatch's are left off: the functions
# never call it (their metrics go out in their logs).
AWS_FAULTS = ("dynamodb.throttle=0.03,dynamodb.error=0.02,dynamodb.lost_answer=0.03,dynamodb.conflict=0.03,"
              "dynamodb.stale_ms=1000,sqs.duplicate=0.1,sqs.lost_answer=0.03,sqs.failed_entry=0.03,"
              "sqs.stale_receipt=0.5,s3.lost_answer=0.3,s3.error=0.1,events.throttle=0.3,events.error=0.3,"
              "events.lost_answer=0.3,events.failed_entry=0.4,secretsmanager.throttle=0.3,secretsmanager.error=0.2")
# Requests whose body is too big for an item even compressed: their input goes to S3, where the
# S3 faults (higher rates: S3 sees a few calls a batch, DynamoDB thousands) meet them. Two batches
# carry them (one would be 10 MB and more, past what one create takes): about 20 S3 writes a run,
# so that each S3 fault is all but sure to happen.
LARGE_REQUESTS = 10
LARGE_BODY_CHARS = 500_000
FINAL = ("completed", "failed", "expired", "cancelled")
FAULTY_EVERY = 10  # positions 0, 3, 6 of every 10: 30% fail once upstream
# The batches run at once, so they share one wait; a loaded machine (moto serves one call at a
# time) takes 5 to 6 minutes where an idle one takes 3 to 4.
FINISH_SECONDS = 540
# The quota account: 4 requests at once, a quota of 30 requests, a batch of 100.
QUOTA_CONCURRENCY = 4
QUOTA_REQUESTS = 30
QUOTA_CONTENT = "Chaos quota [sim:latency=0.05]"


class CountingApi(Api):
    """An Api that retries a 503 after its Retry-After, as a client should, and remembers every
    5xx it was answered (a 503 without Retry-After, or any other 5xx, is a failure of the test)."""

    def __init__(self, base_url: str, key: str) -> None:
        super().__init__(base_url, key, timeout=60.0)
        self.server_errors: list[str] = []
        self.retried_503 = 0

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        for _ in range(20):
            answer = super().request(method, path, **kwargs)
            if answer.status_code < 500:
                return answer
            if answer.status_code != 503 or "Retry-After" not in answer.headers:
                self.server_errors.append(f"{method} {path}: {answer.status_code} {answer.text[:200]}")
                return answer
            self.retried_503 += 1
            time.sleep(min(2.0, float(answer.headers["Retry-After"])))
        return answer


def _catalog(path: Path) -> Catalog:
    """The packaged catalog with more batch slots per model, so 1,100 requests run in a few minutes."""
    data = json.loads(load_catalog().model_dump_json())
    for model in data["models"].values():
        model["batch_concurrency"] = 16
    path.write_text(json.dumps(data))
    return Catalog.model_validate(data)


def _lines(prefix: str, count: int, models: tuple[str, ...]) -> list[dict]:
    return [
        {"custom_id": f"{prefix}-{n}",
         "body": {"model": models[n % len(models)],
                  "messages": [{"role": "user", "content": f"Chaos {prefix} {n} [sim:latency=0.05]"
                                + (" [sim:fail=503*1]" if n % FAULTY_EVERY in (0, 3, 6) else "")}]}}
        for n in range(count)
    ]


def _large_lines(prefix: str, count: int, model: str) -> list[dict]:
    rng = random.Random(0)  # incompressible: no chunk of theirs fits an item
    noise = [base64.b64encode(rng.randbytes(LARGE_BODY_CHARS * 3 // 4)).decode() for _ in range(count)]
    return [
        {"custom_id": f"{prefix}-large-{n}",
         "body": {"model": model,
                  "messages": [{"role": "user", "content": f"Large {n} [sim:latency=0.05] {noise[n]}"}]}}
        for n in range(count)
    ]


def _cost_nano(catalog: Catalog, results: list[dict]) -> int:
    total = 0
    for result in results:
        if result["status"] == "completed":
            usage = result["response"]["body"]["usage"]
            total += catalog.models[result["response"]["body"]["model"]].cost_nano(
                usage["prompt_tokens"], usage["completion_tokens"])
    return total


def _assert_exact(api: CountingApi, catalog: Catalog, batch: dict, lines: list[dict]) -> int:
    """The batch's counts are what its results say, each request appears once, and its cost is
    the sum of its completed requests'; answers that cost."""
    results = api.results(batch["id"])
    assert sorted(r["custom_id"] for r in results) == sorted(line["custom_id"] for line in lines)
    assert len({r["id"] for r in results}) == len(lines)
    by_status: dict[str, int] = {}
    for result in results:
        by_status[result["status"]] = by_status.get(result["status"], 0) + 1
    counts = batch["request_counts"]
    assert counts["total"] == len(lines)
    assert counts["completed"] == by_status.get("completed", 0), (counts, by_status)
    assert counts["failed"] == by_status.get("failed", 0), (counts, by_status)
    cost = _cost_nano(catalog, results)
    assert batch["cost_usd"] == round(cost / NANO_PER_USD, 9), (batch["cost_usd"], cost)
    return cost


def test_every_request_ends_once_with_exact_counts_and_cost_under_every_fault_at_once(start_stack, tmp_path, sim):
    seed = int(os.environ.get("LOCAL_AWS_FAULTS_SEED") or random.randrange(1 << 31))
    print(f"LOCAL_AWS_FAULTS={AWS_FAULTS} LOCAL_AWS_FAULTS_SEED={seed}")
    # Given a stack with every fault on, short leases and schedules, and two accounts
    catalog = _catalog(tmp_path / "catalog.json")
    stack: StackProcess = start_stack(
        tmp_path,
        UPSTREAM_BASE_URL=sim.base_url,
        MODEL_CATALOG_PATH=str(tmp_path / "catalog.json"),
        LOCAL_AWS_FAULTS=AWS_FAULTS,
        LOCAL_AWS_FAULTS_SEED=str(seed),
        BATCH_FAULT_CRASH_RATE="0.02",
        BATCH_LEASE_SECONDS="2",
        BATCH_DISPATCH_LEASE_SECONDS="3",
        BATCH_SCHEDULE_SECONDS="0.5",
        BATCH_RETRY_BASE_SECONDS="0.05",
        BATCH_RETRY_MAX_SECONDS="0.5",
    )
    store = StoredState(stack)
    first = CountingApi(stack.base_url, stack.key)
    second = CountingApi(stack.base_url, stack.create_key("chaos-b", tier="internal", concurrency=16))

    # When four batches run at once: one per account and model, one of both models to cancel
    # mid-run, and one created twice with the same Idempotency-Key (its first answer "lost")
    plan = {
        "a": (first, _lines("a", 300, MODELS[:1])),
        "b": (second, _lines("b", 300 - LARGE_REQUESTS, MODELS[1:]) + _large_lines("b", LARGE_REQUESTS, MODELS[1])),
        "c": (first, _lines("c", 300, MODELS)),
        "d": (second, _lines("d", 200 - LARGE_REQUESTS, MODELS[:1]) + _large_lines("d", LARGE_REQUESTS, MODELS[0])),
    }
    batches: dict[str, dict] = {}
    for name, (api, lines) in plan.items():
        headers = {"Idempotency-Key": f"chaos-{seed}-{name}"} if name == "d" else {}
        answer = api.post("/batches", json={"requests": lines, "metadata": {"batch": name}}, headers=headers)
        assert answer.status_code == 200, answer.text
        batches[name] = answer.json()
    quota_nano = QUOTA_REQUESTS * predicted_cost_nano(QUOTA_CONTENT, MODELS[0])
    third = CountingApi(stack.base_url, stack.create_key("chaos-q", tier="internal", concurrency=QUOTA_CONCURRENCY,
                                                         daily_quota_usd=quota_nano / NANO_PER_USD))
    quota_lines = [{"custom_id": f"e-{n}", "body": {"model": MODELS[0], "messages": [
        {"role": "user", "content": QUOTA_CONTENT}]}} for n in range(100)]
    answer = third.post("/batches", json={"requests": quota_lines})
    assert answer.status_code == 200, answer.text
    quota_batch = answer.json()["id"]
    again = second.post("/batches", json={"requests": plan["d"][1], "metadata": {"batch": "d"}},
                        headers={"Idempotency-Key": f"chaos-{seed}-d"})
    assert again.status_code == 200 and again.json()["id"] == batches["d"]["id"], again.text
    assert again.headers.get("Idempotent-Replayed") == "true"

    wait_for(lambda: first.batch(batches["c"]["id"])["request_counts"]["completed"] >= 40,
             timeout=240, interval=1.0, message="batch c to be under way")
    cancelled = first.post(f"/batches/{batches['c']['id']}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] in ("cancelling", "cancelled"), cancelled.text

    finals: dict[str, dict] = {}
    finish_by = time.monotonic() + FINISH_SECONDS
    for name, (api, _) in plan.items():
        finals[name] = wait_for(lambda a=api, b=batches[name]["id"]: (x := a.batch(b))["status"] in FINAL and x,
                                timeout=max(1.0, finish_by - time.monotonic()), interval=2.0,
                                message=f"batch {name} to finish")

    # Then the three that ran to their end completed every request, and the cancelled one stopped
    for name in ("a", "b", "d"):
        assert finals[name]["status"] == "completed", finals[name]
        assert finals[name]["request_counts"]["completed"] == len(plan[name][1]), finals[name]
    assert finals["c"]["status"] == "cancelled", finals["c"]
    assert 40 <= finals["c"]["request_counts"]["completed"] < len(plan["c"][1]), finals["c"]
    assert finals["c"]["request_counts"]["failed"] == 0, finals["c"]

    # And each batch's counts are what its results say, and its cost the sum of its requests'
    costs = {name: _assert_exact(api, catalog, finals[name], plan[name][1]) for name, (api, _) in plan.items()}
    # And every faulty request was tried at least twice: the upstream faults did happen
    tried = [sim.attempts_by_request.get(f"{batches['a']['id']}:{p}", 0) for p in range(len(plan["a"][1]))]
    assert all(n >= (2 if p % FAULTY_EVERY in (0, 3, 6) else 1) for p, n in enumerate(tried)), tried

    # And the deleted batch goes, items and objects, and nothing else does
    assert second.delete(f"/batches/{batches['d']['id']}").status_code == 200
    store.wait_until_purged(second, batches["d"]["id"], timeout=60)
    for name in ("a", "b", "c"):
        assert store.items(batches[name]["id"]), name

    # And each account lists its own batches only, the deleted one no more
    listed = {name: {b["id"] for b in api.get("/batches", params={"limit": 100}).json()["data"]}
              for name, api in (("dev", first), ("chaos-b", second))}
    assert listed == {"dev": {batches["a"]["id"], batches["c"]["id"]}, "chaos-b": {batches["b"]["id"]}}, listed

    # And each account's day of usage is the sum over its batches, the deleted one's included
    day = clock.utc_day(finals["a"]["created_at"])
    assert all(clock.utc_day(f["completed_at"] or f["cancelled_at"]) == day for f in finals.values()), finals
    assert store.usage_nano("dev", day) == costs["a"] + costs["c"]
    assert store.usage_nano("chaos-b", day) == costs["b"] + costs["d"]

    # And the quota account paused with its usage at most its requests in flight past the quota,
    # counted by the service and answered by the upstream (once a request: a run that died after
    # its answer re-runs it, which the upstream charges twice and the service once), and charged
    # exactly what its completed requests cost. (Its key's API calls answer 429 now: the store is read.)
    # A run that died after its answer and before its settle (the `after upstream call` crash
    # point) leaves a request the upstream answered and the service did not count, its slot taken
    # back after the lease for another chain: past the quota the upstream answered at most the
    # requests in flight and those, which stay unfinished to run again once the quota renews.
    paused = wait_for(lambda: (x := store.meta(quota_batch)).get("running", 0) == 0
                      and store.usage_nano("chaos-q", day) >= quota_nano and x,
                      timeout=60, interval=1.0, message="the quota account's batch to pause")
    assert paused["status"] == "in_progress", paused
    charged = store.usage_nano("chaos-q", day)
    answered, dearest = answered_cost_nano(sim, {quota_batch}, once=True)
    assert charged - quota_nano <= QUOTA_CONCURRENCY * dearest, (charged, quota_nano, dearest)
    items = {int(r["sk"].removeprefix("REQ#")): r for r in store.request_items(quota_batch)}
    completed = [r for r in items.values() if r["status"] == "completed"]
    answered_positions = {int(ref.split(":")[1]) for ref, *_ in list(sim.answered) if ref.startswith(f"{quota_batch}:")}
    lost = sorted(answered_positions - {int(r["sk"].removeprefix("REQ#")) for r in completed})
    assert not [p for p in lost if items.get(p, {}).get("status") == "failed"], [items[p] for p in lost]
    assert answered - quota_nano <= (QUOTA_CONCURRENCY + len(lost)) * dearest, (answered, quota_nano, dearest, lost)
    assert charged == int(paused.get("cost_nano", 0)) == sum(int(r["cost_nano"]) for r in completed), (charged, paused)
    assert paused["completed"] == len(completed), paused
    assert third.get(f"/batches/{quota_batch}").status_code == 429

    # And it stays so while the sweep runs on (every 0.5 s) and late duplicates arrive
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        for name in ("a", "b", "c"):
            api = plan[name][0]
            assert api.batch(batches[name]["id"])["request_counts"] == finals[name]["request_counts"]
        time.sleep(0.5)

    # And no API answer was a 5xx other than 503 with Retry-After
    errors = first.server_errors + second.server_errors + third.server_errors
    assert not errors, errors
    # And the AWS faults did happen, each of them
    injected = json.loads(stack.admin("faults").stdout)
    print("faults injected:", json.dumps(injected, sort_keys=True), "503s retried:",
          first.retried_503 + second.retried_503)
    for spec in AWS_FAULTS.split(","):
        assert injected[spec.split("=")[0]] > 0, (spec, injected)
