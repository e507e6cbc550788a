"""How many large requests an invocation holds in memory at once.

An invocation runs up to a full SQS batch of chains side by side (functions/worker/app.py), each
holding one request's body and, once it answers, the model's response. Most are a few KB. But a
body may be up to the create limit (32 MiB) and a response up to `upstream.MAX_RESPONSE_BYTES`
(8 MiB), and holding a response costs about 6.5 times its size by the time it is stored (the
bytes read, the parsed JSON, its encoding and its compression: measured with tracemalloc on an
8 MiB completion, 51 MiB at the peak). Ten of those at once (a batch of 10 to 24 records)
would take 500 MiB or more, more than the function has: a batch of large answers would crash
every invocation that ran it, and the other batches' chains with it.

So a request whose body, or whose response as it streams in, passes `LARGE_BYTES` first takes
one of a few permits, and waits for one if none is free. A permit's holder never waits for
anything else (it reads its response to the end and stores it), so waiting never deadlocks, and
small requests never wait. How many permits: what the function's memory leaves after the runtime
and libraries, the input chunk cache and every thread's small request, divided by the most one
large request holds.
"""

from __future__ import annotations

import functools
import threading
from types import TracebackType

from freeinference_batch.core.catalog import MAX_WORKER_BATCH_SIZE
from freeinference_batch.store.caches import CHUNK_CACHE_BYTES
from freeinference_batch.store.input_chunks import ALONE_BYTES
from freeinference_batch.worker.upstream import MAX_RESPONSE_BYTES

MIB = 1024 * 1024
# Records an invocation runs side by side: at most a full SQS batch, whose size follows from the
# model's capacity (catalog.ModelInfo.worker_batch_size): sized for the largest any model gets.
RECORD_THREADS = MAX_WORKER_BATCH_SIZE
# The worker's MemorySize in model/template.yaml (tests/deploy/test_template.py checks it):
# what a Worker is sized for when no Lambda context says otherwise.
FUNCTION_MEMORY_MB = 256
# A body or a response above this takes a permit. A body this large is alone in its input chunk,
# and the permit is taken before the chunk is read (store/input_chunks.py).
LARGE_BYTES = ALONE_BYTES
# Bytes held at the peak per byte of a response, from reading it to storing it (see above).
HELD_PER_RESPONSE_BYTE = 6.5
# Python, boto3, Powertools and pydantic loaded, as measured (85 MiB), with room for Lambda's runtime:
# check against the worker's "Max Memory Used" in its REPORT log lines after a deploy.
BASELINE_BYTES = 110 * MIB


def large_request_bytes(max_body_bytes: int, max_response_bytes: int) -> int:
    """The most one request holds: its body twice while it is cut from its input chunk, then the
    body alone (the chunk is dropped, or kept by the chunk cache, counted apart) beside its
    response as it is stored."""
    return max(2 * max_body_bytes, max_body_bytes + int(HELD_PER_RESPONSE_BYTE * max_response_bytes))


def large_permits(memory_bytes: int, threads: int, chunk_cache_bytes: int, max_body_bytes: int,
                  max_response_bytes: int) -> int:
    """How many large requests fit beside everything else the function holds (at least one: a
    function too small for one large request still runs them, one at a time)."""
    small = threads * large_request_bytes(LARGE_BYTES, LARGE_BYTES)
    left = memory_bytes - BASELINE_BYTES - chunk_cache_bytes - small
    return max(1, left // large_request_bytes(max_body_bytes, max_response_bytes))


@functools.cache
def large_requests(max_body_bytes: int, memory_mb: int) -> LargeRequests:
    """The process's permits for a function of `memory_mb` (one set per size: Lambda runs one
    function in a process; the local stack runs them all in one, each with its own)."""
    return LargeRequests(large_permits(memory_mb * MIB, RECORD_THREADS, CHUNK_CACHE_BYTES, max_body_bytes,
                                       MAX_RESPONSE_BYTES))


class LargeRequests:
    """The invocation's permits for large requests (one instance per process: Lambda runs one
    invocation at a time in it; the local stack runs several, which then share them)."""

    def __init__(self, permits: int) -> None:
        self.permits = permits
        self._free = threading.BoundedSemaphore(permits)

    def permit(self) -> Permit:
        return Permit(self._free)


class Permit:
    """A request's claim on a permit: taken once it holds more than LARGE_BYTES (`hold`, which may
    wait), and given back when the request is done with its body and response (`with`)."""

    def __init__(self, free: threading.BoundedSemaphore) -> None:
        self._free = free
        self.held = False

    def hold(self, size: int) -> None:
        """The request now holds `size` bytes of a body or of a response."""
        if size > LARGE_BYTES and not self.held:
            self._free.acquire()
            self.held = True

    def __enter__(self) -> Permit:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self.held:
            self.held = False
            self._free.release()
