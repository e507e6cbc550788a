"""Fixtures the worker's test modules share: a worker, and a stub upstream answering what a test
sets."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from freeinference_batch.worker import Worker

from tests.conftest import StubUpstream


@pytest.fixture
def worker(harness) -> Worker:
    return Worker(harness.settings)


@pytest.fixture
def stub(harness) -> Iterator[StubUpstream]:
    server = StubUpstream()
    harness.configure(UPSTREAM_BASE_URL=server.base_url)
    yield server
    server.stop()
