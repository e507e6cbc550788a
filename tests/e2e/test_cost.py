"""Exact cost on the local stack (the spec's "How batches run"): a batch's cost is its results'
usage times the catalog's prices, charged once to the account's day (read from the stack's moto
server).
"""

from __future__ import annotations

import pytest

# tests/e2e is not a package: pytest imports its conftest, and its tests their helpers, as top-level modules.
from engine_helpers import FLASH, QWEN, expected_cost_nano, item, submit, wait_final
from freeinference_batch.core import clock
from freeinference_batch.core.catalog import NANO_PER_USD
from stored_state import StoredState

pytestmark = pytest.mark.e2e


def test_cost_is_usage_times_prices_and_charged_once_to_the_day(engine):
    # Given an account with no usage yet, and a batch over two models with replies of several sizes
    api = engine.api(engine.create_key("cost-acct", tier="internal"))
    store = StoredState(engine)
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
