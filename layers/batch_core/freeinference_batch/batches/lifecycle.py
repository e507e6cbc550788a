"""When a batch ends: which final status it takes, shared by the API, the worker and the
schedules. The writes are store/batch_status.py's: each final transition is one conditional
transaction that also releases the account's unfinished-batch count, so the count stays exact
whoever gets there first.
"""

from __future__ import annotations

from freeinference_batch.core.observability import log_status_change
from freeinference_batch.core.schemas import FINAL_STATUSES, BatchStatus
from freeinference_batch.core.settings import Settings
from freeinference_batch.store import batch_status
from freeinference_batch.store.batch_record import BatchRecord
from freeinference_batch.store.dynamo import TransactionFailed, transact

RUNNABLE = (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS)


def starts_requests(meta: BatchRecord, now: float) -> bool:
    """Whether a request of this batch may start now."""
    return meta.status in RUNNABLE and meta.failing is None and now < meta.expires_at


def decide_final_status(meta: BatchRecord, now: float) -> BatchStatus | None:
    """The final status a batch should take now, if any. Running requests always finish first,
    so a batch in a final status has none running and its counts never change again."""
    status = meta.status
    if meta.running > 0:
        return None
    if status == BatchStatus.CANCELLING:
        return BatchStatus.CANCELLED
    if status in RUNNABLE:
        # A file batch not yet checked has no requests (total 0) and must not complete with none:
        # only its check stores them, or fails it; a cancel, failing or its window still end it.
        if not meta.unchecked and meta.completed + meta.failed >= meta.total:
            return BatchStatus.COMPLETED
        if meta.failing is not None:
            return BatchStatus.FAILED
        if now >= meta.expires_at:
            return BatchStatus.EXPIRED
    return None


def try_finalize(settings: Settings, meta: BatchRecord, now: float) -> BatchStatus | None:
    """Move the batch to its final status if it has reached one; returns that status or None."""
    final = decide_final_status(meta, now)
    if final is None:
        return None
    try:
        transact(batch_status.finish(settings, meta, final, now))
    except TransactionFailed:
        return None  # someone else finalized it, or it changed; the next look decides again
    log_status_change(f"batch {final}", meta.id, final, meta.status)
    return final


def fail_batch(settings: Settings, meta: BatchRecord, now: float, code: str, message: str) -> bool:
    """The owner lost the right to run it: no request starts any more, and the batch fails as
    soon as none runs (at once if none does). Until then it stays open, so the sweep still
    recovers a running request whose worker died, and it keeps its status: a final status is
    final, counts included."""
    updated = batch_status.mark_failing(settings, meta.id, {"code": code, "message": message})
    if updated is None:
        return False
    try_finalize(settings, updated, now)
    return True


def is_final(status: str) -> bool:
    return status in FINAL_STATUSES
