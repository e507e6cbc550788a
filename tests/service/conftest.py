"""Fixtures the service's test modules share (the moto harness itself is tests/conftest.py)."""

from __future__ import annotations

import pytest
from freeinference_batch_local.handlers import load_module, repo_root


@pytest.fixture
def one_worker_thread(monkeypatch) -> None:
    """moto in-process is not thread-safe (a cancelled transaction restores a snapshot of the whole
    table, undoing another thread's writes), so the worker runs its records one at a time: for
    tests whose worker runs a batch's records through the handler
    (`pytestmark = pytest.mark.usefixtures("one_worker_thread")`)."""
    module = load_module(repo_root() / "functions" / "worker" / "app.py")
    monkeypatch.setattr(module, "RECORD_THREADS", 1)
