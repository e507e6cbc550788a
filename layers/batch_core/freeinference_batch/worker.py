"""Running request messages: the gates, the claim, the upstream call, the settle, the hand-over.

One message starts one chain of a lane (requests k, k+W, k+2W, ... of it, see dispatch.py). In AWS
calls, a request's life is:

1. one BatchGetItem reads the batch, the owner's key, account and day's usage, the model's
   interactive load and both slot items (the gates, cheapest first);
2. one transaction claims it: request queued→running (attempts+1), the batch's running count,
   a model slot and an account slot (slots are leases held by the chain, see store/leases.py);
3. the upstream call;
4. one transaction hands over: this request's final state, the batch's counters and cost, the
   day's usage, the lane's chain moved on, and the chain's next request claimed, after step 1's
   gates for it. The chain keeps its two slots without writing them (it renews its hold once
   per `lease_seconds`). The next request then runs in the same invocation.

A chain leaves the invocation (a plain settle that releases the slots, and a message for its
next request) when a gate says no, the invocation is near its timeout, the request is to be
retried, or a smaller batch waits for the slots (then the chain yields, see `_should_yield`).
Whoever releases a slot wakes the best waiting chain at once.

Every write is conditional on the request's claim token, so duplicate deliveries, concurrent
workers and a worker that dies between any two steps never count anything twice: what a dead
worker leaves behind, the sweep finds by its expired lease.
"""

from __future__ import annotations

import bisect
import random
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError
from pydantic import ValidationError

from freeinference_batch import accounts, aws, clock, dispatch, fairness, lifecycle, model_backoff, upstream
from freeinference_batch.catalog import load_catalog
from freeinference_batch.fairness import fair_shares, keeps_slot, live_waiters
from freeinference_batch.observability import logger, metrics
from freeinference_batch.schemas import RequestMessage
from freeinference_batch.settings import Settings
from freeinference_batch.store import accounts_table
from freeinference_batch.store.batch_table import BatchTable, meta_key
from freeinference_batch.store.dynamo import TransactionFailed, batch_get, transact
from freeinference_batch.store.leases import (
    Leases,
    Waiter,
    account_slots_key,
    model_slots_key,
    new_holder,
)

# A slot wait re-checks after a short, jittered pause; a registered waiter is woken when a slot
# frees, so its park is only the fallback should the wake be lost.
SLOT_WAIT_SECONDS = (1.0, 3.0)
WOKEN_WAIT_SECONDS = (5.0, 10.0)
ACCESS_WAIT_SECONDS = 60.0
UNEXPECTED_ERROR_WAIT_SECONDS = 10.0
FRESH_COPY_AFTER_RECEIVES = 500
# A chain carries on in the invocation only while one more upstream call and its bookkeeping fit.
HANDOVER_MARGIN_SECONDS = 30.0
# A chain that yields its slot sends its next message this late, so the woken chain comes first.
YIELD_DELAY_SECONDS = 1
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


@dataclass
class Claimed:
    """A request this worker has claimed and is to run."""

    message: RequestMessage
    meta: dict
    # The request's claim (every write of its run is conditional on it) and the chain's hold on
    # its two slots, which outlives the claim: a hand-over passes the slots on without writing them.
    token: str
    holder: str
    # False for a request claimed by a hand-over: the SQS record in hand belongs to an earlier one.
    has_record: bool
    # The model's batch capacity and backoff as the claim's gates read them (model_backoff.py).
    capacity: int = 0
    backoff: model_backoff.Backoff | None = None


@dataclass
class Leave:
    """A chain leaves the invocation: its next request goes by a message sent `delay_seconds` late.
    `yielded_from` holds the slots items as read when the chain gave its slots to a waiting batch."""

    delay_seconds: int = 0
    yielded_from: list[dict | None] | None = None


@dataclass
class Gates:
    """What the gate read found for one request."""

    meta: dict | None
    key_item: dict
    account: dict
    usage_nano: int
    load: int
    model_slots: dict | None
    account_slots: dict | None
    backoff: model_backoff.Backoff | None = None


