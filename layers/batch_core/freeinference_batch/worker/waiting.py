"""Waiting for a slot: a chain that finds the slots full registers as a waiter on the slots item
and parks its message; whoever frees a slot without taking it again wakes the best waiter's
message at once (who is best is fairness.py's policy; the item is store/leases.py's).

A chain that parks for something outside its batch (slots held by others, the quota, batch
access) while none of its batch runs tells the batch why: its `waiting` (issue 33). Off the hot
path: it is written only when the batch item the gates just read shows none of the batch running
and another reason or none (one conditional write per change, not per park), and cleared by the
write a request's start makes anyway (store/batch_status.py `start`)."""

from __future__ import annotations

import datetime as dt
import random

from botocore.exceptions import ClientError

from freeinference_batch.batches.validation import quote
from freeinference_batch.core.observability import logger
from freeinference_batch.core.schemas import RequestMessage, Waiting, WaitingReason
from freeinference_batch.core.settings import Settings
from freeinference_batch.store import batch_status, queues
from freeinference_batch.store.batch_record import BatchRecord
from freeinference_batch.store.leases import Leases, Waiter, account_slots_key, chain_slots_keys, slots_held
from freeinference_batch.worker.chains import Chains, remaining, waiter_id, waiting_since
from freeinference_batch.worker.fairness import held_by, live_waiters
from freeinference_batch.worker.outcomes import Parked, metric

# A slot wait re-checks after a short, jittered pause; a registered waiter is woken when a slot
# frees, so its park is only the fallback should the wake be lost.
SLOT_WAIT_SECONDS = (1.0, 3.0)
WOKEN_WAIT_SECONDS = (5.0, 10.0)
# SQS caps a visibility change at 12 h: a longer wait parks again when the message comes back.
LONGEST_PARK_SECONDS = 12 * 3600 - 60


