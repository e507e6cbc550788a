"""Settling a run: its final state (or its retry), the batch's counters and cost, the day's
usage, the slots given back, and the chain moved on. When the invocation has time for another
request, the settle is a hand-over instead: the request settled alone, the chain's next request
claimed alone, and what the run settled counted now and then; the next request then runs in this
invocation under the same hold on the slots."""

from __future__ import annotations

import contextlib
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from freeinference_batch.batches import dispatch
from freeinference_batch.core import clock
from freeinference_batch.core.catalog import Catalog
from freeinference_batch.core.observability import logger
from freeinference_batch.core.schemas import RequestMessage, RequestStatus
from freeinference_batch.core.settings import Settings
from freeinference_batch.store.batch_table import BatchTable
from freeinference_batch.store.dynamo import TransactionConflict, TransactionFailed, apply_update, transact
from freeinference_batch.store.leases import slots_held
from freeinference_batch.store.runs import RunWrites
from freeinference_batch.worker import upstream
from freeinference_batch.worker.call_budget import Invocation, may_hand_over
from freeinference_batch.worker.chains import Chains, remaining
from freeinference_batch.worker.fairness import fair_shares, keeps_slot, live_waiters
from freeinference_batch.worker.gates import Gatekeeper, slots_as_read
from freeinference_batch.worker.outcomes import Claimed, Done, Leave, Parked, count_settled, metric
from freeinference_batch.worker.overload import adjust_model_cap
from freeinference_batch.worker.slot_blocks import BlockLeases, SlotBlock
from freeinference_batch.worker.waiting import WaitingRoom

# A chain that yields its slot sends its next message this late, so the woken chain comes first.
YIELD_DELAY_SECONDS = 1


