"""Running request messages: the gates, the claim, the upstream call, the settle, the hand-over.

One message starts one chain of a lane (requests k, k+W, k+2W, ... of it, see dispatch.py). In AWS
calls, a request's life is:

1. one BatchGetItem reads the batch, the owner's key, account and day's usage, the model's
   interactive load and both slot items (the gates, cheapest first);
2. a model slot and an account slot, one conditional write each (one more slot in the
   invocation's block of the batch's slots, see slot_blocks.py), then one transaction claims it:
   request queued→running (attempts+1), the chain taken at its head, the batch's running count;
3. the upstream call;
4. the hand-over: one write settles this request, now and then one transaction counts what the
   run settled (the batch's counters and cost, the day's usage, the chain's head moved on), one
   write claims the next request, and then step 1's gates are read for it (after the claim, so
   a cancel, expiry or failure written before the claim is seen, and the request handed back
   unstarted). The chain keeps its two slots without writing them (its block is renewed at most
   once per `lease_seconds`). The next request then runs in the same invocation.

A chain leaves the invocation (a settle and count that stops the chain, the slots given back,
and a message for its next request) when a gate says no, the invocation is near its timeout,
the request is to be retried, or a smaller batch waits for the slots (then the chain yields,
see settling.py).
Whoever gives a slot back wakes the best waiting chain at once.

The parts, one module each: `gates` (what a request must pass before every run), `claims`
(taking the request and the slots), `waiting` (waiting for a slot, and waking who waits),
`settling` (the settle and the hand-over), `chains` (a lane's chains), `overload` (the model's
cap under upstream overload); the writes themselves are `store/runs.py`'s and `store/leases.py`'s.

Every write of a request, and every count, is conditional on the request's claim token or the
chain's head, so duplicate deliveries, concurrent workers and a worker that dies between any two
steps never count anything twice: what a dead worker leaves behind, the sweep finds by its
expired lease. Slots are capacity, not counts: a block a dead invocation held expires.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import ValidationError

from freeinference_batch.batches import dispatch
from freeinference_batch.core import clock
from freeinference_batch.core.catalog import load_catalog
from freeinference_batch.core.observability import logger
from freeinference_batch.core.schemas import RequestMessage
from freeinference_batch.core.settings import Settings
from freeinference_batch.store.batch_record import BatchRecord
from freeinference_batch.store.batch_table import BatchTable
from freeinference_batch.store.runs import RunWrites
from freeinference_batch.worker import upstream
from freeinference_batch.worker.call_budget import Invocation, call_budget
from freeinference_batch.worker.chains import Chains, waiting_since
from freeinference_batch.worker.claims import Claims
from freeinference_batch.worker.faults import maybe_crash
from freeinference_batch.worker.gates import Gatekeeper, OwnerReads
from freeinference_batch.worker.memory import FUNCTION_MEMORY_MB, large_requests
from freeinference_batch.worker.outcomes import Claimed, Done, Parked, metric
from freeinference_batch.worker.settling import Settler
from freeinference_batch.worker.slot_blocks import BlockLeases, SlotBlocks
from freeinference_batch.worker.waiting import WaitingRoom

UNEXPECTED_ERROR_WAIT_SECONDS = 10.0
# A worker that cannot read the upstream credential runs nothing: its messages come back this soon.
CREDENTIAL_WAIT_SECONDS = 10.0
# A call the invocation leaves less than this for is not started: it runs in a fresh invocation.
LEAST_CALL_SECONDS = 1.0
FRESH_COPY_AFTER_RECEIVES = 500


@dataclass
class InvocationState:
    """What the Workers of one invocation's records share: its holds on slots, one block per batch
    (slot_blocks.py), and the owners' items its chains may reuse (gates.py)."""

    blocks: SlotBlocks
    owners: OwnerReads

    @classmethod
    def new(cls, settings: Settings, ends_at: float | None = None) -> InvocationState:
        """`ends_at`: when the invocation ends, by the service's clock (None: no deadline)."""
        return cls(SlotBlocks(settings, ends_at), OwnerReads())


class CredentialUnavailable(Exception):
    """The upstream credential could not be read (never read yet, after botocore's retries): the
    invocation's messages were parked unrun."""


def park_unrun(settings: Settings, records: list[dict], seconds: float = CREDENTIAL_WAIT_SECONDS) -> None:
    """Hide each record's message for `seconds`, nothing claimed: a worker that cannot run any of
    them (no upstream credential) fails its invocation, and without this its messages would come
    back after the queue's visibility timeout (90 minutes), or the sweep's dispatch lease (10),
    instead of in seconds. Best effort: a message whose park fails comes back by those."""
    for record in records:
        try:
            message = RequestMessage.model_validate_json(record["body"])
            dispatch.park(settings, message.model, record["receiptHandle"], seconds)
        except Exception:
            logger.warning("could not park a message", exc_info=True, extra={"message_id": record.get("messageId")})


