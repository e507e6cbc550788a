"""Chaos on the local stack: transient upstream faults, duplicated messages and killed workers,
all at once, and still every request ends once with exact counts and cost.

- 30% of the requests fail their first attempt with 503 (`[sim:fail=503*1]`);
- LOCAL_AWS_FAULTS=sqs.duplicate=0.2: SQS delivers a fifth of the messages the workers receive
  twice (the same MessageId, another receipt handle), as its at-least-once delivery may;
- BATCH_FAULT_CRASH_RATE=0.05: at each of the worker's crash points (after the claim, after the
  upstream call, after the settle) 5% of runs die as a killed Lambda would: no cleanup, the
  message is not deleted; short leases let the sweep take such requests back quickly.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

# tests/e2e is not a package: pytest imports its conftest as the top-level module `conftest`.
from conftest import StackProcess, wait_for
from freeinference_batch import clock
from freeinference_batch.catalog import NANO_PER_USD, Catalog, load_catalog
from freeinference_batch.store.accounts_table import usage_item_key
from freeinference_batch.store.dynamo import from_item
from freeinference_batch_local.upstream_sim import UpstreamSimulator

# 500 requests through a moto server that serves one call at a time: minutes on a busy 2-core machine.
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(480)]

MODEL = "glm-5.3-flash"
REQUESTS = 500
FAULTY_EVERY = 10  # positions 0, 3, 6 of every 10: 30% fail once


def _faulty(position: int) -> bool:
    return position % FAULTY_EVERY in (0, 3, 6)


def _catalog(path: Path) -> Catalog:
    """The packaged catalog with more batch slots per model, so 500 requests run in about a minute."""
    data = json.loads(load_catalog().model_dump_json())
    for model in data["models"].values():
        model["batch_concurrency"] = 16
    path.write_text(json.dumps(data))
    return Catalog.model_validate(data)


def _usage_nano(stack: StackProcess, account_id: str, day: str) -> int:
    env = json.loads(stack.state_file.read_text())["env"]
    client = boto3.client(
        "dynamodb",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name=env.get("AWS_DEFAULT_REGION", "us-east-1"),
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )
    answer = client.get_item(
        TableName=env["ACCOUNTS_TABLE_NAME"], Key=usage_item_key(account_id, day), ConsistentRead=True
    )
    return int((from_item(answer.get("Item")) or {}).get("cost_nano", 0))


@pytest.fixture
def sim() -> Iterator[UpstreamSimulator]:
    """The simulated upstream in this process, so the test can count the attempts it saw."""
    simulator = UpstreamSimulator()
    simulator.start()
    yield simulator
    simulator.stop()


def test_faults_duplicates_and_crashes_leave_every_request_final_with_exact_counts_and_cost(start_stack, tmp_path, sim):
    # Given a stack with every fault injected and short leases and schedules
    catalog = _catalog(tmp_path / "catalog.json")
    stack = start_stack(
        tmp_path,
        UPSTREAM_BASE_URL=sim.base_url,
        MODEL_CATALOG_PATH=str(tmp_path / "catalog.json"),
        LOCAL_AWS_FAULTS="sqs.duplicate=0.2",
        LOCAL_AWS_FAULTS_SEED="1",
        BATCH_FAULT_CRASH_RATE="0.05",
        BATCH_LEASE_SECONDS="2",
        BATCH_DISPATCH_LEASE_SECONDS="3",
        BATCH_SCHEDULE_SECONDS="0.5",
        BATCH_RETRY_BASE_SECONDS="0.05",
        BATCH_RETRY_MAX_SECONDS="0.5",
    )
    api = stack.api()
    items = [
        {
            "custom_id": f"c-{position}",
            "body": {
                "model": MODEL,
                "messages": [
                    {
                        "role": "user",
                        "content": f"Chaos {position} [sim:latency=0.05]"
                        + (" [sim:fail=503*1]" if _faulty(position) else ""),
                    }
                ],
            },
        }
        for position in range(REQUESTS)
    ]
    answer = api.create_batch(items)
    assert answer.status_code == 200, answer.text
    batch_id = answer.json()["id"]

    # When it runs to its end
    # (polled every 2 s: the local moto server serializes calls, and a tight poll would compete with the work)
    final = wait_for(
        lambda: (b := api.batch(batch_id))["status"] in ("completed", "failed", "expired", "cancelled") and b,
        timeout=420,
        interval=2.0,
        message="the chaos batch to finish",
    )

    # Then every request succeeded exactly once, and the counts say so
    assert final["status"] == "completed", final
    assert final["request_counts"] == {"total": REQUESTS, "completed": REQUESTS, "failed": 0}
    results = api.results(batch_id)
    assert [r["custom_id"] for r in results] == [f"c-{p}" for p in range(REQUESTS)]
    assert {r["status"] for r in results} == {"completed"}
    assert len({r["id"] for r in results}) == REQUESTS
    # And the cost is the sum of the per-result costs: each completed request charged once
    cost_nano = 0
    for result in results:
        usage = result["response"]["body"]["usage"]
        cost_nano += catalog.models[MODEL].cost_nano(usage["prompt_tokens"], usage["completion_tokens"])
    assert final["cost_usd"] == round(cost_nano / NANO_PER_USD, 9)
    # And the faults did happen: every faulty request was tried at least twice (a worker killed
    # after its upstream call makes a request be tried once more)
    tried = [sim.attempts_by_request.get(f"{batch_id}:{p}", 0) for p in range(REQUESTS)]
    assert all(n >= (2 if _faulty(p) else 1) for p, n in enumerate(tried)), tried
    assert sum(tried) >= REQUESTS + sum(map(_faulty, range(REQUESTS)))
    # and SQS delivered messages twice
    assert json.loads(stack.admin("faults").stdout)["sqs.duplicate"] > 0
    # And the account's usage for the day grew by exactly that (the only batch on this stack)
    assert _usage_nano(stack, "dev", clock.utc_day(final["completed_at"])) == cost_nano
    # And it stays so: late duplicates and the sweep change nothing afterwards
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        again = api.batch(batch_id)
        assert again["request_counts"] == final["request_counts"] and again["cost_usd"] == final["cost_usd"]
        time.sleep(0.2)
