"""How many requests run at once, and who goes first, on the local stack (the spec's "How batches
run"): a model runs fewer batch requests while its interactive load is high, an account's
concurrency limit caps its running requests, and a small batch behind a large one finishes first.
A batch none of whose requests can start because others hold the account's or the model's slots
says so (`waiting`, issue 33: seen in the EventBridge events, as its wait may be short); one
filling its own share never does.

The stacks call a simulated upstream in this test process (conftest.py's `sim`), whose counters
(the most chat requests it served at once) the tests read directly.
"""

from __future__ import annotations

import pytest

# tests/e2e is not a package: pytest imports its conftest, and its tests their helpers, as top-level modules.
from conftest import Api, wait_for
from engine_helpers import FINAL, FLASH, POLL, QWEN, item, statuses, submit, wait_final, wait_status
from freeinference_batch_local.upstream_sim import UpstreamSimulator
from stored_state import BusEvents, StoredState

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


WAITING, STATUS = "Batch Waiting Change", "Batch Status Change"


def _running_chains(store: StoredState, batch_id: str, chains: int) -> None:
    wait_for(lambda: store.meta(batch_id).get("running", 0) == chains, timeout=30, interval=POLL,
             message=f"{chains} chains of {batch_id} running")


def _told(events: BusEvents, batch_id: str, event: tuple[str, str, str | None]) -> list:
    """The batch's events, once `event` is among them."""
    return wait_for(lambda: event in (told := events.of(batch_id)) and told, timeout=30, interval=POLL,
                    message=f"{event} told of {batch_id}")


def test_a_batch_behind_its_accounts_other_batch_waits_for_concurrency_until_it_starts(engine, sim):
    # Given an account of 2 concurrent requests whose batch of slow requests holds both (4 chains
    # of 4 requests: a chain runs on without giving its slot back)
    events, store = BusEvents(engine, "waiting-concurrency"), StoredState(engine)
    api = engine.api(engine.create_key("conc-acct", tier="internal", concurrency=2))
    first = submit(api, [item(f"a-{i}", f"First {i} [sim:latency=1]") for i in range(16)])
    _running_chains(store, first["id"], 2)
    # When another batch of the account is submitted
    second = submit(api, [item(f"b-{i}", f"Second {i}") for i in range(2)])
    # Then it waits for the account's concurrency (told on the bus: its wait lasts until the
    # first batch's next hand-over yields it a slot)
    _told(events, second["id"], (WAITING, "validating", "concurrency"))
    # And its first start clears it; both batches complete
    assert wait_final(api, second["id"], timeout=60)["waiting"] is None
    assert wait_final(api, first["id"], timeout=60)["status"] == "completed"
    told = _told(events, second["id"], (STATUS, "completed", None))
    assert told.index((WAITING, "validating", "concurrency")) < told.index((STATUS, "in_progress", None))


def test_a_batch_behind_another_accounts_batch_waits_for_its_model_and_the_other_never_waits(engine, sim):
    # Given another account's batch filling the model's batch slots (4 chains of 4 slow requests)
    events, store = BusEvents(engine, "waiting-model"), StoredState(engine)
    filler = engine.api(engine.create_key("fill-acct", tier="internal"))
    filling = submit(filler, [item(f"f-{i}", f"Fill {i} [sim:latency=1]", model=QWEN) for i in range(16)])
    _running_chains(store, filling["id"], 4)
    # When a batch of another account is submitted on the same model
    api = engine.api(engine.create_key("behind-acct", tier="internal"))
    behind = submit(api, [item("b-0", "Behind", model=QWEN)])
    # Then it waits for its model until it gets its turn, and completes
    _told(events, behind["id"], (WAITING, "validating", "model_busy"))
    assert wait_final(api, behind["id"], timeout=60)["waiting"] is None
    # And the batch filling the model, whose yielding chain waited for a slot, was never waiting
    assert wait_final(filler, filling["id"], timeout=60)["status"] == "completed"
    assert _told(events, filling["id"], (STATUS, "completed", None)) == [(STATUS, "in_progress", None),
                                                                          (STATUS, "completed", None)]


def test_a_healthy_batch_filling_its_own_slots_is_never_waiting(engine, sim):
    # Given an account of 2 concurrent requests and a batch of 4 chains (2 wait at every turn)
    events = BusEvents(engine, "waiting-healthy")
    api = engine.api(engine.create_key("healthy-acct", tier="internal", concurrency=2))
    batch = submit(api, [item(f"h-{i}", f"Healthy {i} [sim:latency=0.2]") for i in range(12)])
    # When it runs, watched throughout
    seen: list[dict | None] = []

    def finished() -> bool:
        answer = api.batch(batch["id"])
        seen.append(answer["waiting"])
        return answer["status"] in FINAL

    wait_for(finished, timeout=60, interval=POLL, message="the batch to finish")
    # Then it completed and never showed a wait, in its answers or its events
    assert api.batch(batch["id"])["status"] == "completed" and len(seen) > 1 and not any(seen)
    assert _told(events, batch["id"], (STATUS, "completed", None)) == [(STATUS, "in_progress", None),
                                                                     (STATUS, "completed", None)]
