"""What the EventBridge schedules run: expiry, recovery (the sweep) and purge."""

from __future__ import annotations

from freeinference_batch.batches import dispatch, jobs, lifecycle
from freeinference_batch.core import clock
from freeinference_batch.core.catalog import load_catalog
from freeinference_batch.core.observability import logger
from freeinference_batch.core.schemas import BatchJob, RequestMessage, RequestStatus
from freeinference_batch.core.settings import Settings
from freeinference_batch.ops import operator_status
from freeinference_batch.store import batch_status, files, uploads
from freeinference_batch.store.batch_keys import OPEN_SHARD, PURGE_SHARD, batch_id_of
from freeinference_batch.store.batch_record import BatchRecord
from freeinference_batch.store.batch_table import BatchTable
from freeinference_batch.store.dynamo import TransactionFailed, transact
from freeinference_batch.store.runs import RunWrites, Tally

# A batch still open this long after its window closed means something is stuck: alarm on it.
PAST_WINDOW_GRACE_SECONDS = 3600
# How many of a chain's requests past its head the sweep reads at once when counting a dead run's.
READ_AHEAD = 32
# An unchecked file batch's check has gone quiet when it is still unchecked this long after its
# job was sent: the batch jobs queue's maxReceiveCount (5) times its visibility timeout (5400 s),
# by when SQS has given a failing message up to the dead-letter queue (template.yaml).
CHECK_QUIET_SECONDS = 5 * 5400 + 600


def expire(settings: Settings) -> dict:
    """Close the completion window of batches whose `expires_at` has passed. Requests that have
    not started take `expired` from the batch; running ones finish first."""
    table = BatchTable(settings)
    now = clock.now(settings.clock_offset_file)
    expired, stuck = 0, 0
    for item in table.due("open-index", OPEN_SHARD, "expires_at", now):
        meta = table.get_meta(batch_id_of(item))
        if meta is None:
            continue
        if lifecycle.try_finalize(settings, meta, now):
            expired += 1
        elif now >= meta.expires_at + PAST_WINDOW_GRACE_SECONDS:
            stuck += 1
    _publish_gauges(settings, now)
    return {"expired": expired, "past_window": stuck}


def _publish_gauges(settings: Settings, now: float) -> None:
    """Each model's cap and slots held for the dashboard, once a minute as this schedule runs. A
    failure here is logged, never the expiry's: it has already run."""
    try:
        operator_status.publish_model_gauges(settings, load_catalog(settings.model_catalog_path), now)
    except Exception:
        logger.warning("could not publish the models' gauges", exc_info=True)


def sweep(settings: Settings) -> dict:
    """Finish what crashes leave behind: requests a dead run settled but did not count, requests
    whose worker died while running them, chains whose run died or whose message was lost, and
    batches whose last request settled without finalizing them, file batches whose files' job went
    quiet (its message lost, or dead-lettered). Only chains whose dispatch lease
    ran out are looked at: a live run renews it whenever it counts (store/runs.py)."""
    table = BatchTable(settings)
    writes = RunWrites(settings, table)
    now = clock.now(settings.clock_offset_file)
    counts = {"finalized": 0, "resent": 0, "recovered": 0, "interrupted": 0, "counted": 0, "checks_resent": 0,
              "files_resent": 0}
    for item in table.open_batches():
        meta = table.get_meta(batch_id_of(item))
        if meta is None or lifecycle.is_final(meta.status):
            continue
        if meta.ending is not None:
            if lifecycle.revive_files_job(settings, meta, now):
                counts["files_resent"] += 1
            continue
        if lifecycle.try_finalize(settings, meta, now):
            counts["finalized"] += 1
            continue
        if meta.unchecked:
            counts["checks_resent"] += resend_quiet_check(settings, meta, now)
            continue  # no lanes before its check
        changed = counts["recovered"] + counts["interrupted"] + counts["counted"]
        take_back_dead_runs(settings, table, writes, meta, now, counts)
        if counts["recovered"] + counts["interrupted"] + counts["counted"] > changed:  # maybe the last
            fresh = table.get_meta(meta.id)
            if fresh is not None and lifecycle.try_finalize(settings, fresh, now):
                counts["finalized"] += 1
    return counts


