"""The catalog's one sizing number per model, batch_concurrency, and what follows from it."""

from __future__ import annotations

import pytest
from freeinference_batch.core.catalog import Catalog, ModelInfo
from pydantic import ValidationError


def _model(batch_concurrency: int) -> ModelInfo:
    return ModelInfo(input_usd_per_million_tokens=0.1, output_usd_per_million_tokens=0.4, tiers=["internal"],
                     batch_concurrency=batch_concurrency)


@pytest.mark.parametrize(("capacity", "workers"), [(1, 2), (4, 8), (16, 32), (64, 128), (128, 256), (500, 1000)])
def test_a_worker_reserves_twice_the_batch_capacity(capacity: int, workers: int) -> None:
    assert _model(capacity).worker_concurrency == workers


@pytest.mark.parametrize(("capacity", "batch_size", "window"),
                         [(1, 10, 0), (4, 10, 0), (10, 10, 0), (11, 11, 1), (24, 24, 1), (25, 24, 1), (500, 24, 1)])
def test_an_invocation_runs_up_to_the_capacity_in_chains_with_a_window_only_above_ten(
        capacity: int, batch_size: int, window: int) -> None:
    # Lambda refuses an SQS BatchSize over 10 without a batching window of at least 1 s.
    assert (_model(capacity).worker_batch_size, _model(capacity).worker_batching_window_seconds) == (batch_size, window)


def test_a_capacity_one_worker_cannot_serve_is_refused_naming_the_limit() -> None:
    with pytest.raises(ValidationError) as refused:
        Catalog.model_validate({"models": {"big-model": {
            "input_usd_per_million_tokens": 0.1, "output_usd_per_million_tokens": 0.4, "tiers": ["internal"],
            "batch_concurrency": 501}}})
    message = str(refused.value)
    assert "big-model" in message and "batch_concurrency 501 is over 500" in message
    assert "MaximumConcurrency is at most 1000" in message
