"""Every change of a batch's status, one named write each: the only code that moves a batch's
`META` item from one status to another.

| write | status from -> to | made by |
|---|---|---|
| `create` | (none) -> `validating` | create (`batches/operations.py`), with the account's unfinished count |
| `checked` | `validating` (unchecked) -> `validating`, requests stored | a file's check (`file_batches.py`) |
| `check_resent` | unchanged, `check_sent_at` set | the sweep, a file's check gone quiet |
| `start` | `validating` / `in_progress` -> `in_progress`, no `waiting` | a chain's first claim (`runs.start_chain`) |
| `wait` | unchanged, `waiting` set | a chain parks, none of the batch running (`worker/waiting.py`) |
| `mark_failing` | unchanged, `failing` set | the owner lost the right to run it (`lifecycle.fail_batch`) |
| `start_cancelling` | `validating` / `in_progress` -> `cancelling` | cancel while requests run (`cancel_batch`) |
| `end_with_files` | -> `finalizing` (completing) / `cancelling`, else unchanged; `ending` set | a file batch's end |
| `finish` | -> a final status | `try_finalize`; cancel (none runs); a failed check; `write_files` |
| `delete` | any, none running -> `deleted` | delete (`batches/operations.py` `delete_batch`) |

A file batch that ran ends by `end_with_files` (`lifecycle.try_finalize`, cancel), then `finish`
with its files' ids, made by its `write_files` job (batches/output_files.py) once they are written.

Each is conditional on the status its caller read (and on `running`): of two writers deciding
from the same read, one wins. A write made alone answers the new record (None when its condition
did not hold); one that joins a transaction answers the transaction's elements, which the caller
writes (`dynamo.transact`), as `store/runs.py`'s do. The final transitions and a delete carry the
account's unfinished-batch count with them, so the count stays exact whoever gets there first.
"""

from __future__ import annotations

from typing import Any

from freeinference_batch.core.schemas import FINAL_STATUSES, BatchStatus, Waiting
from freeinference_batch.core.settings import Settings
from freeinference_batch.store import accounts_table
from freeinference_batch.store.batch_keys import (
    META,
    OPEN_SHARD,
    PURGE_SHARD,
    batch_pk,
    created_key,
    meta_key,
    record_of,
)
from freeinference_batch.store.batch_record import BatchRecord
from freeinference_batch.store.dynamo import apply_update, to_item, update_element, update_returning

# The condition on a batch item for a request to start: the batch runs, and is not waiting to fail.
STARTS_REQUESTS = ("#status IN (:validating, :in_progress) AND attribute_not_exists(failing) "
                   "AND attribute_not_exists(ending)")
# TTL is a backstop only: it deletes a finished batch within days of its purge_at; reads stop at purge_at.
TTL_AFTER_PURGE_SECONDS = 3 * 86400


def new_meta(batch_id: str, *, account_id: str, key_hash: str, created_at: int, window_seconds: int, total: int,
             metadata: dict[str, str] | None, id_base: int, chunk_starts: list[int], lane_widths: dict[str, int],
             ttl: int, retry_of: str | None = None, input_file_id: str | None = None,
             unchecked: bool = False) -> dict[str, Any]:
    """The META item of a new batch, as `create` writes it (and as its first answer reads it).
    `retry_of` only on a retry's child, `input_file_id` only on a batch made from a file (and its
    retries' children), `unchecked` only on a file batch whose lines are still to be checked:
    every other batch's item stays as it was, no bigger."""
    meta = {
        "pk": batch_pk(batch_id), "sk": META, "id": batch_id,
        "owner": account_id, "account_id": account_id, "key_hash": key_hash,
        "created_key": created_key(batch_id),
        "status": BatchStatus.VALIDATING, "created_at": created_at, "expires_at": created_at + window_seconds,
        "window_seconds": window_seconds, "total": total, "completed": 0, "failed": 0, "running": 0,
        "cost_nano": 0, "metadata": metadata, "id_base": id_base, "chunk_starts": chunk_starts,
        "lane_widths": lane_widths, "open_shard": OPEN_SHARD, "ttl": ttl,
    }
    if retry_of is not None:
        meta["retry_of"] = retry_of
    if input_file_id is not None:
        meta["input_file_id"] = input_file_id
    if unchecked:
        meta["unchecked"] = True
    return meta


