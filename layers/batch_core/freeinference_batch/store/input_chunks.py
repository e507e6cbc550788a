"""The stored form of a batch's requests: runs of consecutive requests, one run per `IN#` item.

A run is, before zlib compression, one JSON line `[[custom_id, model, body_length], ...]`
followed by the requests' bodies, as JSON bytes back to back. Bodies stay bytes from create to
the upstream call: the worker slices out the one it sends and never parses it, so its memory per
request is the request's JSON size (27 MB of `[],` is 27 MB here, and 800 MB of Python objects
once parsed). Readers that need only the custom ids (results pages) decompress just the first line.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from freeinference_batch.core.schemas import CheckedRequest

# About this much JSON per run, and never a compressed run over the item budget (DynamoDB items
# stop at 400 KB; the rest of the item and its keys need room too).
RUN_TARGET_BYTES = 256 * 1024
ITEM_LIMIT_BYTES = 350 * 1024
# A body over this is a run of its own. A worker decompresses a whole run to cut one body from
# it: so a small request never holds a large neighbour's bytes (nor decompresses them again for
# each small request, a run that big being too big for the chunk cache), and a large request's
# run is its own, whose size the worker learns from the header before it decompresses the rest
# (`header`), and takes a memory permit for first (worker/memory.py LARGE_BYTES).
ALONE_BYTES = 256 * 1024
_COMPRESSION_LEVEL = 3


@dataclass(frozen=True)
class PackedRun:
    """A run ready to store: the position of its first request, its compressed bytes, and whether
    it is too big for an item (a single huge request: its bytes go to S3, the item points there)."""

    start: int
    data: bytes
    oversized: bool


@dataclass(frozen=True)
class InputRun:
    """A run as read back: each request's custom id and model, and the bodies' bytes."""

    custom_ids: list[str]
    models: list[str]
    ends: list[int]  # where each body ends in `bodies`
    bodies: memoryview  # of the decompressed run: slicing it copies nothing

    def body(self, index: int) -> bytes:
        start = self.ends[index - 1] if index else 0
        return bytes(self.bodies[start : self.ends[index]])

    @property
    def size(self) -> int:
        return len(self.bodies)


def encode(requests: Sequence[CheckedRequest]) -> bytes:
    header = json.dumps([[r.custom_id, r.model, len(r.body)] for r in requests], separators=(",", ":"),
                        ensure_ascii=False)
    return b"".join([header.encode(), b"\n", *(r.body for r in requests)])


def pack(requests: Sequence[CheckedRequest]) -> list[PackedRun]:
    """Split the requests into compressed runs of about RUN_TARGET_BYTES of JSON each."""
    out: list[PackedRun] = []

    def add(start: int, run: Sequence[CheckedRequest]) -> None:
        data = zlib.compress(encode(run), _COMPRESSION_LEVEL)
        if len(data) <= ITEM_LIMIT_BYTES:
            out.append(PackedRun(start, data, False))
        elif len(run) == 1:
            out.append(PackedRun(start, data, True))
        else:  # barely compressible text: halve until each half fits
            half = len(run) // 2
            add(start, run[:half])
            add(start + half, run[half:])

    start, size = 0, 0
    for position, request in enumerate(requests):
        if len(request.body) > ALONE_BYTES:
            if start < position:
                add(start, requests[start:position])
            add(position, requests[position : position + 1])
            start, size = position + 1, 0
            continue
        size += len(request.body) + len(request.custom_id) + 32
        if size >= RUN_TARGET_BYTES:
            add(start, requests[start : position + 1])
            start, size = position + 1, 0
    if start < len(requests):
        add(start, requests[start:])
    return out


def unpack(data: bytes) -> InputRun:
    raw = zlib.decompress(data)
    newline = raw.index(b"\n")
    header = json.loads(raw[:newline])
    ends, end = [], 0
    for _, _, length in header:
        end += length
        ends.append(end)
    return InputRun([h[0] for h in header], [h[1] for h in header], ends, memoryview(raw)[newline + 1 :])


def unpack_custom_ids(data: bytes) -> list[str]:
    """The run's custom ids, decompressing only as far as the end of the header line."""
    return [h[0] for h in header(data)]


def header(data: bytes) -> list[list]:
    """The run's header line, `[[custom_id, model, body_length], ...]`, decompressing only as far
    as its end."""
    inflater = zlib.decompressobj()
    head = bytearray()
    pending = data
    while True:
        head += inflater.decompress(pending, 64 * 1024)
        pending = inflater.unconsumed_tail
        newline = head.find(b"\n")
        if newline >= 0:
            return json.loads(bytes(head[:newline]))
        if not pending:
            raise ValueError("input run has no header line")