def resend_quiet_check(settings: Settings, meta: BatchRecord, now: float) -> int:
    """A file batch still unchecked CHECK_QUIET_SECONDS after its check was last sent: that job's
    message is gone (its send failed after create, or it failed every receive and went to the
    dead-letter queue), so it is sent again, once per quiet period (a conditional write first, so
    of two sweeps one sends). Answers 1 if sent. A check that keeps failing still ends with the
    batch's window (expired)."""
    if now < (meta.check_sent_at or meta.created_at) + CHECK_QUIET_SECONDS:
        return 0
    if not batch_status.check_resent(settings, meta, now):
        return 0
    jobs.send(settings, BatchJob(kind="validate", batch_id=meta.id))
    logger.warning("re-sent a file batch's quiet check", extra={"batch_id": meta.id})
    return 1


def take_back_dead_runs(settings: Settings, table: BatchTable, writes: RunWrites, meta: BatchRecord, now: float,
                        counts: dict, *, resend: bool = True) -> None:
    """The sweep of one batch: for each chain whose dispatch lease ran out, count what its dead run
    settled, take back the request it left running once that request's lease has passed, and free
    the chain (`counts` says how many of each). `resend`: send each freed chain's next message
    (the sweep); a delete, after which nothing of the batch runs, sends none (should it still be
    refused, the sweep sends them when it next passes: their chains' leases have run out)."""
    for lane in table.get_lanes(meta.id):
        _sweep_lane(settings, table, writes, meta, lane, now, counts, resend)


def _sweep_lane(settings: Settings, table: BatchTable, writes: RunWrites, meta: BatchRecord, lane: dict,
                now: float, counts: dict, resend: bool) -> None:
    positions: list[int] | None = None
    width, size = lane["width"], lane["size"]
    for chain, (head, lease, runner) in enumerate(zip(lane["heads"], lane["leases"], lane["runners"], strict=True)):
        if lease > now or (head >= size and not runner):
            continue
        positions = positions or table.get_lane_positions(meta.id, lane["model"])
        counted = _count_settled(table, writes, meta, lane, head, runner, positions, now)
        if counted is None:
            continue  # the chain moved meanwhile: its run is alive after all
        if counted > head:
            counts["counted"] += (counted - head) // width
            head = counted
        if head >= size:
            if runner and _stop_chain(writes, meta, lane, chain, runner):
                counts["recovered"] += 1
            continue
        position = positions[head]
        state = table.get_request(meta.id, position)
        if state and state["status"] == RequestStatus.RUNNING:
            if state.get("lease_until", 0) > now:
                continue
            interrupted = int(state.get("attempts", 0)) >= settings.batch_max_attempts
            if not _take_back(writes, meta, lane, head, position, state, runner, now, interrupted):
                continue
            if interrupted:
                counts["interrupted"] += 1
                head += width
            else:
                counts["recovered"] += 1
        elif state and state["status"] == RequestStatus.QUEUED and state.get("lease_until", 0) > now:
            continue
        elif runner:
            # The run died between two requests (its last settled, its next not claimed).
            if not _stop_chain(writes, meta, lane, chain, runner, fence_position=position):
                continue
            counts["recovered"] += 1
        if resend:
            _send_next(settings, table, meta, lane, head, positions, now, counts)


def _count_settled(table: BatchTable, writes: RunWrites, meta: BatchRecord, lane: dict, head: int,
                   runner: str | None, positions: list[int], now: float) -> int | None:
    """Count the requests a dead run settled past its chain's head, moving the head past them
    (conditional on the head as read, as a live run's flush is): the chain's head afterwards, or
    None when the chain moved meanwhile."""
    width, size = lane["width"], lane["size"]
    tally = Tally(lane["model"], width, head, now)
    index, done = head, False
    while index < size and not done:
        looked = range(index, min(size, index + READ_AHEAD * width), width)
        outcomes = table.get_outcomes(meta.id, [positions[i] for i in looked])
        for looked_index in looked:
            status, cost, finished_at = outcomes.get(positions[looked_index], (RequestStatus.QUEUED, 0, now))
            if status in (RequestStatus.QUEUED, RequestStatus.RUNNING):
                done = True
                break
            tally.add(status, cost, finished_at or now)  # charged to the day it finished, not today
            index = looked_index + width
    if not tally.settled:
        return head
    try:
        transact(writes.flush(meta.id, meta.account_id, tally, runner, now, now))
    except TransactionFailed:
        return None
    logger.warning("counted requests a stopped run had settled", extra={"batch_id": meta.id,
                                                                      "requests": tally.settled})
    return tally.next_head


