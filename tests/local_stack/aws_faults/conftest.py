"""The fixture of the AWS faults' tests: an in-process MotoServer injecting the faults asked for."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from freeinference_batch_local.aws_faults.config import parse_faults
from freeinference_batch_local.moto.server import MotoServer

from tests.local_stack.aws_faults.calls import SEED


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