class Settler:
    def __init__(self, settings: Settings, table: BatchTable, leases: BlockLeases, catalog: Catalog, gates: Gatekeeper,
                 waiting: WaitingRoom, chains: Chains, writes: RunWrites, crash: Callable[[str], None]) -> None:
        self.settings = settings
        self.table = table
        self.leases = leases
        self.catalog = catalog
        self.gates = gates
        self.waiting = waiting
        self.chains = chains
        self.writes = writes
        self.crash = crash

    def settle(self, claimed: Claimed, outcome: upstream.Outcome, invocation: Invocation | None,
               now: float) -> Done | Parked | Claimed:
        message, meta, token = claimed.message, claimed.meta, claimed.token
        log = {"batch_id": message.batch_id, "position": message.position}
        if outcome.kind == "cut":
            return self._run_again(claimed, now)
        adjust_model_cap(self.settings, self.catalog, claimed, outcome, now)
        state = self.table.get_request(message.batch_id, message.position) if outcome.kind == "retry" else None
        attempts = int(state.get("attempts", 1)) if state else 1
        if outcome.kind == "retry" and attempts < self.settings.batch_max_attempts:
            delay = self._retry_delay(attempts, outcome.retry_after)
            lease_until = now + delay + self.settings.batch_dispatch_lease_seconds
            settle = self.writes.settle(message, token, now, status=RequestStatus.QUEUED, error=outcome.error,
                                        lease_until=lease_until)
            if not self._leave(claimed, now, settle, lease_until):
                return Done()
            metric("RequestsRetried")
            logger.info("request will be retried", extra={**log, "attempt": attempts, "delay": round(delay, 2),
                                                          "code": outcome.error and outcome.error["code"]})
            self.waiting.wake_waiters(message, meta.account_id, now)
            if claimed.has_record:
                return Parked(delay)
            # The record in hand is an earlier request's: this one needs a message of its own.
            dispatch.send(self.settings, [message], delay_seconds=min(900, round(delay)))
            return Done()

        settled: dict[str, Any]
        if outcome.kind == "completed":
            assert outcome.response is not None
            prompt, completion = upstream.usage_of(outcome.response["body"])
            cost = self.catalog.models[message.model].cost_nano(prompt, completion)
            # Stored once (compressed, or in S3), whether the hand-over or a plain settle writes it.
            stored = self.table.response_attributes(message.batch_id, message.position, token, outcome.response)
            settled = {"status": RequestStatus.COMPLETED, "stored": stored, "cost_nano": cost}
        else:
            metric("RequestsFailed")
            error = upstream.after_last_attempt(outcome.error, attempts) if outcome.kind == "retry" else outcome.error
            settled = {"status": RequestStatus.FAILED, "error": error}
            if outcome.usage:  # the model served it, though its answer cannot be kept
                settled["cost_nano"] = self.catalog.models[message.model].cost_nano(*outcome.usage)

        following = self.chains.following(message, meta)
        leave = Leave()
        if following is not None and may_hand_over(self.settings, invocation, time.monotonic()):
            handed = self._hand_over(claimed, following, now, settled)
            if not isinstance(handed, Leave):
                return handed
            leave = handed
        settle = self.writes.settle(message, token, now, **settled)
        claimed.tally.add(settled["status"], int(settled.get("cost_nano", 0)), now)
        if not self._leave(claimed, now, settle, now + self.settings.batch_dispatch_lease_seconds):
            return Done()
        # The per-model counts follow the write that settled it: a run that lost its claim is
        # counted by the run (or sweep) that has it.
        count_settled(message.model, completed=settled["status"] == RequestStatus.COMPLETED)
        self.crash("after settle")
        # Wake first: the freed slot is the waiter's, and its wait is what fairness is measured by.
        self.waiting.wake_waiters(message, meta.account_id, now, leave.yielded_from)
        self.chains.continue_chain(message, following, now, leave.delay_seconds)
        return Done()

    def _run_again(self, claimed: Claimed, now: float) -> Done | Parked:
        """The call ran out of what the invocation had left (call_budget.py): not the upstream's
        fault, so the request goes back to queued without using an attempt (the claim's is given
        back) and without an error, and runs again at once in a fresh invocation, which gives it
        the most a call may run."""
        message, meta, token = claimed.message, claimed.meta, claimed.token
        lease_until = now + self.settings.batch_dispatch_lease_seconds
        settle = self.writes.settle(message, token, now, status=RequestStatus.QUEUED, lease_until=lease_until,
                                    give_back_attempt=True)
        if not self._leave(claimed, now, settle, lease_until):
            return Done()
        metric("RequestsCut")
        logger.info("a call cut by the invocation's end runs again in a fresh one",
                    extra={"batch_id": message.batch_id, "position": message.position})
        self.waiting.wake_waiters(message, meta.account_id, now)
        if claimed.has_record:
            return Parked(0)  # visible again at once: the next invocation that receives it is fresh
        dispatch.send(self.settings, [message])
        return Done()

    def _hand_over(self, claimed: Claimed, following: RequestMessage, now: float,
                   settled: dict[str, Any]) -> Claimed | Done | Leave:
        """Settle this request and claim the chain's next one, under the same hold on the slots and
        the same run of the chain: a write of each request alone, and now and then a flush of what
        the run settled (store/runs.py). Answers the next claim, Done when this run lost its claim
        or gave the chain up, or Leave when the chain must leave the invocation before settling
        (and settle plainly).

        The next request's gates are read after its claim is written, never before: the claim is a
        write of the request alone (conditioning it on the batch item would make it a transaction
        of four write units, conflicting with the counts' writes on that item), so a cancel, an
        expiry or a failure written before the claim is seen by the read after it, and the request
        is handed back unstarted (its attempt given back) before its call. One written after that
        read finds the request running, as one that started before it."""
        message, meta, token, run, block, tally = (claimed.message, claimed.meta, claimed.token, claimed.run,
                                                   claimed.block, claimed.tally)
        if block.lost:
            return Leave()  # its slots expired under it (slot_blocks.py): queue up again
        cost = int(settled.get("cost_nano", 0))
        # Near the quota (judged again with this request's cost, on the usage the last gates read),
        # the request is settled and counted in one transaction, before the next claim, so that
        # the others' reads see it: settled alone, a run that died before its count would leave
        # it uncounted while its slot went to another chain, which then ran on past the quota.
        exact = claimed.quota is not None and claimed.quota.near(tally.cost_nano + cost, max(tally.peak_nano, cost))
        settle = self.writes.settle(message, token, now, **settled)
        if exact:
            return self._settle_counted(claimed, following, now, settle, settled)
        if not apply_update(settle):
            logger.warning("hand-over lost its claim", extra={"batch_id": message.batch_id,
                                                              "position": message.position})
            return Done()  # the sweep took the request back, and counts what this run settled
        tally.add(settled["status"], cost, now)
        count_settled(message.model, completed=settled["status"] == RequestStatus.COMPLETED)
        self.crash("between a settle and the next claim")
        # Count before claiming the next request: a count that cannot be written then leaves
        # nothing claimed behind.
        if tally.due(now, self.settings.batch_dispatch_lease_seconds):
            try:
                transact(self.writes.flush(message.batch_id, meta.account_id, tally, run, now,
                                           now + self.settings.batch_dispatch_lease_seconds))
                tally = claimed.tally = tally.counted(now)
            except TransactionConflict:
                pass  # nothing was written: the tally waits for the next hand-over
            except TransactionFailed:
                # Only a sweep that took this run for dead moves the chain under it: it counts
                # what this run settled and sends the chain's next message.
                logger.error("hand-over lost its chain", extra={"batch_id": message.batch_id,
                                                                "position": message.position})
                return Done()
        return self._claim_following(claimed, following, now, exact=False)

    def _settle_counted(self, claimed: Claimed, following: RequestMessage, now: float, settle: dict,
                        settled: dict[str, Any]) -> Claimed | Done | Leave:
        """A hand-over near the quota: the request's settle and the count of everything the run
        settled in one transaction, then the next claim. A conflict leaves the chain (the leave
        settles and counts in its own transaction) rather than claim with a settle uncounted."""
        message, meta, tally = claimed.message, claimed.meta, claimed.tally
        tally.add(settled["status"], int(settled.get("cost_nano", 0)), now)
        lease_until = now + self.settings.batch_dispatch_lease_seconds
        try:
            transact([settle, *self.writes.flush(message.batch_id, meta.account_id, tally, claimed.run, now,
                                                 lease_until)])
        except TransactionConflict:
            return self._give_up(claimed, following, now, settle=settle)
        except TransactionFailed:
            # The run lost its claim or its chain to the sweep, which counts what this run settled.
            logger.warning("hand-over lost its claim", extra={"batch_id": message.batch_id,
                                                              "position": message.position})
            return Done()
        claimed.tally = tally.counted(now)
        count_settled(message.model, completed=settled["status"] == RequestStatus.COMPLETED)
        self.crash("between a settle and the next claim")
        return self._claim_following(claimed, following, now, exact=True)

    def _claim_following(self, claimed: Claimed, following: RequestMessage, now: float, *,
                         exact: bool) -> Claimed | Done:
        """Claim the chain's next request, read its gates and judge them, under the run's hold on
        the slots. `exact`: near the quota (the gates are read consistently, nothing reused)."""
        message, meta, run, block, tally = claimed.message, claimed.meta, claimed.run, claimed.block, claimed.tally
        next_token = uuid.uuid4().hex
        if not self._claim_next(following, next_token, run, now, meta.ttl):
            # Claimed by another run (the sweep took this one for dead and sent the chain's message
            # again, or fenced it off): give the chain up, counting what this run settled.
            self._leave(claimed, now, None, now + self.settings.batch_dispatch_lease_seconds)
            return Done()
        # Judged at the time of the read, not of the settle: a window that closed meanwhile counts.
        checked = clock.now(self.settings.clock_offset_file)
        # Near its quota, the account's usage is read consistently, nothing reused, and after this
        # run's count (above), so that of two chains counting at once the later read sees both.
        gates = self.gates.read(following, checked, reuse_owner=not exact)
        verdict = self.gates.judge(following, gates, checked, pending_cost=tally.cost_nano,
                                   run_peak_nano=tally.peak_nano)
        if verdict.near and gates.reused:
            gates = self.gates.read(following, checked)
            verdict = self.gates.judge(following, gates, checked, pending_cost=tally.cost_nano,
                                       run_peak_nano=tally.peak_nano)
        if verdict.kind != "run" or gates.meta is None or verdict.owner is None:
            # The next request's own message will meet the gate and act on it.
            return self._give_up(claimed, following, now, next_token=next_token)
        fresh_meta = gates.meta
        slots = slots_as_read(message, gates, verdict)
        # The slots are not written here: the chain keeps its slot in the invocation's block,
        # checked against this read (a capacity that shrank since is seen at the next hand-over),
        # and the block's entry is renewed only once less than a run's lease of it is left, by
        # whichever of its chains comes first (a deployed block lasts its whole invocation, and
        # is never renewed). So the slots items, the hottest of the table, are written when a
        # chain starts or leaves, not once per request.
        renewals = []
        for slots_key, item, capacity in slots:
            if slots_held(item) > capacity:
                # The capacity shrank: give the slot back and queue up again.
                return self._give_up(claimed, following, now, next_token=next_token)
            if block.renewal_due(slots_key, now, self.settings.lease_seconds):
                renewals.append((slots_key, capacity))
        if self._should_yield(message.batch_id, block, run, remaining(fresh_meta) - 1, slots, now):
            metric("SlotsYielded")
            return self._give_up(claimed, following, now, Leave(YIELD_DELAY_SECONDS, [item for _, item, _ in slots]),
                                 next_token)
        # Renewals are plain writes, as the slots are taken (claims.py), not part of the count.
        if not all(self.leases.renew(slots_key, block, capacity, now, self.settings.lease_seconds)
                   for slots_key, capacity in renewals):
            # A block's renewal failed (the capacity shrank below what is held since the read, or
            # the block was reaped): give the chain up, its next request by a message.
            return self._give_up(claimed, following, now, next_token=next_token)
        metric("RequestsHandedOver")
        return Claimed(following, fresh_meta, next_token, run, block, has_record=False, tally=tally,
                       capacity=verdict.capacity, backoff=gates.backoff, quota=verdict.quota)

    @contextlib.contextmanager
    def counting_during_call(self, claimed: Claimed) -> Iterator[None]:
        """While the run's call is in flight, count what it settled once the oldest of it is
        COUNT_AGE_SECONDS old (store/runs.py), so that a long call does not hold its counts back.
        The timer is stopped, and a count it started finished, before the run settles: the tally
        is never written by both."""
        due = claimed.tally.count_due_at()
        if due is None:
            yield
            return
        timer = threading.Timer(max(0.0, due - clock.now(self.settings.clock_offset_file)), self._count_now,
                                args=(claimed,))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
            timer.join()

    def _count_now(self, claimed: Claimed) -> None:
        """The count the timer makes (its thread): as a hand-over's, conditional on the chain's head."""
        now = clock.now(self.settings.clock_offset_file)
        tally = claimed.tally
        try:
            transact(self.writes.flush(claimed.message.batch_id, claimed.meta.account_id, tally, claimed.run, now,
                                       now + self.settings.batch_dispatch_lease_seconds))
            claimed.tally = tally.counted(now)
        except Exception:
            # Nothing was written: the settle counts it (or the sweep, if the chain was lost).
            logger.warning("could not count during a call", exc_info=True,
                           extra={"batch_id": claimed.message.batch_id, "position": claimed.message.position})

    def _give_up(self, claimed: Claimed, following: RequestMessage, now: float, leave: Leave | None = None,
                 next_token: str | None = None, settle: dict | None = None) -> Done:
        """Leave the chain between two requests: count, free the chain and the slots, wake waiters,
        and send the next request's message (`leave.delay_seconds` late), which meets the gates
        afresh. `next_token`: the next request's claim, written but not started: in the leave's
        transaction it goes back to queued with its attempt given back (it never ran). `settle`:
        the request's own settle, not yet written (its tally has it), written in that transaction."""
        leave = leave or Leave()
        lease_until = now + self.settings.batch_dispatch_lease_seconds
        unclaim = settle if next_token is None else self.writes.settle(
            following, next_token, now, status=RequestStatus.QUEUED, lease_until=lease_until, give_back_attempt=True)
        if self._leave(claimed, now, unclaim, lease_until):
            # Wake first: the freed slot is the waiter's, and its wait is what fairness is measured by.
            self.waiting.wake_waiters(claimed.message, claimed.meta.account_id, now, leave.yielded_from)
            self.chains.continue_chain(claimed.message, following, now, leave.delay_seconds)
        return Done()

    def _claim_next(self, following: RequestMessage, token: str, run: str, now: float, ttl: int) -> bool:
        """Claim the chain's next request alone. A claim whose answer was lost and which botocore
        sent again fails its condition the second time: it is ours if it holds our token."""
        if apply_update(self.writes.claim(following, token, run, now + self.settings.lease_seconds, ttl)):
            return True
        state = self.table.get_request(following.batch_id, following.position) or {}
        return state.get("claim") == token

    def _should_yield(self, batch_id: str, block: SlotBlock, run: str, remaining: int,
                      slots: list[tuple[dict, dict | None, int]], now: float) -> bool:
        """Batches take turns: give this slot up when another batch waits for it and this batch
        holds more than its fair share (see fairness.py `fair_shares`)."""
        for _, item, capacity in slots:
            if not any(w.batch_id != batch_id for w in live_waiters(item, now)):
                continue
            share = fair_shares(item, capacity, batch_id, remaining, now).get(batch_id, 0)
            if not keeps_slot(item, block.holder, block.rank(run), share):
                return True
        return False

    def _leave(self, claimed: Claimed, now: float, settle: dict | None, lease_until: float) -> bool:
        """The run gives its chain up: in one transaction the request's settle (if any), the count
        of everything the run settled and the chain's head moved past it (to the first request not
        settled, which the retry or the chain's next message starts from), and one running fewer;
        then both slots given back. False when the run had lost its claim (or its chain): then the
        sweep, which took them back, counts for it.

        The slots are given back by plain writes, not in the transaction, for the reason they are
        taken that way (claims.py): an invocation that dies between the two leaves its block to
        expire."""
        message, meta, run = claimed.message, claimed.meta, claimed.run
        elements = [*([settle] if settle else []),
                    *self.writes.flush(message.batch_id, meta.account_id, claimed.tally, run, now, lease_until,
                                       stop=True)]
        try:
            transact(elements)
            counted = True
        except TransactionFailed:
            logger.warning("settle lost its claim", extra={"batch_id": message.batch_id, "position": message.position})
            counted = False
        self.leases.give_held(message.model, meta.account_id, claimed.block, run)
        if not counted:
            # The callers wake waiters only after a leave that counted: these slots are free too.
            self.waiting.wake_waiters(message, meta.account_id, now)
        return counted

    def _retry_delay(self, attempts: int, retry_after: float | None) -> float:
        """Exponential backoff with jitter; an upstream Retry-After is a floor."""
        base = self.settings.batch_retry_base_seconds * 2 ** (attempts - 1)
        delay = min(self.settings.batch_retry_max_seconds, base) * random.uniform(0.5, 1.0)
        if retry_after:
            delay = max(delay, min(retry_after, self.settings.batch_retry_max_seconds))
        return delay
