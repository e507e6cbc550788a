"""What the file batch tests share: an input file stored as the Files API stores one (its objects
in the payload bucket, its item through store/files.py), a create in OpenAI's form, and the batch
jobs queue's messages run through the jobs function's handler as Lambda's poller would."""

from __future__ import annotations

import json
import time
from typing import Any

from freeinference_batch.core import aws
from freeinference_batch.store import files, objects

from tests.service.batches.file_batches import pump_jobs


def line_of(request: dict) -> bytes:
    """A request (tests.conftest.sample_request) as an OpenAI batch input line."""
    return json.dumps({"method": "POST", "url": "/v1/chat/completions", **request}).encode()


def input_file(harness, lines: list[bytes], *, account: str = "acct-1", parts: int = 1,
               purpose: str = "batch") -> files.FileRecord:
    """An input file of `lines`, its content split over `parts` objects (as an upload's parts are),
    cut in the middle of a line where it can be."""
    now = time.time()
    file_id = files.new_file_id(now)
    content = b"\n".join(lines) + b"\n"
    size = -(-len(content) // parts)
    keys = []
    for number in range(parts):
        keys.append(f"files/{file_id}/part-{number}")
        objects.put(harness.settings.payload_bucket_name, keys[-1], content[number * size:(number + 1) * size])
    record = files.FileRecord(id=file_id, account_id=account, purpose=purpose, filename="in.jsonl",
                              bytes=len(content), created_at=int(now), expires_at=int(now) + 86400,
                              status="processed", objects=keys)
    files.create_input_file(harness.settings, record, max_files=100, max_bytes=1 << 30)
    return record


def create_from(harness, file_id: str, **fields: Any) -> tuple[int, dict]:
    body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h", **fields}
    return harness.call("POST", "/v1/batches", body)


def job_messages(harness) -> list[dict]:
    """Take every visible message of the batch jobs queue (in flight, unprocessed)."""
    sqs, url = aws.sqs(), harness.settings.batch_jobs_queue_url
    taken: list[dict] = []
    while True:
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"]).get("Messages", [])
        if not got:
            return taken
        taken.extend(got)


def run_jobs(harness, seconds: float = 900) -> int:
    """Each message of the batch jobs queue through the jobs function (file_batches.pump_jobs),
    until the queue is empty; a step that fails fails the test. Answers how many ran."""
    ran, failed = pump_jobs(harness, seconds)
    assert not failed, "a batch job's step failed"
    return ran


def run_file_batch_to_final(harness, batch_id: str, timeout: float = 30.0) -> dict:
    """Run a file batch's requests, and its jobs as they are queued (its output and error files
    written, as the jobs function's poller would), until it is final: the batch as final."""
    final = ("completed", "failed", "expired", "cancelled")

    def ended() -> bool:
        run_jobs(harness)
        return harness.batch(batch_id)["status"] in final

    harness.run_until(ended, timeout)
    return harness.batch(batch_id)