def create(settings: Settings, meta: dict[str, Any]) -> list[dict]:
    """(nothing) -> validating: META put (only if no such batch exists), and one of the account's
    unfinished batches taken (only while it has fewer than `batch_max_unfinished`), in that order."""
    return [
        {"Put": {"TableName": settings.batch_table_name, "Item": to_item(meta),
                 "ConditionExpression": "attribute_not_exists(pk)"}},
        accounts_table.unfinished_increment_element(settings, meta["account_id"], settings.batch_max_unfinished),
    ]


def checked(settings: Settings, batch_id: str, *, total: int, chunk_starts: list[int], lane_widths: dict[str, int],
            id_base: int) -> BatchRecord | None:
    """A file batch's lines checked and its requests stored (every other item of it written
    first): its META takes what create writes for an inline batch, and is no longer `unchecked`.
    Only while it is still validating and unchecked: a cancel, an expiry, a delete or another run
    of the check that got there first makes this None (and the caller starts nothing)."""
    return record_of(update_returning(
        settings.batch_table_name, meta_key(batch_id),
        "SET #total = :total, chunk_starts = :chunk_starts, lane_widths = :lane_widths, id_base = :id_base "
        "REMOVE unchecked",
        # (or this very write, re-sent by botocore after a lost answer: still validating, no longer
        # unchecked, with the id_base it reserved and its total)
        "#status = :validating AND attribute_not_exists(failing) AND (attribute_exists(unchecked) "
        "OR (id_base = :id_base AND #total = :total))",
        names={"#status": "status", "#total": "total"}, total=total, chunk_starts=chunk_starts,
        lane_widths=lane_widths, id_base=id_base, validating=BatchStatus.VALIDATING,
    ))


def check_resent(settings: Settings, meta: BatchRecord, now: float) -> bool:
    """An unchecked file batch's `validate` job sent again (`check_sent_at` now): only while it is
    still validating and unchecked, and its `check_sent_at` is as read, so of two sweeps one
    sends it. True if this call wrote it."""
    condition = "(#status = :validating AND attribute_exists(unchecked) AND "
    condition += ("check_sent_at = :sent" if meta.check_sent_at is not None else "attribute_not_exists(check_sent_at)")
    # (or this very write, re-sent by botocore after a lost answer)
    condition += ") OR check_sent_at = :now"
    named: dict[str, Any] = {"sent": meta.check_sent_at} if meta.check_sent_at is not None else {}
    return apply_update(update_element(
        settings.batch_table_name, meta_key(meta.id), "SET check_sent_at = :now", condition,
        names={"#status": "status"}, now=int(now), validating=BatchStatus.VALIDATING, **named,
    ))


def start(settings: Settings, batch_id: str, now: float) -> dict:
    """validating -> in_progress (already in progress: unchanged), one more chain running: only
    while the batch starts requests and its window is open. An element of the first claim's
    transaction. A request starts: the batch is no longer `waiting` (removed in this write, which
    happens anyway, so clearing it costs nothing)."""
    return update_element(
        settings.batch_table_name, meta_key(batch_id),
        "SET #status = :in_progress, in_progress_at = if_not_exists(in_progress_at, :now) ADD running :one "
        "REMOVE waiting",
        f"{STARTS_REQUESTS} AND expires_at > :now",
        names={"#status": "status"}, in_progress=BatchStatus.IN_PROGRESS, validating=BatchStatus.VALIDATING,
        now=int(now), one=1,
    )


