"""Writes whose answer was lost, so that botocore sent them again: each plain write applied, then
the same request once more, answered by its second run (as DynamoDB answers a re-sent write).
Every conditional write must recognise its own earlier success, and a batch must still end with
exact counts and cost, without the sweep having to rescue a chain."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
from freeinference_batch.core import aws

from tests.conftest import sample_request
from tests.service.worker.helpers import meta_of, one_cost, usage_today

PLAIN_WRITES = ("update_item", "put_item", "delete_item")


@pytest.fixture
def resent_writes(harness, monkeypatch) -> list[str]:
    """From now on every plain DynamoDB write of the service is applied, then re-sent."""
    client = aws.dynamodb()
    resent: list[str] = []

    def applied_then_resent(name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def both(**kwargs: Any) -> Any:
            # A write that failed the first time fails (or not) alike when re-sent.
            with contextlib.suppress(Exception):
                call(**kwargs)
            resent.append(name)
            return call(**kwargs)

        return both

    for name in PLAIN_WRITES:
        monkeypatch.setattr(client, name, applied_then_resent(name, getattr(client, name)))
    return resent


def test_a_batch_whose_every_plain_write_is_resent_ends_with_exact_counts(harness, resent_writes):
    # Given a batch long enough that its chains hand over from request to request
    requests = [sample_request(f"q-{i}") for i in range(12)]
    batch = harness.create(requests)
    # When it runs with every settle, claim, slot write and renewal re-sent after a lost answer
    final = harness.run_to_final(batch["id"], timeout=60)
    # Then it completes without the sweep, each request once, and its counts and cost are exact
    assert "update_item" in resent_writes
    assert final["status"] == "completed", final
    assert final["request_counts"] == {"total": 12, "completed": 12, "failed": 0}, final
    results = harness.results(batch["id"])
    assert sorted(r["custom_id"] for r in results) == sorted(r["custom_id"] for r in requests)
    assert all(r["status"] == "completed" for r in results), results
    cost = 12 * one_cost("Say hello.")
    assert meta_of(harness, batch["id"]).cost_nano == cost == usage_today(harness)
