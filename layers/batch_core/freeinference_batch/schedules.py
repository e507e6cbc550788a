"""What the EventBridge schedules run: expiry, recovery (the sweep) and purge."""

from __future__ import annotations

from freeinference_batch import clock, dispatch, lifecycle
from freeinference_batch.observability import logger
from freeinference_batch.schemas import RequestMessage
from freeinference_batch.settings import Settings
from freeinference_batch.store.batch_table import OPEN_SHARD, PURGE_SHARD, BatchTable, batch_id_of
from freeinference_batch.store.dynamo import TransactionFailed, transact
from freeinference_batch.store.leases import Leases, account_slots_key, model_slots_key

# A batch still open this long after its window closed means something is stuck: alarm on it.
PAST_WINDOW_GRACE_SECONDS = 3600


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
        if lifecycle.try_finalize(settings, table, meta, now):
            expired += 1
        elif now >= meta["expires_at"] + PAST_WINDOW_GRACE_SECONDS:
            stuck += 1
    return {"expired": expired, "past_window": stuck}


def sweep(settings: Settings) -> dict:
    """Finish what crashes leave behind: chains whose message was lost, requests whose worker
    died while running them, batches whose last request settled without finalizing them."""
    table = BatchTable(settings)
    now = clock.now(settings.clock_offset_file)
    counts = {"finalized": 0, "resent": 0, "recovered": 0, "interrupted": 0}
    for item in table.open_batches():
        meta = table.get_meta(batch_id_of(item))
        if meta is None or lifecycle.is_final(meta["status"]):
            continue
        if lifecycle.try_finalize(settings, table, meta, now):
            counts["finalized"] += 1
            continue
        stopped_runs = counts["recovered"] + counts["interrupted"]
        for lane in table.get_lanes(meta["id"]):
            _sweep_lane(settings, table, meta, lane, now, counts)
        if counts["recovered"] + counts["interrupted"] > stopped_runs:  # maybe the last that ran
            fresh = table.get_meta(meta["id"])
            if fresh is not None and lifecycle.try_finalize(settings, table, fresh, now):
                counts["finalized"] += 1
    return counts


def _sweep_lane(settings: Settings, table: BatchTable, meta: dict, lane: dict, now: float, counts: dict) -> None:
    positions: list[int] | None = None
    for head, lease in zip(lane["heads"], lane["leases"], strict=True):
        if head >= lane["size"] or lease > now:
            continue
        positions = positions or table.get_lane_positions(meta["id"], lane["model"])
        position = positions[head]
        state = table.get_request(meta["id"], position)
        if state and state["status"] == "running":
            if state.get("lease_until", 0) > now:
                continue
            if int(state.get("attempts", 0)) >= settings.batch_max_attempts:
                # Every run of it died (say, the worker ran out of memory on it): stop here,
                # or it would take a worker down, and every request beside it, forever.
                if _fail_interrupted(settings, table, meta, lane, head, position, state, now):
                    counts["interrupted"] += 1
                    _send_next(settings, table, meta, lane, head + lane["width"], positions, now, counts)
                continue
            if not _take_back(settings, table, meta, position, state):
                continue
            counts["recovered"] += 1
        elif state and state["status"] == "queued" and state.get("lease_until", 0) > now:
            continue
        elif state and state["status"] not in ("queued", "running"):
            continue  # settled; the chain moved on in the same transaction
        _send_next(settings, table, meta, lane, head, positions, now, counts)


def _send_next(settings: Settings, table: BatchTable, meta: dict, lane: dict, head: int, positions: list[int],
               now: float, counts: dict) -> None:
    """Send the message of the lane's chain standing at `head`, unless nothing more may start."""
    if head >= lane["size"] or not lifecycle.starts_requests(meta, now):
        return  # nothing more will start; a taken-back request reads as not started
    model, slot = lane["model"], head % lane["width"]
    until = now + settings.batch_dispatch_lease_seconds
    if table.set_lane_lease(meta["id"], model, slot, head, until):
        dispatch.send(settings, [RequestMessage(batch_id=meta["id"], model=model, index=head, position=positions[head],
                                                account_id=meta["account_id"], key_hash=meta["key_hash"])])
        counts["resent"] += 1
        logger.info("re-sent a lost request message", extra={"batch_id": meta["id"], "position": positions[head]})


def _take_back(settings: Settings, table: BatchTable, meta: dict, position: int, state: dict) -> bool:
    """A worker died while running this request: back to queued, its slots released, the batch's
    running count down. Conditional on the dead run's claim, so a late settle cannot also count."""
    leases = Leases(settings)
    claim = state.get("claim", "")
    holder = state.get("slot_holder", claim)
    elements = [
        table.request_update_element(
            meta["id"], position, "SET #status = :queued, lease_until = :zero REMOVE claim, slot_holder",
            "#status = :running AND claim = :claim", names={"#status": "status"},
            queued="queued", running="running", claim=claim, zero=0),
        table.meta_update_element(meta["id"], "ADD running :minus_one", minus_one=-1),
        leases.release_element(model_slots_key(state.get("model", "")), holder),
        leases.release_element(account_slots_key(meta["account_id"]), holder),
    ]
    try:
        transact(elements)
    except TransactionFailed:
        return False
    logger.warning("took back a request whose worker stopped", extra={"batch_id": meta["id"], "position": position})
    return True


def _fail_interrupted(settings: Settings, table: BatchTable, meta: dict, lane: dict, head: int, position: int,
                      state: dict, now: float) -> bool:
    """A request whose every attempt died mid-run fails (`run_interrupted`), its slots are
    released and its chain moves on. Conditional on the dead run's claim, like a take-back."""
    leases = Leases(settings)
    claim = state.get("claim", "")
    holder = state.get("slot_holder", claim)
    attempts = int(state.get("attempts", 0))
    error = {"code": "run_interrupted",
             "message": f"Each of the request's {attempts} runs stopped before it finished "
                        "(the worker running it failed); it is not tried again"}
    elements = [
        table.request_update_element(
            meta["id"], position, "SET #status = :failed, #error = :error, finished_at = :now "
            "REMOVE claim, slot_holder, lease_until", "#status = :running AND claim = :claim",
            names={"#status": "status", "#error": "error"}, failed="failed", error=error, now=int(now),
            running="running", claim=claim),
        table.meta_update_element(meta["id"], "ADD running :minus_one, failed :one", minus_one=-1, one=1),
        leases.release_element(model_slots_key(lane["model"]), holder),
        leases.release_element(account_slots_key(meta["account_id"]), holder),
        table.lane_update_element(meta["id"], lane["model"], head % lane["width"], head + lane["width"], now),
    ]
    try:
        transact(elements)
    except TransactionFailed:
        return False
    logger.warning("failed a request whose every run was interrupted", extra={"batch_id": meta["id"],
                                                                           "position": position})
    return True


def purge(settings: Settings) -> dict:
    """Delete deleted batches at once and finished ones when their retention ends."""
    table = BatchTable(settings)
    now = clock.now(settings.clock_offset_file)
    purged = 0
    for item in table.due("purge-index", PURGE_SHARD, "purge_at", now):
        table.purge(batch_id_of(item))
        purged += 1
    return {"purged": purged}
