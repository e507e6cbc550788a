"""How many large requests a worker invocation holds at once, and that a large one waits its turn."""

from __future__ import annotations

import threading

from freeinference_batch.core.settings import Settings
from freeinference_batch.store.caches import CHUNK_CACHE_BYTES
from freeinference_batch.worker import upstream
from freeinference_batch.worker.memory import (
    BASELINE_BYTES,
    FUNCTION_MEMORY_MB,
    LARGE_BYTES,
    MIB,
    RECORD_THREADS,
    LargeRequests,
    large_permits,
    large_request_bytes,
)

MAX_BODY = Settings().batch_max_body_bytes


def permits_at(memory_mb: int) -> int:
    return large_permits(memory_mb * MIB, RECORD_THREADS, CHUNK_CACHE_BYTES, MAX_BODY, upstream.MAX_RESPONSE_BYTES)


def test_the_worst_case_fits_the_memory_the_permits_are_sized_for():
    largest = large_request_bytes(MAX_BODY, upstream.MAX_RESPONSE_BYTES)
    every_thread_small = RECORD_THREADS * large_request_bytes(LARGE_BYTES, LARGE_BYTES)
    for memory_mb in (FUNCTION_MEMORY_MB, 512, 1024, 3008):
        permits = permits_at(memory_mb)
        assert permits >= 1
        assert BASELINE_BYTES + CHUNK_CACHE_BYTES + every_thread_small + permits * largest <= memory_mb * MIB
    assert permits_at(1024) > permits_at(512) > permits_at(FUNCTION_MEMORY_MB)


def test_a_function_too_small_for_one_large_request_still_runs_them_one_at_a_time():
    assert permits_at(128) == 1


def test_a_large_request_waits_for_a_permit_and_a_small_one_never_does():
    large = LargeRequests(1)
    second_has_it = threading.Event()
    with large.permit() as first:
        first.hold(LARGE_BYTES + 1)

        def second() -> None:
            with large.permit() as permit:
                permit.hold(LARGE_BYTES + 1)
                second_has_it.set()

        waiting = threading.Thread(target=second)
        waiting.start()
        assert not second_has_it.wait(0.2)  # the first still holds the only permit
        with large.permit() as small:
            small.hold(LARGE_BYTES)  # at the threshold: not large
            assert not small.held
    assert second_has_it.wait(5)
    waiting.join(5)
    with large.permit() as again:  # given back by both
        again.hold(LARGE_BYTES + 1)
        assert again.held
