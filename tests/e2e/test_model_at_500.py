"""A model sized at 500 slots, the most one number per model allows (catalog.MAX_BATCH_CONCURRENCY),
deployed as README "Sizing a model" says (its catalog entry and its template block), runs 500
requests at once on the local stack, with its slots held in a few dozen blocks, not 500 entries.

The stack runs in this process (`LocalStack`, its functions in execution environments as ever) on
a copy of template.yaml sized for 500, and is driven over HTTP. Its slots items are read from its
moto server directly, without the service's user agent, so the reads are never faulted.
"""

from __future__ import annotations

import math
import subprocess
import threading
import time
from pathlib import Path

import boto3
import requests
from conftest import ADMIN_COMMAND, REPO, wait_for
from freeinference_batch.core.catalog import ModelInfo
from freeinference_batch.store.dynamo import from_item
from freeinference_batch.store.leases import account_slots_key, model_slots_key, slots_held
from freeinference_batch_local.sizing import write_catalog, write_sized_template
from freeinference_batch_local.stack import LocalStack

MODEL = "glm-5.3-flash"
SLOTS = 500
# Every request is held at the simulated upstream until all 500 are there at once, however long
# the stack takes to start them (the worker's execution environments and every chain's claim are
# served one moto call at a time on this machine's two cores: about 50 s on a loaded CI run).
GATE = "all-500"
RAMP_UP_DEADLINE_SECONDS = 240


def test_a_model_sized_at_500_runs_500_requests_at_once_in_a_few_dozen_blocks(tmp_path: Path) -> None:
    # Given the model granted 500 batch slots, its worker sized for them, and an account allowed 1,000
    catalog = write_catalog(REPO, tmp_path, SLOTS, [MODEL])
    template = write_sized_template(REPO, tmp_path, SLOTS, MODEL)
    sized = ModelInfo(input_usd_per_million_tokens=0, output_usd_per_million_tokens=0, tiers=[],
                      batch_concurrency=SLOTS)
    stack = LocalStack(port=0, template_path=template, state_dir=tmp_path,
                       env={"MODEL_CATALOG_PATH": str(catalog), "BATCH_SCHEDULE_SECONDS": "5",
                            "POWERTOOLS_METRICS_DISABLED": "true", "POWERTOOLS_LOG_LEVEL": "WARNING"})
    with stack:
        # (the worker's event source runs the sizes the catalog derives from 500)
        poller = stack.pollers["GlmFlashModel/WorkerFunction"].stats()
        assert (poller["batch_size"], poller["max_batching_window"], poller["max_concurrency"]) == (
            sized.worker_batch_size, sized.worker_batching_window_seconds, sized.worker_concurrency), poller
        subprocess.run([*ADMIN_COMMAND, "set-account", "dev", "--concurrency", str(2 * SLOTS)], cwd=tmp_path,
                       check=True, capture_output=True, timeout=60)
        table = stack.env["ACCOUNTS_TABLE_NAME"]
        dynamodb = boto3.client("dynamodb", endpoint_url=stack.moto_endpoint, region_name="us-east-1",
                                aws_access_key_id="test", aws_secret_access_key="test")

        def slots(key: dict) -> dict:
            return from_item(dynamodb.get_item(TableName=table, Key=key, ConsistentRead=True).get("Item")) or {}

        # When a batch of 500 requests runs (the worker's poller held while it is
        # created: its 500 chains' first claims and the worker environments' cold starts would
        # otherwise queue the create's own calls behind them at the one moto server, past the
        # API's 29 s on a loaded machine; the run, not the create, is what this test is about)
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {stack.dev_key}"
        worker_poller = stack.pollers["GlmFlashModel/WorkerFunction"]
        worker_poller.pause()
        try:
            created = session.post(f"{stack.base_url}/batches", timeout=30, json={"requests": [
                {"custom_id": f"r-{n}", "body": {"model": MODEL, "messages": [
                    {"role": "user", "content": f"[sim:gate={GATE}] request {n}"}]}}
                for n in range(SLOTS)]})
        finally:
            worker_poller.resume()
        assert created.status_code == 200, created.text
        batch_id = created.json()["id"]
        samples: list[tuple[int, int, int, int]] = []  # model's held and entries, account's held and entries
        done = threading.Event()
        started = time.monotonic()
        first_at: dict[int, float] = {}  # slots held -> when first seen (a failure's diagnosis)

        def sample() -> None:
            while not done.is_set():
                model_item, account_item = slots(model_slots_key(MODEL)), slots(account_slots_key("dev"))
                samples.append((slots_held(model_item), len(model_item.get("leases", {})),
                                slots_held(account_item), len(account_item.get("leases", {}))))
                first_at.setdefault(samples[-1][0], round(time.monotonic() - started, 1))
                time.sleep(0.25)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            # (the upstream answers once all 500 are in flight at once, or at the deadline)
            upstream = stack.upstream
            try:
                wait_for(lambda: upstream.concurrent >= SLOTS, timeout=RAMP_UP_DEADLINE_SECONDS, interval=0.25,
                         message=f"{SLOTS} requests at the upstream at once")
            except AssertionError as error:
                raise AssertionError(f"{error}; first seen (held: s) {sorted(first_at.items())}") from None
            finally:
                upstream.open_gate(GATE)
            final = wait_for(lambda: (b := session.get(f"{stack.base_url}/batches/{batch_id}", timeout=30).json())
                             ["status"] in ("completed", "failed", "expired", "cancelled") and b,
                             timeout=300, interval=1.0, message="the batch to finish")
        finally:
            done.set()
            sampler.join(10)

        # Then every request completed once
        assert final["status"] == "completed" and final["request_counts"] == {
            "total": SLOTS, "completed": SLOTS, "failed": 0}, final
        page = session.get(f"{stack.base_url}/batches/{batch_id}/results?limit=1000", timeout=30).json()
        assert sorted(line["custom_id"] for line in page["data"]) == sorted(f"r-{n}" for n in range(SLOTS))
        # And all 500 ran at once, never more than the model's slots, held by a few dozen blocks
        # (about one per worker invocation: its SQS batch is 24 records), each counted in both items
        assert upstream.max_concurrent == SLOTS
        peak = max(samples)
        assert peak[0] == SLOTS, f"at most {peak[0]} held at once; first seen (held: s) {sorted(first_at.items())}"
        assert all(held <= SLOTS for held, _, _, _ in samples)
        invocations = math.ceil(SLOTS / sized.worker_batch_size)
        at_peak = [entries for held, entries, _, _ in samples if held == SLOTS]
        assert max(at_peak) <= 2 * invocations, f"{max(at_peak)} entries for {SLOTS} slots"
        assert max(held for _, _, held, _ in samples) == SLOTS
        assert max(entries for _, _, _, entries in samples) <= 2 * invocations
        # And once it is over, nothing is held: the last chains give their slots back just after
        # the counting transaction that lets the batch complete, and claims that read the batch
        # before it completed give back what they took
        def nothing_held() -> bool:
            model_item, account_item = slots(model_slots_key(MODEL)), slots(account_slots_key("dev"))
            return not (slots_held(model_item) or slots_held(account_item) or model_item.get("leases")
                        or account_item.get("leases"))

        wait_for(nothing_held, timeout=30, interval=0.2, message="every slot given back, every block's entry gone")
