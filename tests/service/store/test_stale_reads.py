"""Eventually consistent reads that lag: the service must be right when such a read answers an
older version of an item, or nothing for an item written a moment ago (DynamoDB's replicas
usually catch up within a second; docs/ARCHITECTURE.md lists every such read)."""

from __future__ import annotations

from typing import Any

import pytest
from freeinference_batch.core import aws

from tests.conftest import sample_request


@pytest.fixture
def lagging_get_item(harness, monkeypatch) -> list[dict]:
    """Every eventually consistent GetItem answers as a replica that has not caught up yet."""
    client = aws.dynamodb()
    real = client.get_item
    missed: list[dict] = []

    def lagging(**kwargs: Any) -> dict:
        if kwargs.get("ConsistentRead"):
            return real(**kwargs)
        missed.append(kwargs["Key"])
        return {}

    monkeypatch.setattr(client, "get_item", lagging)
    return missed


def test_a_worker_that_reads_a_fresh_batch_from_a_lagging_replica_reads_it_again(harness, lagging_get_item):
    # Given a batch whose input chunk and lane positions no eventually consistent read can see yet
    batch = harness.create([sample_request(f"q-{i}") for i in range(6)])
    # When it runs
    final = harness.run_to_final(batch["id"])
    # Then every request ran once, from a consistent read of what create wrote
    assert any(key["sk"]["S"].startswith("IN#") for key in lagging_get_item)
    assert any(key["sk"]["S"].startswith("LANEPOS#") for key in lagging_get_item)
    assert final["status"] == "completed" and final["request_counts"]["completed"] == 6, final
