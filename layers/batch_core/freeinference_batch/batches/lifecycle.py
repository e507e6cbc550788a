"""When a batch ends: which final status it takes, shared by the API, the worker and the
schedules. The writes are store/batch_status.py's: each final transition is one conditional
transaction that also releases the account's unfinished-batch count, so the count stays exact
whoever gets there first.

A batch created from a file (`input_file_id`) ends in two writes: the first stops it with its final
status to come (`ending`: a completed one shows `finalizing`), and its `write_files` job
(batches/output_files.py) writes its output and error files, then makes the final write with their
ids. Its final status events fire at that second write, as an inline batch's do at its one.
"""

from __future__ import annotations

from freeinference_batch.batches import jobs
from freeinference_batch.core.observability import log_status_change, logger
from freeinference_batch.core.schemas import FINAL_STATUSES, BatchJob, BatchStatus
from freeinference_batch.core.settings import Settings
from freeinference_batch.store import batch_files, batch_status
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
    if meta.running > 0 or meta.ending is not None:
        return None  # running requests finish first; a batch ending is its job's to finish
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


def writes_files(meta: BatchRecord, final: BatchStatus) -> bool:
    """Whether the batch ends through its output and error files: one created from a file, unless
    it failed before any request started (its input was refused: OpenAI gives such a batch none),
    or ended before its file was checked (cancelled or expired while validating: it has no requests)."""
    if meta.input_file_id is None or meta.unchecked:
        return False
    return final != BatchStatus.FAILED or meta.in_progress_at is not None


def try_finalize(settings: Settings, meta: BatchRecord, now: float) -> BatchStatus | None:
    """Move the batch to its final status if it has reached one (a file batch: toward it, its
    files' job queued); returns that status or None."""
    final = decide_final_status(meta, now)
    if final is None:
        return None
    if writes_files(meta, final):
        return end_with_files(settings, meta, final, now)
    try:
        transact(batch_status.finish(settings, meta, final, now))
    except TransactionFailed:
        return None  # someone else finalized it, or it changed; the next look decides again
    log_status_change(f"batch {final}", meta.id, final, meta.status)
    return final


def end_with_files(settings: Settings, meta: BatchRecord, final: BatchStatus, now: float) -> BatchStatus | None:
    """A file batch reached `final`: stopped as ending (store/batch_status.py `end_with_files`) and
    its `write_files` job queued. A job lost before it is sent (a crash right here) the sweep
    sends again (ops/schedules.py)."""
    try:
        transact([batch_status.end_with_files(settings, meta, final, now)])
    except TransactionFailed:
        return None  # someone else ended it, or it changed; the next look decides again
    shown = {BatchStatus.COMPLETED: BatchStatus.FINALIZING, BatchStatus.CANCELLED: BatchStatus.CANCELLING}
    log_status_change(f"batch ending {final}: writing its files", meta.id, shown.get(final, meta.status),
                      meta.status)
    try:
        jobs.send(settings, BatchJob(kind="write_files", batch_id=meta.id))
    except Exception:  # the batch has ended all the same: the sweep sends its job when it goes quiet
        logger.exception("could not queue a batch's write_files job", extra={"batch_id": meta.id})
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


def revive_files_job(settings: Settings, meta: BatchRecord, now: float) -> bool:
    """The sweep's look at a batch whose files are being written: when its job has shown no sign of
    life for BATCH_FILES_STALL_SECONDS (its message lost, or failed into the dead-letter queue), a
    new one is sent, and the progress touched so that the next sweeps wait for it (a run of the old
    job that comes back after all loses its next write and stops). True when it sent one."""
    progress = batch_files.get_progress(settings, meta.id)
    last = progress.touched_at if progress else (meta.ending_at or 0)
    if now - last < settings.batch_files_stall_seconds:
        return False
    touched = (progress or batch_files.Progress()).model_copy(update={"touched_at": int(now)})
    _, ttl = batch_status.retention(settings, now)
    if not batch_files.save_progress(settings, meta.id, touched, progress.version if progress else None, ttl):
        return False  # the job moved meanwhile: alive
    jobs.send(settings, BatchJob(kind="write_files", batch_id=meta.id))
    logger.warning("re-sent the write_files job of a batch whose files' job went quiet", extra={"batch_id": meta.id})
    return True
