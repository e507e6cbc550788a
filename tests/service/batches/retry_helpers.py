"""What the retry tests on moto share: a finished parent with some requests failing, the retry
call (with its raw answer's headers), and a batch's requests as stored."""

from __future__ import annotations

import json
import uuid
from typing import Any

from freeinference_batch.core import aws
from freeinference_batch.store import caches
from freeinference_batch.store.batch_table import BatchTable

from tests.conftest import capture_answers, sample_request


def failing(custom_id: str, gate: str | None = None, **body: Any) -> dict:
    """A request the simulated upstream refuses with 400 (at once, no retry): for good, or until
    the test opens `gate`."""
    directive = f"[sim:status=400 until={gate}]" if gate else "[sim:status=400]"
    return sample_request(custom_id, f"{directive} Refuse {custom_id}.", **body)


def new_gate() -> str:
    return f"fixed-{uuid.uuid4().hex[:8]}"


def finished(harness, lines: list[dict], **extra: Any) -> dict:
    """A batch of `lines`, run to its final status."""
    return harness.run_to_final(harness.create(lines, **extra)["id"])


def retry(harness, batch_id: str, body: Any = None, *, idempotency_key: str | None = None,
          key: str | None = None, raw: bytes | None = None) -> tuple[int, dict, dict]:
    """(status, answer, headers) of `POST /v1/batches/{batch_id}/retry`; no body unless given."""
    original = harness.api_handler
    answers = capture_answers(harness)
    headers = {} if idempotency_key is None else {"Idempotency-Key": idempotency_key}
    try:
        status, answer = harness.call("POST", f"/v1/batches/{batch_id}/retry", body, key=key, raw=raw,
                                      headers=headers)
    finally:
        harness.api_handler = original
    return status, answer, (answers[-1].get("headers") or {}) if answers else {}


def stored_requests(harness, batch_id: str) -> list[tuple[str, str, bytes]]:
    """(custom_id, model, body bytes) of every request of the batch, as its input chunks hold them
    (read from the table, not a warm cache)."""
    caches.chunks.clear()
    table = BatchTable(harness.settings)
    meta = table.get_meta(batch_id)
    assert meta is not None, batch_id
    out = []
    for number in range(len(meta.chunk_starts)):
        run = table.get_chunk(batch_id, number)
        out.extend((run.custom_ids[i], run.models[i], run.body(i)) for i in range(len(run.custom_ids)))
    caches.chunks.clear()
    return out


def meta_item(harness, batch_id: str) -> dict | None:
    """The batch's META item exactly as stored."""
    return aws.dynamodb().get_item(TableName=harness.settings.batch_table_name,
                                   Key={"pk": {"S": f"BATCH#{batch_id}"}, "sk": {"S": "META"}}).get("Item")


def stored_batch_ids(harness) -> set[str]:
    """Every batch id with any item in the batch table (a half-stored child would show here)."""
    items = aws.dynamodb().scan(TableName=harness.settings.batch_table_name)["Items"]
    return {i["pk"]["S"].removeprefix("BATCH#") for i in items if i["pk"]["S"].startswith("BATCH#")}


def body_of(line: dict) -> bytes:
    """A request line's body as create stores it: compact JSON bytes."""
    return json.dumps(line["body"], separators=(",", ":"), ensure_ascii=False).encode()
