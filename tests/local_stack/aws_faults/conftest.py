"""The fixture of the AWS faults' tests: an in-process MotoServer injecting the faults asked for."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from botocore.retries.standard import ExponentialBackoff
from freeinference_batch_local.aws_faults.config import parse_faults
from freeinference_batch_local.moto.server import MotoServer

from tests.local_stack.aws_faults.calls import SEED


@pytest.fixture(autouse=True)
def short_throttle_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore waits up to 1, 2, 4... s after a throttle; these tests throttle on purpose, many
    times, and assert what the caller sees, not how long botocore sleeps: the 50 ms scale of its
    other retries keeps them to seconds without changing which calls are retried."""
    scales = dict(ExponentialBackoff._DEFAULT_BACKOFF_CONFIG)
    scales["throttling_base_scale"] = scales["non_throttling_base_scale"]
    monkeypatch.setattr(ExponentialBackoff, "_DEFAULT_BACKOFF_CONFIG", scales)


@pytest.fixture
def moto() -> Iterator[Callable[..., str]]:
    """`moto("name=value,...", seed=SEED)` starts a MotoServer injecting those faults; its endpoint."""
    servers: list[MotoServer] = []

    def start(faults: str, seed: str = SEED) -> str:
        server = MotoServer(faults=parse_faults(faults, seed))
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop()