def _stop_chain(writes: RunWrites, meta: BatchRecord, lane: dict, chain: int, runner: str,
                fence_position: int | None = None) -> bool:
    """A run died holding the chain but no request: the chain is free again, one running fewer.
    Its slot is its invocation's block's (worker/slot_blocks.py), which the sweep leaves alone: the
    invocation gives it back when it ends, or, killed, its block expires. (Giving one slot back
    from here could count it twice, should the invocation give it back too.)"""
    try:
        transact(writes.stop_chain(meta.id, lane["model"], chain, runner, fence_position))
    except TransactionFailed:
        return False
    logger.warning("freed the chain of a run that stopped", extra={"batch_id": meta.id, "chain": chain})
    return True


def _send_next(settings: Settings, table: BatchTable, meta: BatchRecord, lane: dict, head: int,
               positions: list[int], now: float, counts: dict) -> None:
    """Send the message of the lane's chain standing at `head`, unless nothing more may start."""
    if head >= lane["size"] or not lifecycle.starts_requests(meta, now):
        return  # nothing more will start; a taken-back request reads as not started
    model, slot = lane["model"], head % lane["width"]
    until = now + settings.batch_dispatch_lease_seconds
    if table.set_lane_lease(meta.id, model, slot, head, until):
        dispatch.send(settings, [RequestMessage(batch_id=meta.id, model=model, index=head, position=positions[head],
                                                account_id=meta.account_id, key_hash=meta.key_hash)])
        counts["resent"] += 1
        logger.info("re-sent a lost request message", extra={"batch_id": meta.id, "position": positions[head]})


def _take_back(writes: RunWrites, meta: BatchRecord, lane: dict, head: int, position: int, state: dict,
               runner: str | None, now: float, interrupted: bool) -> bool:
    """A worker died while running this request: back to queued, or, when every run of it died
    (say, the worker ran out of memory on it), failed with `upstream_error` and counted, its
    chain moving past it; or it would take a worker down, and every request beside it, forever.
    `upstream_error` because the spec's codes are a closed list clients switch on, and this is its
    "another server error, after every retry"; the message says what happened. No `status`: no
    HTTP answer stands behind it.
    Its run's chain is freed (one running fewer; its slot is its invocation's block's, see
    `_stop_chain`). Conditional on the dead run's claim, so a late settle cannot also count."""
    claim = state.get("claim", "")
    holder = state.get("slot_holder", claim)
    if runner is not None and runner != holder:
        return False  # another run has the chain: not this request's dead run
    if interrupted:
        attempts = int(state.get("attempts", 0))
        error = {"code": "upstream_error",
                 "message": f"Each of the request's {attempts} runs stopped before it finished "
                            "(the worker running it failed); it is not tried again"}
        request = writes.fail_request(meta.id, position, claim, error, now)
        failed = Tally(lane["model"], lane["width"], head, now)
        failed.add(RequestStatus.FAILED, 0, now)
        chain = writes.flush(meta.id, meta.account_id, failed, runner, now, now, stop=runner is not None)
    else:
        request = writes.requeue_request(meta.id, position, claim)
        chain = writes.stop_chain(meta.id, lane["model"], head % lane["width"], runner) if runner else []
    try:
        transact([request, *chain])
    except TransactionFailed:
        return False
    done = "failed a request whose every run was interrupted" if interrupted else "took back a stopped run's request"
    logger.warning(done, extra={"batch_id": meta.id, "position": position})
    return True


def purge(settings: Settings) -> dict:
    """Delete deleted batches at once and finished ones when their retention ends."""
    table = BatchTable(settings)
    now = clock.now(settings.clock_offset_file)
    purged = 0
    for item in table.due("purge-index", PURGE_SHARD, "purge_at", now):
        batch_id = batch_id_of(item)
        files.delete_batch_files(settings, batch_id)  # a file batch's output and error files: none else has
        table.purge(batch_id)
        purged += 1
    return {"purged": purged, **expire_files(settings, now)}


def expire_files(settings: Settings, now: float) -> dict:
    """Input files past their `expires_at` deleted, their count and bytes given back to their
    accounts (the caps stay true: DynamoDB's TTL is only a backstop); pending uploads past their
    hour ended, their parts deleted."""
    expired_files = files.purge_input_files(settings, now)
    expired_uploads = sum(uploads.end(settings, record, "expired")
                          for record in uploads.expired_uploads(settings, now))
    return {"expired_files": expired_files, "expired_uploads": expired_uploads}
