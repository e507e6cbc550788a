"""How many large requests a worker invocation holds at once, and that a large one waits its turn."""

from __future__ import annotations

import threading

from freeinference_batch import upstream
from freeinference_batch.settings import Settings
from freeinference_batch.store.batch_table import CHUNK_CACHE_BYTES
from freeinference_batch.worker.memory import (
    LARGE_BYTES,
    MIB,
    RECORD_THREADS,
    LargeRequests,
    large_permits,
    large_request_bytes,
)


def permits_at(memory_mb: int) -> int:
    settings = Settings()
    return large_permits(memory_mb * MIB, RECORD_THREADS, CHUNK_CACHE_BYTES, settings.batch_max_body_bytes,
                         upstream.MAX_RESPONSE_BYTES)


def test_the_worst_case_fits_the_function_memory_the_permits_are_sized_for():
    settings = Settings()
    largest = large_request_bytes(settings.batch_max_body_bytes, upstream.MAX_RESPONSE_BYTES)
    small_threads = RECORD_THREADS * 8.5 * LARGE_BYTES
    for memory_mb in (512, 1024, 3008):
        permits = permits_at(memory_mb)
        assert permits >= 2
        assert 110 * MIB + CHUNK_CACHE_BYTES + small_threads + permits * largest <= memory_mb * MIB
    assert permits_at(1024) > permits_at(512)


def test_a_function_too_small_for_one_large_request_still_runs_them_one_at_a_time():
    assert permits_at(256) == 1


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