class Worker:
    def __init__(self, settings: Settings, memory_mb: int = FUNCTION_MEMORY_MB,
                 invocation: InvocationState | None = None) -> None:
        """`memory_mb`: the function's memory (its Lambda context's), which sizes how many large
        requests it holds at once (worker/memory.py). `invocation`: what the invocation's Workers
        share; by default this Worker's own."""
        self.settings = settings
        self.large = large_requests(settings.batch_max_body_bytes, memory_mb)
        self.table = BatchTable(settings)
        self.leases = leases = BlockLeases(settings)
        catalog = load_catalog(settings.model_catalog_path)
        writes = RunWrites(settings, self.table)
        chains = Chains(settings, self.table)
        shared = invocation if invocation is not None else InvocationState.new(settings)
        self.gates = Gatekeeper(settings, self.table, catalog, shared.owners)
        self.waiting = WaitingRoom(settings, leases, chains)
        self.claims = Claims(settings, self.table, leases, shared.blocks, self.gates, self.waiting, chains, writes)
        self.settler = Settler(settings, self.table, leases, catalog, self.gates, self.waiting, chains, writes,
                               crash=self._maybe_crash)

    def now(self) -> float:
        return clock.now(self.settings.clock_offset_file)

    def _maybe_crash(self, step: str) -> None:
        maybe_crash(self.settings, step)

    def handle_record(self, record: dict, deadline: float | None = None,
                      invocation_seconds: float | None = None) -> Done | Parked:
        """One SQS record (the raw Lambda event record); Done means delete the message.

        `deadline` (time.monotonic()) is when the invocation times out; without one, each
        message runs its one request and the chain goes on by a new message.
        `invocation_seconds`: the invocation's whole length (the function's timeout), which sizes
        the most a call may run (call_budget.py); by default what is left now."""
        try:
            message = RequestMessage.model_validate_json(record["body"])
        except ValidationError:
            logger.error("dropping a message that is not a request message", extra={"message_id": record["messageId"]})
            return Done()
        try:
            outcome = self.process(message, record, deadline, invocation_seconds)
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
                since = waiting_since(message, record, self.now())
                dispatch.send(self.settings, [message.model_copy(update={"waiting_since": since})],
                              delay_seconds=round(outcome.seconds))
                return Done()
            dispatch.park(self.settings, message.model, record["receiptHandle"], outcome.seconds)
        return outcome

    def process(self, message: RequestMessage, record: dict, deadline: float | None = None,
                invocation_seconds: float | None = None) -> Done | Parked:
        """Run the message's request and, while the deadline allows, the rest of its chain."""
        invocation = None if deadline is None else Invocation(
            deadline, invocation_seconds if invocation_seconds is not None else deadline - time.monotonic())
        step = self.claims.claim(message, record, self.now())
        running: Claimed | None = None
        try:
            while isinstance(step, Claimed):
                running = step
                step = self._run(step, invocation)
        except Exception:
            if running is not None:
                # The run failed between its claim and its leave: its request stays running until
                # the sweep takes it back by its lease, and sends the chain's message, whose run
                # takes a slot of its own. This one's is free now (given back once: a run that
                # left already gave them).
                self.leases.give_held(running.message.model, running.meta.account_id, running.block, running.run)
            raise
        return step

    def _run(self, claimed: Claimed, invocation: Invocation | None) -> Done | Parked | Claimed:
        message, meta = claimed.message, claimed.meta
        self._maybe_crash("after claim")
        metric("RequestsRun")
        # The body and the response are dropped once settled: a large one holds its permit till then.
        with self.large.permit() as permit:
            body = self._request_body(meta, message.position, permit.hold)
            # Sized after the permit and the body: waiting for them took some of the invocation.
            budget = call_budget(self.settings, invocation, time.monotonic())
            if budget.cut and budget.seconds < LEAST_CALL_SECONDS:
                outcome = upstream.Outcome("cut")
            else:
                with self.settler.counting_during_call(claimed):
                    outcome = upstream.call(self.settings, body, account_id=meta.account_id,
                                            request_ref=f"{message.batch_id}:{message.position}",
                                            holding=permit.hold, budget=budget)
            if outcome.alert:
                metric(outcome.alert)
            self._maybe_crash("after upstream call")
            return self.settler.settle(claimed, outcome, invocation, self.now())

    def _request_body(self, meta: BatchRecord, position: int, holding: Callable[[int], None]) -> bytes:
        """The request's body as stored at create: JSON bytes, sent upstream without parsing.
        `holding` is told the size of its input chunk before it is read (a large request's chunk
        holds it alone: store/input_chunks.py), and of the body."""
        starts = meta.chunk_starts
        number = bisect.bisect_right(starts, position) - 1
        body = self.table.get_chunk(meta.id, number, holding).body(position - starts[number])
        holding(len(body))
        return body