def wait(settings: Settings, batch_id: str, waiting: Waiting) -> bool:
    """`waiting` set: none of the batch's requests can start, for `waiting.reason`. Only while the
    batch starts requests, none of it runs (a batch running a request is not waiting, whatever its
    other chains meet) and its `waiting` is absent or another reason: so of the chains that park
    for one reason, one writes it, once; True if this call did. Its caller asks only when its
    read of the batch shows it is due (a refused write still costs its write units)."""
    return apply_update(update_element(
        settings.batch_table_name, meta_key(batch_id), "SET waiting = :waiting",
        f"{STARTS_REQUESTS} AND running = :zero AND (attribute_not_exists(waiting) OR waiting.reason <> :reason)",
        names={"#status": "status"}, waiting=waiting.model_dump(mode="json"), reason=waiting.reason, zero=0,
        validating=BatchStatus.VALIDATING, in_progress=BatchStatus.IN_PROGRESS,
    ))


def mark_failing(settings: Settings, batch_id: str, error: dict[str, Any]) -> BatchRecord | None:
    """The owner lost the right to run it: `failing` set (no request starts any more), the status
    kept until none runs (`finish` then moves it to failed). Only while it runs; None otherwise.
    A batch that will not start another request is not waiting: `waiting` removed."""
    return record_of(update_returning(
        settings.batch_table_name, meta_key(batch_id), "SET failing = :error REMOVE waiting",
        "#status IN (:validating, :in_progress) AND attribute_not_exists(ending)", names={"#status": "status"},
        error=error,
        validating=BatchStatus.VALIDATING, in_progress=BatchStatus.IN_PROGRESS,
    ))


def start_cancelling(settings: Settings, meta: BatchRecord, now: float) -> BatchRecord | None:
    """validating / in_progress -> cancelling: only while it is as read and requests run (with
    none running, cancel is `finish`); None otherwise."""
    return record_of(update_returning(
        settings.batch_table_name, meta_key(meta.id), "SET #status = :cancelling, cancelling_at = :now",
        "#status = :old AND running > :zero", names={"#status": "status"},
        cancelling=BatchStatus.CANCELLING, now=int(now), old=meta.status, zero=0,
    ))


def end_with_files(settings: Settings, meta: BatchRecord, final: BatchStatus, now: float) -> dict:
    """A file batch reached `final`: its output and error files are written before it shows it
    (`ending` = `final`, the `write_files` job's to finish). A completed one is `finalizing` meanwhile,
    a cancelled one `cancelling` (already, or from now: cancel with none running), an expiring or
    failing one keeps its status. Only from the status as read, with none running and not already
    ending: so nothing of it starts or changes again, and its files are written from settled items.
    The account's unfinished batch is kept until `finish` (a batch finalizing counts toward it)."""
    at = int(now)
    sets = ["ending = :final", "ending_at = :now"]
    extra: dict[str, Any] = {}
    if final == BatchStatus.COMPLETED:
        sets += ["#status = :finalizing", "finalizing_at = :now"]
        extra["finalizing"] = BatchStatus.FINALIZING
    elif final == BatchStatus.CANCELLED and meta.status != BatchStatus.CANCELLING:
        sets += ["#status = :cancelling", "cancelling_at = :now"]
        extra["cancelling"] = BatchStatus.CANCELLING
    return update_element(
        settings.batch_table_name, meta_key(meta.id), f"SET {', '.join(sets)} REMOVE waiting",
        "#status = :old AND running = :zero AND attribute_not_exists(ending)", names={"#status": "status"},
        final=final, now=at, old=meta.status, zero=0, **extra,
    )


def created_ttl(settings: Settings, created_at: int) -> int:
    """The ttl a new batch's items take: past its window and its retention, with TTL's margin."""
    return created_at + settings.batch_completion_window_seconds + settings.batch_retention_seconds \
        + TTL_AFTER_PURGE_SECONDS


