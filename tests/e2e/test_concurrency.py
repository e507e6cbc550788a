"""How many requests run at once, and who goes first, on the local stack (the spec's "How batches
run"): a model runs fewer batch requests while its interactive load is high, an account's
concurrency limit caps its running requests, and a small batch behind a large one finishes first.

The stacks call a simulated upstream in this test process (conftest.py's `sim`), whose counters
(the most chat requests it served at once) the tests read directly.
"""

from __future__ import annotations

import pytest

# tests/e2e is not a package: pytest imports its conftest, and its tests their helpers, as top-level modules.
from conftest import Api, wait_for
from engine_helpers import FINAL, FLASH, item, statuses, submit, wait_final, wait_status
from freeinference_batch_local.upstream_sim import UpstreamSimulator

pytestmark = pytest.mark.e2e


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
