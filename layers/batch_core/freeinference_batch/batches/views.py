"""How stored items look to the user: the batch object and result lines.

Requests that never left the backlog have no item of their own; their status follows from the
batch's (principle 4 of the design: cancel, expiry and failure touch no per-request item).
"""

from __future__ import annotations

from typing import Any

from freeinference_batch.core.catalog import NANO_PER_USD
from freeinference_batch.core.schemas import (
    BatchObject,
    BatchStatus,
    RequestCounts,
    RequestStatus,
    ResultLine,
    Waiting,
)
from freeinference_batch.store.batch_record import BatchRecord

NOT_STARTED = {
    # batch status -> (result status, error) for a request that has no final state of its own
    BatchStatus.CANCELLING: (RequestStatus.CANCELLED, None),
    BatchStatus.CANCELLED: (RequestStatus.CANCELLED, None),
    BatchStatus.FAILED: (RequestStatus.FAILED, {"code": "batch_failed", "message": "Not run: the batch failed"}),
    BatchStatus.EXPIRED: (RequestStatus.EXPIRED,
                          {"code": "batch_expired", "message": "Not run: the completion window closed first"}),
}


def window_label(seconds: int) -> str:
    if seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    if seconds % 60 == 0:
        return f"{seconds // 60}m"
    return f"{seconds}s"


def request_counts(meta: BatchRecord) -> RequestCounts:
    total, completed = meta.total, meta.completed
    if meta.status in (BatchStatus.FAILED, BatchStatus.EXPIRED):
        # Every request that did not succeed and is not still finishing counts as failed.
        failed = total - completed - meta.running
    else:
        failed = meta.failed
    return RequestCounts(total=total, completed=completed, failed=failed)


def waiting(meta: BatchRecord) -> Waiting | None:
    """Why none of its requests can start now; only while it may start them (the writes that end
    that, a final status and failing, remove it too: this holds for an item written otherwise)."""
    if meta.status not in (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS) or meta.failing is not None:
        return None
    return meta.waiting


def batch_object(meta: BatchRecord) -> dict[str, Any]:
    obj = BatchObject(
        id=meta.id,
        errors=meta.errors,
        input_file_id=meta.input_file_id,
        completion_window=window_label(meta.window_seconds),
        status=meta.status,
        created_at=meta.created_at,
        expires_at=meta.expires_at,
        request_counts=request_counts(meta),
        metadata=meta.metadata,
        cost_usd=round(meta.cost_nano / NANO_PER_USD, 9),
        error=meta.error,
        in_progress_at=meta.in_progress_at,
        completed_at=meta.completed_at,
        failed_at=meta.failed_at,
        expired_at=meta.expired_at,
        cancelling_at=meta.cancelling_at,
        cancelled_at=meta.cancelled_at,
        finalizing_at=meta.finalizing_at,
        output_file_id=meta.output_file_id,
        error_file_id=meta.error_file_id,
        retry_of=meta.retry_of,
        waiting=waiting(meta),
    )
    return obj.model_dump(mode="json")


def result_status(meta: BatchRecord, state: dict | None) -> tuple[str, dict | None]:
    """A request's status and error as its result line shows them, from its item (None: it never
    ran) and its batch's status: what a results page shows, and what a retry chooses by."""
    status = state["status"] if state else RequestStatus.QUEUED
    error = state.get("error") if state else None
    if (status not in (RequestStatus.COMPLETED, RequestStatus.FAILED, RequestStatus.RUNNING)
            and meta.status in NOT_STARTED):
        # A request waiting for its retry did run: it keeps the error of its last attempt.
        status, batch_error = NOT_STARTED[meta.status]
        error = error or batch_error
    return status, error


def result_line(meta: BatchRecord, result_id: str, custom_id: str, state: dict | None,
                response: dict | None) -> dict[str, Any]:
    status, error = result_status(meta, state)
    line = ResultLine(
        id=result_id,
        custom_id=custom_id,
        status=status,
        response=response if status == RequestStatus.COMPLETED else None,
        error=error if status != RequestStatus.COMPLETED else None,
    )
    return line.model_dump(mode="json")


def openai_error_fields(status: str, error: dict) -> dict:
    """The `response` and `error` of OpenAI's output line for a request that did not succeed,
    from its result line's status and error: a failed request whose error carries an HTTP status
    (the chat completions endpoint's answer to it: a refusal, or a 429, 5xx or 504 after every
    retry) is a response of that status whose body is the error (`error` null; we keep no request
    id of a failed call); any other (never run, cancelled, expired, or every run cut short) is
    `error` with no response. The file job and the CLI both write lines by it."""
    if status != RequestStatus.FAILED or error.get("status") is None:
        return {"response": None, "error": {"code": error["code"], "message": error["message"]}}
    body = {"error": {"message": error["message"], "type": error["code"], "param": None, "code": error["code"]}}
    return {"response": {"status_code": error["status"], "request_id": None, "body": body}, "error": None}