def retention(settings: Settings, now: float) -> tuple[int, int]:
    """(purge_at, ttl) of a batch finishing now: what `finish` writes, and what its files' items take."""
    purge_at = int(now) + settings.batch_retention_seconds
    return purge_at, purge_at + TTL_AFTER_PURGE_SECONDS


def finish(settings: Settings, meta: BatchRecord, final: BatchStatus, now: float, *,
           errors: dict[str, Any] | None = None, files: tuple[str | None, str | None] | None = None) -> list[dict]:
    """-> `final` (completed, failed, expired or cancelled): only from the status as read and with
    none running, so a final batch's counts never change. It leaves the open index and joins the
    purge index, and is no longer `waiting`; a failed batch's `failing` becomes its `error`; a
    batch cancelled straight from running (none was) is cancelling and cancelled at once. With
    it, the account's unfinished batch given back: the account of `account_id`, the same as
    `owner`, which only a delete removes (and a deleted batch never finishes).
    `errors`: a file batch whose lines failed the checks (final is failed): only while it is
    still unchecked, and it is then checked for good (a second run of the check changes nothing).
    A file batch that ran (`meta.ending` is `final`) finishes only with `files`, its (output,
    error) file ids (None: empty), set in this write; `ending` goes."""
    at = int(now)
    sets = ["#status = :final", f"{final}_at = :now", "finished_at = :now", "purge_shard = :purge_shard",
            "purge_at = :purge_at", "#ttl = :ttl"]
    names = {"#status": "status", "#ttl": "ttl"}
    condition = "#status = :old AND running = :zero AND attribute_not_exists(ending)"
    named: dict[str, Any] = {}
    removes = ["open_shard", "waiting"]
    if errors is not None:
        sets.append("#errors = :errors")
        names["#errors"] = "errors"
        named["errors"] = errors
        condition += " AND attribute_exists(unchecked)"
        removes.append("unchecked")
    elif final == BatchStatus.FAILED:
        sets.append("#error = failing")
        names["#error"] = "error"
    if final == BatchStatus.CANCELLED and meta.status != BatchStatus.CANCELLING:
        sets.append("cancelling_at = :now")
    purge_at, ttl = retention(settings, now)
    if files is not None:
        condition = "#status = :old AND running = :zero AND ending = :final"
        removes.append("ending")
        for name, file_id in zip(("output_file_id", "error_file_id"), files, strict=True):
            if file_id is not None:
                sets.append(f"{name} = :{name}")
                named[name] = file_id
    return [
        update_element(
            settings.batch_table_name, meta_key(meta.id), f"SET {', '.join(sets)} REMOVE {', '.join(removes)}",
            condition, names=names, final=final, old=meta.status, zero=0, now=at, purge_shard=PURGE_SHARD,
            purge_at=purge_at, ttl=ttl, **named,
        ),
        accounts_table.unfinished_decrement_element(settings, meta.account_id),
    ]

def delete(settings: Settings, meta: BatchRecord, now: float) -> list[dict]:
    """-> deleted, from the status as read and with none running: out of the owner's list and the
    open index, due for the purge at once; and, unless it had finished (which gave it back), the
    account's unfinished batch given back."""
    at = int(now)
    elements = [update_element(
        settings.batch_table_name, meta_key(meta.id),
        "SET #status = :deleted, deleted_at = :now, purge_shard = :purge, purge_at = :now "
        "REMOVE #owner, created_key, open_shard",
        "#status = :old AND running = :zero AND attribute_not_exists(ending)",
        names={"#status": "status", "#owner": "owner"},
        deleted=BatchStatus.DELETED, now=at, purge=PURGE_SHARD, old=meta.status, zero=0,
    )]
    if meta.status not in FINAL_STATUSES:
        elements.append(accounts_table.unfinished_decrement_element(settings, meta.account_id))
    return elements