@dataclass
class Verdict:
    """The gates' answer: `run` with the two capacities, or why not."""

    kind: str  # run | gone | unauthorized | quota | no_access | no_model
    owner: accounts.OwnerState | None = None
    capacity: int = 0


def _metric(name: str, value: float = 1, unit: str = "Count") -> None:
    with _metrics_lock:
        metrics.add_metric(name=name, unit=unit, value=value)


def _remaining(meta: dict) -> int:
    return int(meta["total"]) - int(meta.get("completed", 0)) - int(meta.get("failed", 0))


def _chain(message: RequestMessage, meta: dict) -> int:
    """Which of its lane's chains the message's request belongs to."""
    return message.index % meta["lane_widths"][message.model]


def _slots_as_read(message: RequestMessage, gates: Gates, verdict: Verdict) -> list[tuple[dict, dict | None, int]]:
    """(key, item as the gates read it, capacity) of the model's and the account's slots, in that order."""
    assert verdict.owner is not None
    return [(model_slots_key(message.model), gates.model_slots, verdict.capacity),
            (account_slots_key(message.account_id), gates.account_slots, verdict.owner.concurrency_limit)]


def _waiting_since(message: RequestMessage, record: dict, now: float) -> float:
    """When the message's chain began to wait: when it was sent, or when the message it is a
    fresh copy of was (a copy must not lose its place in the queue of waiting batches)."""
    if message.waiting_since is not None:
        return message.waiting_since
    return float(record.get("attributes", {}).get("SentTimestamp", now * 1000)) / 1000


