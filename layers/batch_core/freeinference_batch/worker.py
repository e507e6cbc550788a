"""Running request messages: the gates, the claim, the upstream call, the settle.

One message names one request. Its life, in AWS calls:

1. one BatchGetItem reads the batch, the owner's key, account and day's usage, and the model's
   interactive load (the gates, cheapest first);
2. one transaction claims it: request queued→running (attempts+1), the batch's running count,
   a model slot and an account slot (slots are leases, see store/leases.py);
3. the upstream call;
4. one transaction settles it: the request's final state (or back to queued for a retry), the
   batch's counters and cost, the day's usage, both slots released, and the lane's chain moved on;
5. one SendMessageBatch puts the chain's next request on the queue.

Every write is conditional on the request's claim token, so duplicate deliveries, concurrent
workers and a worker that dies between any two steps never count anything twice: what a dead
worker leaves behind, the sweep finds by its expired lease.
"""

from __future__ import annotations

import bisect
import random
import threading
import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from freeinference_batch import accounts, clock, dispatch, lifecycle, upstream
from freeinference_batch.catalog import load_catalog
from freeinference_batch.observability import logger, metrics
from freeinference_batch.schemas import RequestMessage
from freeinference_batch.settings import Settings
from freeinference_batch.store import accounts_table
from freeinference_batch.store.batch_table import BatchTable, meta_key
from freeinference_batch.store.dynamo import TransactionFailed, batch_get, transact
from freeinference_batch.store.leases import Leases, account_slots_key, model_slots_key

# A slot wait re-checks after a short, jittered pause; longer waits re-check less often.
SLOT_WAIT_SECONDS = (1.0, 3.0)
ACCESS_WAIT_SECONDS = 60.0
UNEXPECTED_ERROR_WAIT_SECONDS = 10.0
FRESH_COPY_AFTER_RECEIVES = 500
_metrics_lock = threading.Lock()


class SimulatedCrash(BaseException):
    """Chaos tests only: the worker dies here, as a killed Lambda would (nothing cleans up)."""


@dataclass
class Done:
    """The message is finished with: delete it."""


@dataclass
class Parked:
    """The message stays: its visibility was set to when it should come back."""

    seconds: float
    # A message that keeps failing unexpectedly must reach the dead-letter queue: never refresh it.
    refresh: bool = True


def _metric(name: str, value: float = 1, unit: str = "Count") -> None:
    with _metrics_lock:
        metrics.add_metric(name=name, unit=unit, value=value)


