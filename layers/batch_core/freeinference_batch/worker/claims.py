"""Claiming a request: its gates, a slot of the model and of the account (one more slot in the
invocation's block of each, a conditional write each), and the claim transaction (request
queued -> running, the chain taken, the batch's running count)."""

from __future__ import annotations

import random
import uuid

from freeinference_batch.batches import lifecycle, validation
from freeinference_batch.core.observability import log_status_change, logger
from freeinference_batch.core.schemas import BatchStatus, RequestMessage, RequestStatus, WaitingReason
from freeinference_batch.core.settings import Settings
from freeinference_batch.store.batch_record import BatchRecord
from freeinference_batch.store.batch_table import BatchTable
from freeinference_batch.store.dynamo import TransactionFailed, transact
from freeinference_batch.store.leases import entry_expiry, slots_held
from freeinference_batch.store.runs import RunWrites, Tally
from freeinference_batch.worker import fairness
from freeinference_batch.worker.chains import Chains, chain_of, waiter_id, waiting_since
from freeinference_batch.worker.gates import Gatekeeper, slots_as_read
from freeinference_batch.worker.outcomes import Claimed, Done, Parked, metric
from freeinference_batch.worker.slot_blocks import BlockLeases, SlotBlock, SlotBlocks, new_run
from freeinference_batch.worker.waiting import WaitingRoom, waiting_for

# How long a chain waits when its owner's account has lost batch access, before it looks again.
ACCESS_WAIT_SECONDS = 60.0
# How long a message waits when another run has its chain (or a dead run's chain awaits the sweep).
CHAIN_BUSY_WAIT_SECONDS = (5.0, 10.0)


