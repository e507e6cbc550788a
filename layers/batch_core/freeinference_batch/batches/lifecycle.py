"""Batch status transitions that end a batch, shared by the API, the worker and the schedules.

Each is one conditional transaction that also releases the account's unfinished-batch count,
so the count stays exact whoever gets there first.
"""

from __future__ import annotations

from typing import Any

from freeinference_batch import accounts
from freeinference_batch.core.observability import log_status_change
from freeinference_batch.core.schemas import FINAL_STATUSES, BatchStatus
from freeinference_batch.core.settings import Settings
from freeinference_batch.store.batch_record import BatchRecord
from freeinference_batch.store.batch_table import PURGE_SHARD, BatchTable
from freeinference_batch.store.dynamo import TransactionFailed, transact

RUNNABLE = (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS)


def _ts(now: float) -> int:
    return int(now)


def finished_fields(settings: Settings, now: float) -> tuple[str, dict[str, Any]]:
    """SET clause shared by every final transition: leave the open index, join the purge index."""
    clause = "finished_at = :now, purge_shard = :purge_shard, purge_at = :purge_at, #ttl = :ttl"
    named = {
        "now": _ts(now),
        "purge_shard": PURGE_SHARD,
        "purge_at": _ts(now) + settings.batch_retention_seconds,
        # TTL is a backstop only: it deletes within days, reads stop at purge_at.
        "ttl": _ts(now) + settings.batch_retention_seconds + 3 * 86400,
    }
    return clause, named


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
        if meta.completed + meta.failed >= meta.total:
            return BatchStatus.COMPLETED
        if meta.failing is not None:
            return BatchStatus.FAILED
        if now >= meta.expires_at:
            return BatchStatus.EXPIRED
    return None


def try_finalize(settings: Settings, table: BatchTable, meta: BatchRecord, now: float) -> BatchStatus | None:
    """Move the batch to its final status if it has reached one; returns that status or None."""
    final = decide_final_status(meta, now)
    if final is None:
        return None
    clause, named = finished_fields(settings, now)
    names = {"#status": "status", "#ttl": "ttl"}
    if final == BatchStatus.FAILED:
        clause += ", #error = failing"
        names["#error"] = "error"
    element = table.meta_update_element(
        meta.id,
        f"SET #status = :final, {final}_at = :now, {clause} REMOVE open_shard",
        "#status = :old AND running = :zero",
        names=names, final=final, old=meta.status, zero=0, **named,
    )
    try:
        # account_id, as cancel and delete give it back: the same account as `owner`, which only
        # a delete removes (and a deleted batch never reaches a final status here).
        transact([element, accounts.unfinished_decrement_update(settings, meta.account_id)])
    except TransactionFailed:
        return None  # someone else finalized it, or it changed; the next look decides again
    log_status_change(f"batch {final}", meta.id, final, meta.status)
    return final


def fail_batch(settings: Settings, table: BatchTable, meta: BatchRecord, now: float, code: str,
               message: str) -> bool:
    """The owner lost the right to run it: no request starts any more, and the batch fails as
    soon as none runs (at once if none does). Until then it stays open, so the sweep still
    recovers a running request whose worker died, and it keeps its status: a final status is
    final, counts included."""
    updated = table.update_meta(
        meta.id, "SET failing = :error", "#status IN (:validating, :in_progress)",
        names={"#status": "status"}, error={"code": code, "message": message},
        validating=BatchStatus.VALIDATING, in_progress=BatchStatus.IN_PROGRESS,
    )
    if updated is None:
        return False
    try_finalize(settings, table, updated, now)
    return True


def is_final(status: str) -> bool:
    return status in FINAL_STATUSES