class Worker:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.table = BatchTable(settings)
        self.leases = Leases(settings)
        self.catalog = load_catalog(settings.model_catalog_path)

    def now(self) -> float:
        return clock.now(self.settings.clock_offset_file)

    def _maybe_crash(self, step: str) -> None:
        if self.settings.batch_fault_crash_rate and random.random() < self.settings.batch_fault_crash_rate:
            raise SimulatedCrash(step)

    # ---- entry --------------------------------------------------------------------------

    def handle_record(self, record: dict) -> Done | Parked:
        """One SQS record (the raw Lambda event record); Done means delete the message."""
        try:
            message = RequestMessage.model_validate_json(record["body"])
        except ValidationError:
            logger.error("dropping a message that is not a request message", extra={"message_id": record["messageId"]})
            return Done()
        try:
            outcome = self.process(message, record)
        except Exception:
            # Nothing was settled; try again shortly (a claim left behind is recovered by its lease).
            logger.exception("request failed unexpectedly", extra={"batch_id": message.batch_id,
                                                                  "position": message.position})
            outcome = Parked(UNEXPECTED_ERROR_WAIT_SECONDS, refresh=False)
        if isinstance(outcome, Parked):
            receives = int(record.get("attributes", {}).get("ApproximateReceiveCount", 1))
            if outcome.refresh and receives >= FRESH_COPY_AFTER_RECEIVES and outcome.seconds <= 900:
                # Every park is a receive, and the dead-letter redrive counts receives (at most
                # 1000): a message that waits long for slots is replaced by a fresh copy.
                dispatch.send(self.settings, [message], delay_seconds=round(outcome.seconds))
                return Done()
            dispatch.park(self.settings, message.model, record["receiptHandle"], outcome.seconds)
        return outcome

    # ---- one request --------------------------------------------------------------------

    def process(self, message: RequestMessage, record: dict) -> Done | Parked:
        now = self.now()
        meta, key_item, account, usage, load = self._read_gate_items(message, now)
        log = {"batch_id": message.batch_id, "position": message.position, "model": message.model}

        # Gate 1: the batch is gone or no longer runs this request.
        if meta is None or meta["status"] not in lifecycle.RUNNABLE:
            if meta is not None:
                lifecycle.try_finalize(self.settings, self.table, meta, now)
            return Done()
        # Gate 2: the window closed before the request started: it expires with the batch.
        if now >= meta["expires_at"]:
            lifecycle.try_finalize(self.settings, self.table, meta, now)
            return Done()
        # Gate 3: the owner, checked again before every run.
        owner = accounts.judge_owner(self.catalog, meta["account_id"], key_item or None, account or None,
                                     int(usage.get("cost_nano", 0)), now)
        if owner.status == accounts.OwnerStatus.UNAUTHORIZED:
            logger.info("owner no longer valid: failing the batch", extra={**log, "reason": owner.reason})
            lifecycle.fail_batch(self.settings, self.table, meta, now, "owner_unauthorized",
                                 f"The key or account that created the batch is no longer valid: {owner.reason}")
            return Done()
        if owner.status == accounts.OwnerStatus.QUOTA_EXHAUSTED:
            assert owner.resume_at is not None
            _metric("RequestsParked")
            return self._park_long(message, meta, owner.resume_at + random.uniform(1, 30) - now)
        if owner.status == accounts.OwnerStatus.NO_BATCH_ACCESS:
            _metric("RequestsParked")
            return self._park_long(message, meta, ACCESS_WAIT_SECONDS)
        # Gate 4: room on the model and in the account's concurrency.
        model = self.catalog.models.get(message.model)
        if model is None:
            return self._settle_without_run(message, meta, {"code": "model_not_found", "status": 404,
                                                             "message": f"Model {message.model!r} not found"})
        capacity = model.batch_capacity(int(load.get("inflight", 0)))
        if capacity <= 0:
            return self._wait_for_slot(message, meta, record, now)

        token = uuid.uuid4().hex
        lease_until = now + self.settings.lease_seconds
        claim = [
            self.table.request_update_element(
                message.batch_id, message.position,
                "SET #status = :running, attempts = if_not_exists(attempts, :zero) + :one, claim = :token, "
                "lease_until = :lease, started_at = if_not_exists(started_at, :now), #ttl = :ttl, "
                "model = :model, lane_index = :index",
                "attribute_not_exists(pk) OR #status = :queued",
                names={"#status": "status", "#ttl": "ttl"},
                running="running", queued="queued", zero=0, one=1, token=token, lease=lease_until,
                now=int(now), ttl=meta["ttl"], model=message.model, index=message.index,
            ),
            self.table.meta_update_element(
                message.batch_id,
                "SET #status = :in_progress, in_progress_at = if_not_exists(in_progress_at, :now) ADD running :one",
                "#status IN (:validating, :in_progress) AND expires_at > :now",
                names={"#status": "status"}, in_progress="in_progress", validating="validating",
                now=int(now), one=1,
            ),
            self.leases.acquire_element(model_slots_key(message.model), token, capacity, lease_until),
            self.leases.acquire_element(account_slots_key(meta["account_id"]), token,
                                        owner.concurrency_limit, lease_until),
        ]
        for attempt in range(2):
            try:
                transact(claim)
                break
            except TransactionFailed as failure:
                if failure.failed(0):
                    return Done()  # a duplicate: the request already runs or has settled
                if failure.failed(1):
                    return Parked(0)  # the batch changed (cancelled, expired...): look again
                # No free slot: drop expired leases (a dead worker's) and, if any, try once more.
                freed = self.leases.reap(model_slots_key(message.model), now) + self.leases.reap(
                    account_slots_key(meta["account_id"]), now)
                if not freed or attempt:
                    return self._wait_for_slot(message, meta, record, now)

        self._maybe_crash("after claim")
        _metric("RequestsRun")
        sent = float(record.get("attributes", {}).get("SentTimestamp", now * 1000)) / 1000
        _metric("QueueWait", max(0.0, now - sent), "Seconds")
        body = self._request_body(meta, message.position)
        outcome = upstream.call(self.settings, body, account_id=meta["account_id"],
                                request_ref=f"{message.batch_id}:{message.position}")
        self._maybe_crash("after upstream call")
        return self._settle(message, meta, token, outcome)

    # ---- reading ------------------------------------------------------------------------

    def _read_gate_items(self, message: RequestMessage, now: float) -> tuple[dict | None, dict, dict, dict, dict]:
        account_id, key_hash = message.account_id, message.key_hash
        day = clock.utc_day(now)
        accounts_keys = [accounts_table.key_item_key(key_hash), accounts_table.account_item_key(account_id),
                         accounts_table.usage_item_key(account_id, day), accounts_table.load_item_key(message.model)]
        found = batch_get({
            self.table.name: {"Keys": [meta_key(message.batch_id)], "ConsistentRead": True},
            self.settings.accounts_table_name: {"Keys": accounts_keys, "ConsistentRead": True},
        })
        meta = found[self.table.name][0] if found[self.table.name] else None
        by_key = {(i["pk"], i["sk"]): i for i in found[self.settings.accounts_table_name]}

        def pick(k: dict) -> dict:
            return by_key.get((k["pk"]["S"], k["sk"]["S"]), {})

        if meta is not None and (meta["account_id"] != account_id or meta["key_hash"] != key_hash):
            # Messages are ours, but never trust one over the batch it names.
            logger.error("message owner does not match its batch", extra={"batch_id": message.batch_id})
            return None, {}, {}, {}, {}
        return meta, *(pick(k) for k in accounts_keys)  # type: ignore[return-value]

    def _request_body(self, meta: dict, position: int) -> dict:
        starts = meta["chunk_starts"]
        number = bisect.bisect_right(starts, position) - 1
        return self.table.get_chunk(meta["id"], number)[position - starts[number]][2]

    # ---- waiting ------------------------------------------------------------------------

    def _wait_for_slot(self, message: RequestMessage, meta: dict, record: dict, now: float) -> Parked:
        _metric("RequestsParked")
        sent = float(record.get("attributes", {}).get("SentTimestamp", now * 1000)) / 1000
        if now - sent > self.settings.batch_dispatch_lease_seconds / 2:
            # Waiting long: tell the sweep this chain is alive, or it would send a duplicate.
            self._renew_dispatch_lease(message, meta, now + self.settings.batch_dispatch_lease_seconds)
        return Parked(random.uniform(*SLOT_WAIT_SECONDS))

    def _park_long(self, message: RequestMessage, meta: dict, seconds: float) -> Parked:
        seconds = min(seconds, 12 * 3600 - 60)  # SQS caps a visibility change at 12 h: re-park later
        self._renew_dispatch_lease(message, meta, self.now() + seconds + self.settings.batch_dispatch_lease_seconds)
        return Parked(seconds)

    def _renew_dispatch_lease(self, message: RequestMessage, meta: dict, until: float) -> None:
        width = meta["lane_widths"][message.model]
        self.table.set_lane_lease(message.batch_id, message.model, message.index % width, message.index, until)
        self.table.update_request(message.batch_id, message.position, "SET lease_until = :until",
                                  "#status = :queued", names={"#status": "status"}, until=until, queued="queued")

    # ---- settling -----------------------------------------------------------------------

    def _settle(self, message: RequestMessage, meta: dict, token: str, outcome: upstream.Outcome) -> Done | Parked:
        now = self.now()
        state = self.table.get_request(message.batch_id, message.position) if outcome.kind == "retry" else None
        attempts = int(state.get("attempts", 1)) if state else 1
        if outcome.kind == "retry" and attempts < self.settings.batch_max_attempts:
            delay = self._backoff(attempts, outcome.retry_after)
            requeued = self._transact_settle(message, meta, token, now, status="queued", error=outcome.error,
                                             lease_until=now + delay + self.settings.batch_dispatch_lease_seconds)
            if not requeued:
                return Done()
            _metric("RequestsRetried")
            logger.info("request will be retried", extra={"batch_id": message.batch_id, "position": message.position,
                                                          "attempt": attempts, "delay": round(delay, 2),
                                                          "code": outcome.error and outcome.error["code"]})
            return Parked(delay)
        if outcome.kind == "completed":
            assert outcome.response is not None
            prompt, completion = upstream.usage_of(outcome.response["body"])
            cost = self.catalog.models[message.model].cost_nano(prompt, completion)
            settled = self._transact_settle(message, meta, token, now, status="completed",
                                            response=outcome.response, cost_nano=cost)
        else:
            _metric("RequestsFailed")
            settled = self._transact_settle(message, meta, token, now, status="failed", error=outcome.error)
        if settled:
            self._maybe_crash("after settle")
            self._continue_chain(message, meta, now)
        return Done()

    def _settle_without_run(self, message: RequestMessage, meta: dict, error: dict) -> Done:
        """A request that can never run (its model left the catalog) fails without a claim."""
        now = self.now()
        elements = [
            self.table.request_update_element(
                message.batch_id, message.position,
                "SET #status = :failed, #error = :error, finished_at = :now, #ttl = :ttl",
                "attribute_not_exists(pk) OR #status = :queued",
                names={"#status": "status", "#error": "error", "#ttl": "ttl"},
                failed="failed", error=error, now=int(now), ttl=meta["ttl"], queued="queued"),
            self.table.meta_update_element(message.batch_id, "ADD failed :one", one=1),
            self._lane_advance(message, meta, now),
        ]
        try:
            transact(elements)
        except TransactionFailed:
            return Done()
        self._continue_chain(message, meta, now)
        return Done()

    def _transact_settle(self, message: RequestMessage, meta: dict, token: str, now: float, *, status: str,
                         error: dict | None = None, response: dict | None = None, cost_nano: int = 0,
                         lease_until: float | None = None) -> bool:
        names = {"#status": "status"}
        named: dict[str, Any] = {"status": status, "token": token, "running": "running"}
        sets = ["#status = :status"]
        if error is not None:
            sets.append("#error = :error")
            names["#error"] = "error"
            named["error"] = error
        if response is not None:
            attribute, value = self.table.response_attribute(message.batch_id, message.position, response)
            sets.append(f"#{attribute} = :response")
            names[f"#{attribute}"] = attribute
            named["response"] = value
        if status == "queued":
            sets.append("lease_until = :lease")
            named["lease"] = lease_until
            removes = "claim"
        else:
            sets.append("finished_at = :now")
            named["now"] = int(now)
            removes = "claim, lease_until"
        if cost_nano:
            sets.append("cost_nano = :cost")
            named["cost"] = cost_nano
        elements = [
            self.table.request_update_element(
                message.batch_id, message.position, f"SET {', '.join(sets)} REMOVE {removes}",
                "#status = :running AND claim = :token", names=names, **named),
        ]
        counter = {"completed": "completed :one, ", "failed": "failed :one, "}.get(status, "")
        meta_update = f"ADD {counter}running :minus_one" + (", cost_nano :cost" if cost_nano else "")
        meta_values: dict[str, Any] = {"minus_one": -1}
        if counter:
            meta_values["one"] = 1
        if cost_nano:
            meta_values["cost"] = cost_nano
        elements.append(self.table.meta_update_element(message.batch_id, meta_update, **meta_values))
        if cost_nano:
            elements.append(accounts_table.add_usage_element(self.settings, meta["account_id"], cost_nano,
                                                             clock.utc_day(now), int(now)))
        elements.append(self.leases.release_element(model_slots_key(message.model), token))
        elements.append(self.leases.release_element(account_slots_key(meta["account_id"]), token))
        if status != "queued":
            elements.append(self._lane_advance(message, meta, now))
        try:
            transact(elements)
        except TransactionFailed:
            # Our claim was taken back (the lease ran out and recovery re-queued it): the other
            # run's outcome counts, not ours.
            logger.warning("settle lost its claim", extra={"batch_id": message.batch_id, "position": message.position})
            return False
        return True

    def _lane_advance(self, message: RequestMessage, meta: dict, now: float) -> dict:
        width = meta["lane_widths"][message.model]
        return self.table.lane_update_element(message.batch_id, message.model, message.index % width,
                                              message.index + width, now + self.settings.batch_dispatch_lease_seconds)

    def _continue_chain(self, message: RequestMessage, meta: dict, now: float) -> None:
        """Send the chain's next request; at the chain's end, see whether the batch is done."""
        width = meta["lane_widths"][message.model]
        positions = self.table.get_lane_positions(message.batch_id, message.model)
        following = message.index + width
        if following < len(positions):
            dispatch.send(self.settings, [message.model_copy(update={"index": following,
                                                                     "position": positions[following]})])
            return
        fresh = self.table.get_meta(message.batch_id)
        if fresh is not None:
            lifecycle.try_finalize(self.settings, self.table, fresh, now)

    def _backoff(self, attempts: int, retry_after: float | None) -> float:
        """Exponential backoff with jitter; an upstream Retry-After is a floor."""
        base = self.settings.batch_retry_base_seconds * 2 ** (attempts - 1)
        delay = min(self.settings.batch_retry_max_seconds, base) * random.uniform(0.5, 1.0)
        if retry_after:
            delay = max(delay, min(retry_after, self.settings.batch_retry_max_seconds))
        return delay