def _waiter_id(message: RequestMessage, meta: dict) -> str:
    return f"{message.batch_id}#{_chain(message, meta)}"


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

    def handle_record(self, record: dict, deadline: float | None = None) -> Done | Parked:
        """One SQS record (the raw Lambda event record); Done means delete the message.

        `deadline` (time.monotonic()) is when the invocation times out; without one, each
        message runs its one request and the chain goes on by a new message."""
        try:
            message = RequestMessage.model_validate_json(record["body"])
        except ValidationError:
            logger.error("dropping a message that is not a request message", extra={"message_id": record["messageId"]})
            return Done()
        try:
            outcome = self.process(message, record, deadline)
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
                since = _waiting_since(message, record, self.now())
                dispatch.send(self.settings, [message.model_copy(update={"waiting_since": since})],
                              delay_seconds=round(outcome.seconds))
                return Done()
            dispatch.park(self.settings, message.model, record["receiptHandle"], outcome.seconds)
        return outcome

    def process(self, message: RequestMessage, record: dict, deadline: float | None = None) -> Done | Parked:
        """Run the message's request and, while the deadline allows, the rest of its chain."""
        step = self._claim(message, record)
        while isinstance(step, Claimed):
            step = self._run(step, deadline)
        return step

    # ---- gates --------------------------------------------------------------------------

    def _read_gates(self, message: RequestMessage, now: float) -> Gates:
        account_id, key_hash = message.account_id, message.key_hash
        accounts_keys = [accounts_table.key_item_key(key_hash), accounts_table.account_item_key(account_id),
                         accounts_table.usage_item_key(account_id, clock.utc_day(now)),
                         accounts_table.load_item_key(message.model), model_slots_key(message.model),
                         account_slots_key(account_id), accounts_table.backoff_item_key(message.model)]
        found = batch_get({
            self.table.name: {"Keys": [meta_key(message.batch_id)], "ConsistentRead": True},
            self.settings.accounts_table_name: {"Keys": accounts_keys, "ConsistentRead": True},
        })
        meta = found[self.table.name][0] if found[self.table.name] else None
        by_key = {(i["pk"], i["sk"]): i for i in found[self.settings.accounts_table_name]}
        key_item, account, usage, load, model_slots, account_slots, backoff = (
            by_key.get((k["pk"]["S"], k["sk"]["S"])) for k in accounts_keys)
        if meta is not None and (meta["account_id"] != account_id or meta["key_hash"] != key_hash):
            # Messages are ours, but never trust one over the batch it names.
            logger.error("message owner does not match its batch", extra={"batch_id": message.batch_id})
            meta = None
        return Gates(meta=meta, key_item=key_item or {}, account=account or {},
                     usage_nano=int((usage or {}).get("cost_nano", 0)), load=int((load or {}).get("inflight", 0)),
                     model_slots=model_slots, account_slots=account_slots,
                     backoff=accounts_table.backoff_of(backoff))

    def _judge(self, message: RequestMessage, gates: Gates, now: float, pending_cost: int = 0) -> Verdict:
        """The gates, cheapest first. `pending_cost` is usage about to be added by a hand-over."""
        meta = gates.meta
        # The batch is gone, no longer starts requests, or its window closed before this one started.
        if meta is None or not lifecycle.starts_requests(meta, now):
            return Verdict("gone")
        # The owner, checked again before every run.
        owner = accounts.judge_owner(self.catalog, meta["account_id"], gates.key_item or None,
                                     gates.account or None, gates.usage_nano + pending_cost, now)
        kind = {accounts.OwnerStatus.UNAUTHORIZED: "unauthorized", accounts.OwnerStatus.QUOTA_EXHAUSTED: "quota",
                accounts.OwnerStatus.NO_BATCH_ACCESS: "no_access"}.get(owner.status)
        if kind:
            return Verdict(kind, owner)
        model = self.catalog.models.get(message.model)
        if model is None:
            return Verdict("no_model", owner)
        return Verdict("run", owner, model_backoff.capped(model.batch_capacity(gates.load), gates.backoff))

    # ---- claiming -----------------------------------------------------------------------

    def _claim(self, message: RequestMessage, record: dict) -> Done | Parked | Claimed:
        now = self.now()
        gates = self._read_gates(message, now)
        verdict = self._judge(message, gates, now)
        meta = gates.meta
        log = {"batch_id": message.batch_id, "position": message.position, "model": message.model}
        if verdict.kind == "gone":
            if meta is not None:
                lifecycle.try_finalize(self.settings, self.table, meta, now)
            return Done()
        assert meta is not None and verdict.owner is not None
        owner = verdict.owner
        if verdict.kind == "unauthorized":
            logger.info("owner no longer valid: failing the batch", extra={**log, "reason": owner.reason})
            lifecycle.fail_batch(self.settings, self.table, meta, now, "owner_unauthorized",
                                 f"The key or account that created the batch is no longer valid: {owner.reason}")
            return Done()
        if verdict.kind == "quota":
            assert owner.resume_at is not None
            _metric("RequestsParked")
            return self._park_long(message, meta, owner.resume_at + random.uniform(1, 30) - now)
        if verdict.kind == "no_access":
            _metric("RequestsParked")
            return self._park_long(message, meta, ACCESS_WAIT_SECONDS)
        if verdict.kind == "no_model":
            return self._settle_without_run(message, meta, {"code": "model_not_found", "status": 404,
                                                             "message": f"Model {message.model!r} not found"})
        if verdict.capacity <= 0:
            return self._wait_for_slot(message, meta, record, now, None, None, 0)

        slots = _slots_as_read(message, gates, verdict)
        for slots_key, item, capacity in slots:
            leases = (item or {}).get("leases")
            if leases is not None and len(leases) < capacity:
                continue
            # Full as read. Held by live leases, it is waited for: registering as a waiter answers
            # the item as it is then, so a slot freed since the read is seen there. Otherwise (never
            # used, or a dead worker's lease expired in it) reap first, counting from reap's own read.
            live = leases is not None and all(until > now for until in leases.values())
            if (live and record.get("receiptHandle")) or self.leases.reap(slots_key, now) >= capacity:
                return self._wait_for_slot(message, meta, record, now, slots_key, item, capacity)

        sent = _waiting_since(message, record, now)
        holder = new_holder(message.batch_id, _chain(message, meta), aged=fairness.waited_its_turn(now - sent))
        token = uuid.uuid4().hex
        slots_until = now + self.settings.slot_lease_seconds
        waiter_id = _waiter_id(message, meta)
        claim = [
            self._claim_request_element(message, meta, token, holder, now),
            self.table.meta_update_element(
                message.batch_id,
                "SET #status = :in_progress, in_progress_at = if_not_exists(in_progress_at, :now) ADD running :one",
                f"{lifecycle.STARTS_REQUESTS} AND expires_at > :now",
                names={"#status": "status"}, in_progress="in_progress", validating="validating",
                now=int(now), one=1,
            ),
            *(self.leases.acquire_element(slots_key, holder, capacity, slots_until,
                                          stop_waiting=waiter_id if waiter_id in (item or {}).get("waiters", {})
                                          else None)
              for slots_key, item, capacity in slots),
        ]
        try:
            transact(claim)
        except TransactionFailed as failure:
            if failure.failed(0):
                return self._duplicate(message, now)
            if failure.failed(1):
                return Parked(0)  # the batch changed (cancelled, expired...): look again
            # Someone took the slot since the read.
            full = 2 if failure.failed(2) else 3
            slots_key, _, capacity = slots[full - 2]
            return self._wait_for_slot(message, meta, record, now, slots_key, None, capacity)
        _metric("QueueWait", max(0.0, now - sent), "Seconds")
        return Claimed(message, meta, token, holder, has_record=True, capacity=verdict.capacity,
                       backoff=gates.backoff)

    def _duplicate(self, message: RequestMessage, now: float) -> Done | Parked:
        """The claim found the request not queued. If it has settled, this message is spent: drop
        it. Otherwise this may be the very message that another delivery is running (or has just
        put back for a retry), made visible again by a wake that used the receipt handle of an
        earlier delivery: deleting it would lose the chain's token. Keep it: until the run's lease
        ends if the request runs, or to look again at once if it is queued again; whichever
        delivery of it then finds the request settled drops it."""
        state = self.table.get_request(message.batch_id, message.position) or {"status": "queued"}
        if state["status"] == "running":
            return Parked(max(1.0, float(state.get("lease_until", now)) - now + random.uniform(1, 5)))
        if state["status"] == "queued":
            return Parked(0)
        return Done()

    def _claim_request_element(self, message: RequestMessage, meta: dict, token: str, holder: str,
                               now: float) -> dict:
        """The request's claim; it names the slots' holder, which the sweep releases should the run die."""
        return self.table.request_update_element(
            message.batch_id, message.position,
            "SET #status = :running, attempts = if_not_exists(attempts, :zero) + :one, claim = :token, "
            "slot_holder = :holder, lease_until = :lease, started_at = if_not_exists(started_at, :now), "
            "#ttl = :ttl, model = :model, lane_index = :index",
            "attribute_not_exists(pk) OR #status = :queued",
            names={"#status": "status", "#ttl": "ttl"},
            running="running", queued="queued", zero=0, one=1, token=token, holder=holder,
            lease=now + self.settings.lease_seconds, now=int(now), ttl=meta["ttl"], model=message.model,
            index=message.index,
        )

    # ---- running ------------------------------------------------------------------------

    def _run(self, claimed: Claimed, deadline: float | None) -> Done | Parked | Claimed:
        message, meta = claimed.message, claimed.meta
        self._maybe_crash("after claim")
        _metric("RequestsRun")
        body = self._request_body(meta, message.position)
        outcome = upstream.call(self.settings, body, account_id=meta["account_id"],
                                request_ref=f"{message.batch_id}:{message.position}")
        self._maybe_crash("after upstream call")
        return self._settle(claimed, outcome, deadline)

    def _request_body(self, meta: dict, position: int) -> bytes:
        """The request's body as stored at create: JSON bytes, sent upstream without parsing."""
        starts = meta["chunk_starts"]
        number = bisect.bisect_right(starts, position) - 1
        return self.table.get_chunk(meta["id"], number).body(position - starts[number])

    # ---- waiting ------------------------------------------------------------------------

    def _wait_for_slot(self, message: RequestMessage, meta: dict, record: dict, now: float,
                       slots_key: dict | None, item: dict | None, capacity: int) -> Parked:
        """No slot: register as a waiter on the full slots item (to be woken when one frees) and park."""
        _metric("RequestsParked")
        sent = _waiting_since(message, record, now)
        if now - sent > self.settings.batch_dispatch_lease_seconds / 2:
            # Waiting long: tell the sweep this chain is alive, or it would send a duplicate.
            self._renew_dispatch_lease(message, meta, now + self.settings.batch_dispatch_lease_seconds)
        handle = record.get("receiptHandle")
        if slots_key is None or not handle:
            return Parked(random.uniform(*SLOT_WAIT_SECONDS))
        seconds = random.uniform(*WOKEN_WAIT_SECONDS)
        if item is None:
            item = self._read_slots([slots_key])[0]
        waiter = Waiter(id=_waiter_id(message, meta), batch_id=message.batch_id, model=message.model,
                        remaining=_remaining(meta), handle=handle, until=now + seconds + 5, since=min(sent, now))
        registered = self.leases.add_waiter(slots_key, item, waiter, now)
        if registered is None:
            return Parked(random.uniform(*SLOT_WAIT_SECONDS))
        # A slot freed between our read and the registration was released by a worker that saw no
        # waiter to wake: look once more, or this chain would sleep its whole park with a slot free.
        # Withdraw the registration first: a wake through this delivery's receipt handle, once the
        # message is received again, would make it visible while that delivery runs it.
        if len(registered.get("leases", {})) < capacity:
            self.leases.take_waiter(slots_key, waiter)
            return Parked(0)
        return Parked(seconds)

    def _park_long(self, message: RequestMessage, meta: dict, seconds: float) -> Parked:
        seconds = min(seconds, 12 * 3600 - 60)  # SQS caps a visibility change at 12 h: re-park later
        self._renew_dispatch_lease(message, meta, self.now() + seconds + self.settings.batch_dispatch_lease_seconds)
        return Parked(seconds)

    def _renew_dispatch_lease(self, message: RequestMessage, meta: dict, until: float) -> None:
        self.table.set_lane_lease(message.batch_id, message.model, _chain(message, meta), message.index, until)
        self.table.update_request(message.batch_id, message.position, "SET lease_until = :until",
                                  "#status = :queued", names={"#status": "status"}, until=until, queued="queued")

    def _read_slots(self, keys: list[dict]) -> list[dict | None]:
        found = batch_get({self.settings.accounts_table_name: {"Keys": keys, "ConsistentRead": True}})
        by_key = {(i["pk"], i["sk"]): i for i in found[self.settings.accounts_table_name]}
        return [by_key.get((k["pk"]["S"], k["sk"]["S"])) for k in keys]

    def _wake_waiters(self, message: RequestMessage, account_id: str, now: float,
                      known: list[dict | None] | None = None) -> None:
        """Slots were freed and not taken again: make the best waiting chain's message visible.

        `known` are the slots items as a yielding chain read them just before: the waiter it yields
        to is woken from them without another read (so a better waiter that registered since is
        passed over while that one is still listed). Any item that shows no waiter left to wake is
        then read afresh, since a chain may have registered between that read and the release."""
        keys = [model_slots_key(message.model), account_slots_key(account_id)]
        try:
            items = known if known is not None else self._read_slots(keys)
            unwoken = [slots_key for slots_key, item in zip(keys, items, strict=True)
                       if not self._wake_best(slots_key, item, now)]
            if known is not None and unwoken:
                for slots_key, item in zip(unwoken, self._read_slots(unwoken), strict=True):
                    self._wake_best(slots_key, item, now)
        except Exception:
            # Waking only saves a waiter the rest of its park; failing here must not keep the
            # caller from what follows (its chain's next message).
            logger.exception("could not wake waiters", extra={"batch_id": message.batch_id})

    def _wake_best(self, slots_key: dict, item: dict | None, now: float) -> bool:
        """Wake the best of the item's live waiters; False if it shows none, or others took them all."""
        for waiter in live_waiters(item, now):
            if self.leases.take_waiter(slots_key, waiter):
                self._make_visible(waiter)
                return True
        return False

    def _make_visible(self, waiter: Waiter) -> None:
        try:
            aws.sqs().change_message_visibility(QueueUrl=self.settings.model_queue_url(waiter.model),
                                                ReceiptHandle=waiter.handle, VisibilityTimeout=0)
            _metric("WaitersWoken")
        except (ClientError, KeyError):
            # Received again since (a new handle) or gone: it is running or will come back by itself.
            logger.info("waiter was no longer parked", extra={"batch_id": waiter.batch_id})

    # ---- settling -----------------------------------------------------------------------

    def _settle(self, claimed: Claimed, outcome: upstream.Outcome, deadline: float | None) -> Done | Parked | Claimed:
        message, meta, token = claimed.message, claimed.meta, claimed.token
        now = self.now()
        log = {"batch_id": message.batch_id, "position": message.position}
        self._adjust_backoff(claimed, outcome, now)
        state = self.table.get_request(message.batch_id, message.position) if outcome.kind == "retry" else None
        attempts = int(state.get("attempts", 1)) if state else 1
        if outcome.kind == "retry" and attempts < self.settings.batch_max_attempts:
            delay = self._backoff(attempts, outcome.retry_after)
            requeued = self._transact_settle(message, meta, token, claimed.holder, now, status="queued",
                                             error=outcome.error,
                                             lease_until=now + delay + self.settings.batch_dispatch_lease_seconds)
            if not requeued:
                return Done()
            _metric("RequestsRetried")
            logger.info("request will be retried", extra={**log, "attempt": attempts, "delay": round(delay, 2),
                                                          "code": outcome.error and outcome.error["code"]})
            self._wake_waiters(message, meta["account_id"], now)
            if claimed.has_record:
                return Parked(delay)
            # The record in hand is an earlier request's: this one needs a message of its own.
            dispatch.send(self.settings, [message], delay_seconds=min(900, round(delay)))
            return Done()

        settle: dict[str, Any]
        if outcome.kind == "completed":
            assert outcome.response is not None
            prompt, completion = upstream.usage_of(outcome.response["body"])
            cost = self.catalog.models[message.model].cost_nano(prompt, completion)
            # Stored once (compressed, or in S3), whether the hand-over or a plain settle writes it.
            stored = self.table.response_attributes(message.batch_id, message.position, token, outcome.response)
            settle = {"status": "completed", "stored": stored, "cost_nano": cost}
        else:
            _metric("RequestsFailed")
            settle = {"status": "failed", "error": outcome.error}
            if outcome.usage:  # the model served it, though its answer cannot be kept
                settle["cost_nano"] = self.catalog.models[message.model].cost_nano(*outcome.usage)

        following = self._following(message, meta)
        leave = Leave()
        if following is not None and deadline is not None and (
                deadline - time.monotonic() > self.settings.batch_upstream_timeout_seconds + HANDOVER_MARGIN_SECONDS):
            handed = self._hand_over(claimed, following, now, settle)
            if not isinstance(handed, Leave):
                return handed
            leave = handed
        if not self._transact_settle(message, meta, token, claimed.holder, now, **settle):
            return Done()
        self._maybe_crash("after settle")
        # Wake first: the freed slot is the waiter's, and its wait is what fairness is measured by.
        self._wake_waiters(message, meta["account_id"], now, leave.yielded_from)
        self._continue_chain(message, following, now, leave.delay_seconds)
        return Done()

    def _adjust_backoff(self, claimed: Claimed, outcome: upstream.Outcome, now: float) -> None:
        """Lower the model's batch cap on an overload answer, raise it back on success (AIMD, see
        model_backoff.py). Best effort: it only tunes how much runs at once."""
        model_name = claimed.message.model
        model = self.catalog.models.get(model_name)
        if model is None:
            return
        try:
            if outcome.kind == "retry" and (outcome.error or {}).get("code") in model_backoff.OVERLOAD_CODES:
                cap = model_backoff.lowered(claimed.capacity, claimed.backoff, now,
                                            self.settings.batch_backoff_cooldown_seconds)
                if cap is not None and accounts_table.set_model_cap(self.settings, model_name, cap, now,
                                                                    claimed.backoff):
                    _metric("ModelCapLowered")
                    logger.warning("model overloaded: batch cap lowered", extra={"model": model_name, "cap": cap})
            elif outcome.kind == "completed" and claimed.backoff is not None:
                cap = model_backoff.raised(model.batch_concurrency, claimed.backoff, now,
                                           self.settings.batch_recovery_seconds)
                if cap is None:
                    return
                if cap >= model.batch_concurrency:
                    accounts_table.end_model_backoff(self.settings, model_name, claimed.backoff)
                else:
                    accounts_table.set_model_cap(self.settings, model_name, cap, now, claimed.backoff)
        except ClientError:
            logger.exception("could not adjust the model's batch cap", extra={"model": model_name})

    def _following(self, message: RequestMessage, meta: dict) -> RequestMessage | None:
        """The chain's next request, or None at the chain's end."""
        width = meta["lane_widths"][message.model]
        positions = self.table.get_lane_positions(message.batch_id, message.model)
        index = message.index + width
        if index >= len(positions):
            return None
        return message.model_copy(update={"index": index, "position": positions[index], "waiting_since": None})

    def _hand_over(self, claimed: Claimed, following: RequestMessage, now: float,
                   settle: dict[str, Any]) -> Claimed | Done | Leave:
        """Settle this request and claim the chain's next one with the same slots, in one
        transaction. Answers the next claim, Done if this run lost its claim, or Leave when the
        chain must leave the invocation (and settle plainly)."""
        message, meta, token, holder = claimed.message, claimed.meta, claimed.token, claimed.holder
        cost = int(settle.get("cost_nano", 0))
        gates = self._read_gates(following, now)
        verdict = self._judge(following, gates, now, pending_cost=cost)
        if verdict.kind != "run" or gates.meta is None or verdict.owner is None:
            return Leave()  # the next request's own message will meet the gate and act on it
        fresh_meta = gates.meta
        slots = _slots_as_read(message, gates, verdict)
        # The slots are not written here: the chain keeps its hold, checked against this read (a
        # capacity that shrank since is seen at the next hand-over), and renewed only once less than
        # a run's lease of it is left. So a chain writes its slots items about once per
        # `lease_seconds`, not once per request: they are the hottest items of the table.
        renewals = []
        for slots_key, item, capacity in slots:
            leases = (item or {}).get("leases", {})
            if holder not in leases or len(leases) > capacity:
                return Leave()  # the capacity shrank (or our lease was reaped): release and queue up again
            if float(leases[holder]) - now < self.settings.lease_seconds:
                renewals.append(self.leases.renew_element(slots_key, holder, capacity,
                                                          now + self.settings.slot_lease_seconds))
        if self._should_yield(message.batch_id, holder, _remaining(fresh_meta) - 1, slots, now):
            _metric("SlotsYielded")
            return Leave(YIELD_DELAY_SECONDS, yielded_from=[item for _, item, _ in slots])

        next_token = uuid.uuid4().hex
        counter = "completed" if settle["status"] == "completed" else "failed"
        elements = [
            self._settle_request_element(message, token, now, **settle),
            self.table.meta_update_element(
                message.batch_id, f"ADD {counter} :one" + (", cost_nano :cost" if cost else ""),
                f"{lifecycle.STARTS_REQUESTS} AND expires_at > :now", names={"#status": "status"},
                one=1, validating="validating", in_progress="in_progress", now=int(now),
                **({"cost": cost} if cost else {})),
            self._lane_advance(message, meta, now),
            self._claim_request_element(following, fresh_meta, next_token, holder, now),
            *renewals,
        ]
        if cost:
            elements.append(accounts_table.add_usage_element(self.settings, meta["account_id"], cost,
                                                             clock.utc_day(now), int(now)))
        try:
            transact(elements)
        except TransactionFailed as failure:
            if failure.failed(0):
                logger.warning("hand-over lost its claim", extra={"batch_id": message.batch_id,
                                                                  "position": message.position})
                return Done()
            return Leave()  # the batch stopped, a slot changed or the next request was claimed: settle plainly
        _metric("RequestsHandedOver")
        return Claimed(following, fresh_meta, next_token, holder, has_record=False, capacity=verdict.capacity,
                       backoff=gates.backoff)

    def _should_yield(self, batch_id: str, holder: str, remaining: int,
                      slots: list[tuple[dict, dict | None, int]], now: float) -> bool:
        """Batches take turns: give this slot up when another batch waits for it and this batch
        holds more than its fair share (see fairness.py `fair_shares`)."""
        for _, item, capacity in slots:
            if not any(w.batch_id != batch_id for w in live_waiters(item, now)):
                continue
            share = fair_shares(item, capacity, batch_id, remaining, now).get(batch_id, 0)
            if not keeps_slot(item, holder, share):
                return True
        return False

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
        self._continue_chain(message, self._following(message, meta), now)
        return Done()

    def _settle_request_element(self, message: RequestMessage, token: str, now: float, *, status: str,
                                error: dict | None = None, stored: dict | None = None, cost_nano: int = 0,
                                lease_until: float | None = None) -> dict:
        """The request's own update when a run settles, conditional on the run's claim."""
        names = {"#status": "status"}
        named: dict[str, Any] = {"status": status, "token": token, "running": "running"}
        sets = ["#status = :status"]
        if error is not None:
            sets.append("#error = :error")
            names["#error"] = "error"
            named["error"] = error
        if stored is not None:  # the response's attributes (BatchTable.response_attributes)
            for attribute, value in stored.items():
                sets.append(f"{attribute} = :{attribute}")
                named[attribute] = value
        if status == "queued":
            sets.append("lease_until = :lease")
            named["lease"] = lease_until
            removes = "claim, slot_holder"
        else:
            sets.append("finished_at = :now")
            named["now"] = int(now)
            removes = "claim, slot_holder, lease_until"
        if cost_nano:
            sets.append("cost_nano = :cost")
            named["cost"] = cost_nano
        return self.table.request_update_element(
            message.batch_id, message.position, f"SET {', '.join(sets)} REMOVE {removes}",
            "#status = :running AND claim = :token", names=names, **named)

    def _transact_settle(self, message: RequestMessage, meta: dict, token: str, holder: str, now: float, *,
                         status: str, error: dict | None = None, stored: dict | None = None, cost_nano: int = 0,
                         lease_until: float | None = None) -> bool:
        """Settle and release both slots (a final state also moves the lane's chain on)."""
        elements = [self._settle_request_element(message, token, now, status=status, error=error,
                                                 stored=stored, cost_nano=cost_nano, lease_until=lease_until)]
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
        elements.append(self.leases.release_element(model_slots_key(message.model), holder))
        elements.append(self.leases.release_element(account_slots_key(meta["account_id"]), holder))
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
        return self.table.lane_update_element(message.batch_id, message.model, _chain(message, meta),
                                              message.index + meta["lane_widths"][message.model],
                                              now + self.settings.batch_dispatch_lease_seconds)

    def _continue_chain(self, message: RequestMessage, following: RequestMessage | None, now: float,
                        delay_seconds: int = 0) -> None:
        """Send the chain's next request; at the chain's end, see whether the batch is done."""
        if following is not None:
            dispatch.send(self.settings, [following], delay_seconds=delay_seconds)
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