def waiting_for(reason: WaitingReason, now: float, *, model: str = "", concurrency: int = 0,
                resume_at: float | None = None) -> Waiting:
    """A batch's `waiting`, in the words its owner reads (docs/USER_GUIDE.md, "Why a batch waits")."""
    if reason == WaitingReason.BATCH_ACCESS:
        message = ("The account may not run batches now (its tier has no batch access): its requests wait, "
                   "checked again every minute, and start once access returns.")
    elif reason == WaitingReason.CONCURRENCY:
        message = (f"All {concurrency} of the account's concurrent-request slots are in use by its other batches "
                   "or interactive requests: a request starts as soon as one is free.")
    elif reason == WaitingReason.MODEL_BUSY:
        message = (f"Model {quote(model)} is at its batch capacity, in use by other batches or held back by "
                   "interactive traffic: a request starts as soon as capacity frees.")
    else:
        at = dt.datetime.fromtimestamp(resume_at or now, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        message = f"The account's daily quota is used up: requests start again at 00:00 UTC ({at})."
    return Waiting(reason=reason, message=message, since=int(now))


class WaitingRoom:
    def __init__(self, settings: Settings, leases: Leases, chains: Chains) -> None:
        self.settings = settings
        self.leases = leases
        self.chains = chains

    def wait_for_slot(self, message: RequestMessage, meta: BatchRecord, record: dict, now: float,
                      slots_key: dict | None, item: dict | None, capacity: int) -> Parked:
        """No slot: register as a waiter on the full slots item (to be woken when one frees) and park.
        `slots_key` None: the model's capacity is 0 now (interactive load, backoff)."""
        metric("RequestsParked")
        if slots_key is not None and slots_key == account_slots_key(message.account_id):
            why = waiting_for(WaitingReason.CONCURRENCY, now, concurrency=capacity)
        else:
            why = waiting_for(WaitingReason.MODEL_BUSY, now, model=message.model)
        sent = waiting_since(message, record, now)
        if now - sent > self.settings.batch_dispatch_lease_seconds / 2:
            # Waiting long: tell the sweep this chain is alive, or it would send a duplicate.
            self.chains.renew_dispatch_lease(message, meta, now + self.settings.batch_dispatch_lease_seconds)
        handle = record.get("receiptHandle")
        if slots_key is None or not handle:
            self.tell(meta, why, item)
            return Parked(random.uniform(*SLOT_WAIT_SECONDS))
        seconds = random.uniform(*WOKEN_WAIT_SECONDS)
        if item is None:
            item = self.read_slots([slots_key])[0]
        waiter = Waiter(id=waiter_id(message, meta), batch_id=message.batch_id, model=message.model,
                        remaining=remaining(meta), handle=handle, until=now + seconds + 5, since=min(sent, now))
        registered = self.leases.add_waiter(slots_key, item, waiter, now)
        if registered is None:
            self.tell(meta, why, item)
            return Parked(random.uniform(*SLOT_WAIT_SECONDS))
        # A slot freed between our read and the registration was released by a worker that saw no
        # waiter to wake: look once more, or this chain would sleep its whole park with a slot free.
        # Withdraw the registration first: a wake through this delivery's receipt handle, once the
        # message is received again, would make it visible while that delivery runs it.
        if slots_held(registered) < capacity:
            self.leases.take_waiter(slots_key, waiter)
            return Parked(0)
        self.tell(meta, why, registered)
        return Parked(seconds)

    def park_long(self, message: RequestMessage, meta: BatchRecord, seconds: float, now: float,
                  why: Waiting) -> Parked:
        """Wait long (for the quota's renewal, or for batch access to come back), `why` told."""
        metric("RequestsParked")
        seconds = min(seconds, LONGEST_PARK_SECONDS)
        self.chains.renew_dispatch_lease(message, meta, now + seconds + self.settings.batch_dispatch_lease_seconds)
        self.tell(meta, why)
        return Parked(seconds)

    def tell(self, meta: BatchRecord, why: Waiting, slots: dict | None = None) -> None:
        """Set the batch's `waiting` if the gates' read of it (consistent, a moment ago) shows it is
        due: none of the batch running (a batch running a request is not waiting, whatever its other
        chains meet: its own full share is running) and not already waiting for this reason. So
        the chains parking again and again for one reason write nothing, and only the few that
        read the batch at the moment it changes race for the one conditional write.

        `slots`: the full slots item as last read. A slot of it held by this batch is its own
        share in use, even before the claim that counts it running has committed (slots are taken
        first, claims.py): running, not waiting."""
        if meta.running != 0 or (meta.waiting is not None and meta.waiting.reason == why.reason):
            return
        if held_by(slots, meta.id):
            return
        try:
            if batch_status.wait(self.settings, meta.id, why):
                logger.info("batch waiting", extra={"batch_id": meta.id, "reason": why.reason})
        except Exception:
            # Telling why is worth less than the park it explains: the next park tries again.
            logger.warning("could not set the batch's waiting", exc_info=True, extra={"batch_id": meta.id})

    def read_slots(self, keys: list[dict]) -> list[dict | None]:
        return self.leases.read_many(keys)

    def wake_waiters(self, message: RequestMessage, account_id: str, now: float,
                     known: list[dict | None] | None = None) -> None:
        """Slots were freed and not taken again: make the best waiting chain's message visible.

        `known` are the slots items as a yielding chain read them just before: the waiter it yields
        to is woken from them without another read (so a better waiter that registered since is
        passed over while that one is still listed). Any item that shows no waiter left to wake is
        then read afresh, since a chain may have registered between that read and the release."""
        keys = chain_slots_keys(message.model, account_id)
        try:
            items = known if known is not None else self.read_slots(keys)
            unwoken = [slots_key for slots_key, item in zip(keys, items, strict=True)
                       if not self._wake_best(slots_key, item, now)]
            if known is not None and unwoken:
                for slots_key, item in zip(unwoken, self.read_slots(unwoken), strict=True):
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
            queues.change_visibility(self.settings.model_queue_url(waiter.model), waiter.handle, 0)
            metric("WaitersWoken")
        except (ClientError, KeyError):
            # Received again since (a new handle) or gone: it is running or will come back by itself.
            logger.info("waiter was no longer parked", extra={"batch_id": waiter.batch_id})