class Claims:
    def __init__(self, settings: Settings, table: BatchTable, leases: BlockLeases, blocks: SlotBlocks,
                 gates: Gatekeeper, waiting: WaitingRoom, chains: Chains, writes: RunWrites) -> None:
        self.settings = settings
        self.table = table
        self.leases = leases
        self.blocks = blocks
        self.gates = gates
        self.waiting = waiting
        self.chains = chains
        self.writes = writes

    def claim(self, message: RequestMessage, record: dict, now: float) -> Done | Parked | Claimed:
        gates = self.gates.read(message, now)
        verdict = self.gates.judge(message, gates, now)
        meta = gates.meta
        log = {"batch_id": message.batch_id, "position": message.position, "model": message.model}
        if verdict.kind == "gone":
            if meta is not None:
                lifecycle.try_finalize(self.settings, meta, now)
            return Done()
        assert meta is not None and verdict.owner is not None
        owner = verdict.owner
        if verdict.kind == "unauthorized":
            logger.info("owner no longer valid: failing the batch", extra={**log, "reason": owner.reason})
            lifecycle.fail_batch(self.settings, meta, now, "owner_unauthorized",
                                 f"The key or account that created the batch is no longer valid: {owner.reason}")
            return Done()
        if verdict.kind == "quota":
            assert owner.resume_at is not None
            why = waiting_for(WaitingReason.DAILY_QUOTA, now, resume_at=owner.resume_at)
            return self.waiting.park_long(message, meta, owner.resume_at + random.uniform(1, 30) - now, now, why)
        if verdict.kind == "no_access":
            why = waiting_for(WaitingReason.BATCH_ACCESS, now)
            return self.waiting.park_long(message, meta, ACCESS_WAIT_SECONDS, now, why)
        if verdict.kind == "no_model":
            gone = f"Model {validation.quote(message.model)} not found"
            return self._fail_unrun(message, meta, now, {"code": "model_not_found", "status": 404, "message": gone})
        if verdict.capacity <= 0:
            return self.waiting.wait_for_slot(message, meta, record, now, None, None, 0)

        slots = slots_as_read(message, gates, verdict)
        for slots_key, item, capacity in slots:
            if item is not None and "held" in item and slots_held(item) < capacity:
                continue
            # Full as read. Held by live leases, it is waited for: registering as a waiter answers
            # the item as it is then, so a slot freed since the read is seen there. Otherwise (never
            # used, or a dead invocation's block expired in it) reap first,
            # counting from reap's own read.
            leases = (item or {}).get("leases")
            live = item is not None and "held" in item and all(
                expiry > now for expiry in map(entry_expiry, (leases or {}).values()))
            if (live and record.get("receiptHandle")) or self.leases.reap(slots_key, now) >= capacity:
                return self.waiting.wait_for_slot(message, meta, record, now, slots_key, item, capacity)

        sent = waiting_since(message, record, now)
        run = new_run(message.batch_id, chain_of(message, meta), aged=fairness.waited_its_turn(now - sent))
        block = self.blocks.for_batch(message.batch_id)
        token = uuid.uuid4().hex
        waiting_as = waiter_id(message, meta)
        # The slots first, each one more in the invocation's block by a plain conditional write,
        # then the claim's transaction. The slots items are the table's hottest: in a transaction
        # DynamoDB would bill each of their writes twice, and transactions on them would conflict
        # with each other. An invocation that dies between the two leaves a block that no claim
        # names: it expires (slot_blocks.py) and whoever next finds the slots full reaps it.
        block.join(run)
        taken: list[dict] = []
        try:
            for slots_key, item, capacity in slots:
                stop_waiting = waiting_as if waiting_as in (item or {}).get("waiters", {}) else None
                if not self.leases.take(slots_key, block, capacity, now, stop_waiting=stop_waiting):
                    # Someone took the slot since the read.
                    self._give_back(message, meta, block, run, taken, now)
                    return self.waiting.wait_for_slot(message, meta, record, now, slots_key, None, capacity)
                taken.append(slots_key)
            transact([self.writes.claim(message, token, run, now + self.settings.lease_seconds, meta.ttl),
                      *self.writes.start_chain(message, meta, run, now)])
        except TransactionFailed as failure:
            self._give_back(message, meta, block, run, taken, now)
            if failure.failed(0):
                return self._duplicate(message, now)
            if failure.failed(1):
                return Parked(0)  # the batch changed (cancelled, expired...): look again
            if failure.failed(2):
                # Another run has the chain (this is a duplicate of its message, or it is between
                # two requests), or a run died with it and the sweep has yet to count its requests.
                logger.info("chain busy: waiting", extra=log)
                return Parked(random.uniform(*CHAIN_BUSY_WAIT_SECONDS))
            return Parked(0)  # conflicts outlasted the retries: nothing was claimed, look again
        except Exception:
            # An AWS error between the slots and the claim (the caller parks the message): give the
            # slots back now rather than leave them to expire. Should the claim have been written
            # after all, its request runs nowhere, and the sweep takes it back by its lease.
            self._give_back(message, meta, block, run, taken, now)
            raise
        if meta.status == BatchStatus.VALIDATING:
            # The claim moved it to in_progress (another chain's first claim may have too, at the
            # same moment: the transaction cannot say which was first).
            log_status_change("batch started", message.batch_id, BatchStatus.IN_PROGRESS, meta.status)
        metric("QueueWait", max(0.0, now - sent), "Seconds")
        tally = Tally(message.model, meta.lane_widths[message.model], head=message.index, since=now)
        return Claimed(message, meta, token, run, block, has_record=True, tally=tally, capacity=verdict.capacity,
                       backoff=gates.backoff, quota=verdict.quota)

    def _give_back(self, message: RequestMessage, meta: BatchRecord, block: SlotBlock, run: str,
                   taken: list[dict], now: float) -> None:
        """Give back the slots a claim took before it failed, and wake whoever waits for them (a
        chain may have found them full meanwhile)."""
        self.leases.give_all(taken, block, run)
        if taken:
            self.waiting.wake_waiters(message, meta.account_id, now)

    def _duplicate(self, message: RequestMessage, now: float) -> Done | Parked:
        """The claim found the request not queued. If it has settled, this message is spent: drop
        it. Otherwise this may be the very message that another delivery is running (or has just
        put back for a retry), made visible again by a wake that used the receipt handle of an
        earlier delivery: deleting it would lose the chain's token. Keep it: until the run's lease
        ends if the request runs, or to look again at once if it is queued again; whichever
        delivery of it then finds the request settled drops it."""
        state = self.table.get_request(message.batch_id, message.position) or {"status": RequestStatus.QUEUED}
        if state["status"] == RequestStatus.RUNNING:
            return Parked(max(1.0, float(state.get("lease_until", now)) - now + random.uniform(1, 5)))
        if state["status"] == RequestStatus.QUEUED:
            return Parked(0)
        return Done()

    def _fail_unrun(self, message: RequestMessage, meta: BatchRecord, now: float, error: dict) -> Done:
        """A request that can never run (its model left the catalog, or the owner's tier may no longer
        use it) fails without a claim."""
        try:
            transact(self.writes.fail_unrun(message, meta, error, now))
        except TransactionFailed:
            return Done()
        self.chains.continue_chain(message, self.chains.following(message, meta), now)
        return Done()
