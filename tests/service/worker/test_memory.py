"""How many large requests a worker invocation holds at once, and that a large one waits its turn;
on moto, that a worker holds a request as bytes (its memory bounded by the body's size), that
large answers take turns for the invocation's memory, that a large request takes its permit
before its input is decompressed, and that small ones take none."""

from __future__ import annotations

import gzip
import json
import threading
import tracemalloc
from concurrent.futures import ThreadPoolExecutor

from freeinference_batch.core.settings import Settings
from freeinference_batch.store import input_chunks
from freeinference_batch.store.caches import CHUNK_CACHE_BYTES
from freeinference_batch.worker import Done, Worker, runner, upstream
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

from tests.conftest import sample_request
from tests.service.worker.helpers import NO_RECORD, message_for

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


def test_a_worker_holds_a_request_as_bytes_in_memory_bounded_by_its_size(harness, stub):
    # Given an accepted request whose body parses into far more memory than its JSON takes
    # (2.4 million empty arrays: 7 MB of JSON, about 150 MB of Python lists)
    fragments = b"[]," * 2_400_000
    body = (b'{"requests":[{"custom_id":"big","body":{"model":"glm-5.3-flash","messages":['
            + fragments + b'{"role":"user","content":"hi"}]}}]}')
    status, answer = harness.call("POST", "/v1/batches", raw=gzip.compress(body, 6),
                                  headers={"content-encoding": "gzip"})
    assert status == 200, answer
    stub.answer = json.dumps({"object": "chat.completion", "choices": [{"message": {"content": "ok"}}],
                              "usage": {"prompt_tokens": 3, "completion_tokens": 1}}).encode()
    # When a worker runs it, measured by tracemalloc
    tracemalloc.start()
    try:
        outcome = Worker(harness.settings).process(message_for(harness, answer["id"], 0), NO_RECORD)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Then it was sent whole, and the worker's peak memory stayed a small multiple of the body's size
    assert isinstance(outcome, Done)
    sent = b'{"model":"glm-5.3-flash","messages":[' + fragments + b'{"role":"user","content":"hi"}]}'
    assert stub.received == [len(sent)]
    assert peak < 4 * len(body), f"peak {peak / 1e6:.0f} MB for a {len(body) / 1e6:.0f} MB request"
    assert harness.batch(answer["id"])["request_counts"]["completed"] == 1


class CountingPermits(LargeRequests):
    """The invocation's permits, counting how many are held at most at once."""

    def __init__(self, permits: int) -> None:
        super().__init__(permits)
        self.held = self.most_held = self.taken = 0
        self._count = threading.Lock()
        free = self._free
        counting = self

        class Counted:
            def acquire(self) -> None:
                free.acquire()
                with counting._count:
                    counting.held += 1
                    counting.taken += 1
                    counting.most_held = max(counting.most_held, counting.held)

            def release(self) -> None:
                with counting._count:
                    counting.held -= 1
                free.release()

        self._free = Counted()  # type: ignore[assignment]


def test_large_answers_take_turns_for_the_invocations_memory_and_all_complete(harness, stub, monkeypatch):
    # Given three requests whose answers are 2 MiB each (above LARGE_BYTES), and a worker with
    # one permit for large requests
    stub.answer = json.dumps({"object": "chat.completion", "choices": [{"message": {"content": "x" * 2 * MIB}}],
                              "usage": {"prompt_tokens": 3, "completion_tokens": 1}}).encode()
    permits = CountingPermits(1)
    monkeypatch.setattr(runner, "large_requests", lambda *sizing: permits)
    batch = harness.create([sample_request(f"q-{n}") for n in range(3)])
    # When one invocation runs the three side by side
    with ThreadPoolExecutor(max_workers=3) as pool:
        outcomes = list(pool.map(lambda n: Worker(harness.settings).process(message_for(harness, batch["id"], n),
                                                                             NO_RECORD), range(3)))
    # Then each took the permit in turn, and every answer was kept
    assert all(isinstance(outcome, Done) for outcome in outcomes), outcomes
    assert (permits.taken, permits.most_held, permits.held) == (3, 1, 0)
    assert harness.batch(batch["id"])["request_counts"]["completed"] == 3
    assert all(line["response"]["body"]["choices"][0]["message"]["content"] == "x" * 2 * MIB
               for line in harness.results(batch["id"]))


def test_a_large_request_takes_its_permit_before_its_input_is_decompressed(harness, stub, monkeypatch):
    # Given a request whose body is over LARGE_BYTES, beside a small one, and one permit
    stub.answer = json.dumps({"object": "chat.completion", "choices": [], "usage": {}}).encode()
    permits = CountingPermits(1)
    monkeypatch.setattr(runner, "large_requests", lambda *sizing: permits)
    batch = harness.create([sample_request("small"), sample_request("large", "x" * (LARGE_BYTES + 1))])
    held_when_unpacked: list[int] = []
    real_unpack = input_chunks.unpack

    def unpack(data: bytes):
        held_when_unpacked.append(permits.held)
        return real_unpack(data)

    monkeypatch.setattr(input_chunks, "unpack", unpack)
    # When a worker runs each
    for position in (0, 1):
        assert isinstance(Worker(harness.settings).process(message_for(harness, batch["id"], position), NO_RECORD),
                          Done)
    # Then the large one's input (a chunk of its own) was decompressed under its permit, the small
    # one's without one
    assert held_when_unpacked == [0, 1]
    assert (permits.taken, permits.held) == (1, 0)


def test_small_answers_take_no_permit(harness, stub, monkeypatch):
    stub.answer = json.dumps({"object": "chat.completion", "choices": [], "usage": {}}).encode()
    permits = CountingPermits(1)
    monkeypatch.setattr(runner, "large_requests", lambda *sizing: permits)
    batch = harness.create([sample_request("q-0")])
    assert isinstance(Worker(harness.settings).process(message_for(harness, batch["id"], 0), NO_RECORD), Done)
    assert permits.taken == 0
