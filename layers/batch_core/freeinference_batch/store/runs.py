"""The writes of a request's run, as transaction elements: claim it, settle it, and count what a
chain's run has settled. The worker composes them into its claim, hand-over and leave writes
(`worker/`); only this module knows their expressions.

Counting is batched by a watermark. A chain's run settles each request with one conditional
write of the request alone, and counts what it settled (the batch's counters and cost, the day's
usage) in one transaction that also moves the chain's head past those requests, conditional on
the head it started from: every `FLUSH_EVERY_REQUESTS` requests, once its oldest uncounted request
finished `COUNT_AGE_SECONDS` ago (checked before each call and by a timer while a call runs, so a
request is counted within COUNT_LAG_SECONDS of finishing, however long the calls), after every
request when its account is near its quota (worker/gates.py), and when the run gives the chain up.
So a request is counted exactly when its chain's head passes it: a
run that dies leaves settled requests beyond the head, which the sweep counts the same way
(schedules.py), and no request is ever counted twice whoever moves the head first.

A batch's `running` counts the chains a run has (the chain item's `runner`), not requests: it
goes up with a run's first claim and down when the run gives the chain up, both in the same
transaction as the chain's `runner`, so a batch whose `running` is 0 has every settled request
counted, and a final status never sees its counts change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from freeinference_batch.core import clock
from freeinference_batch.core.schemas import FINAL_STATUSES, RequestMessage, RequestStatus
from freeinference_batch.core.settings import Settings
from freeinference_batch.store import accounts_table, batch_status
from freeinference_batch.store.batch_keys import meta_key, request_key
from freeinference_batch.store.batch_record import BatchRecord
from freeinference_batch.store.batch_table import BatchTable
from freeinference_batch.store.dynamo import update_element

# The condition on a batch item for its counts to change: it is not final (values named by status).
NOT_FINAL = "NOT #status IN (:completed, :failed, :expired, :cancelled)"
# How many settled requests, or how long, a run keeps uncounted. A batch's counts, and the day's
# usage the quota reads, lag its settled requests by at most this much per running chain. A count
# is a transaction of three items (the chain, META, the day's usage: 6 write units), and a chain
# counts once more when it leaves whatever these say, so they set what counting costs: every 16
# requests is 0.375 write units a request on a long chain, every 24 is 0.25; at a 5 s upstream both
# bounds fall together (24 requests take 120 s), and a chain of up to 24 requests (1,500 on 64
# slots is 23 a chain) counts only when it leaves. Every 60 s was every 12 requests at 5 s, and
# every 20 s every 4 (1.5 write units a request).
FLUSH_EVERY_REQUESTS = 24
FLUSH_SECONDS = 120.0
# What README promises: a settled request is in its batch's counts and its day's usage this long
# after it finished, while its run lives (a dead run's, by the sweep: README). A run counts once its
# oldest uncounted request is COUNT_AGE_SECONDS old, which leaves the rest for the count's write.
# Measured from that request, not from the last count, it is the old FLUSH_SECONDS plus one call:
# at a 5 s upstream a chain of 23 requests still counts only when it leaves (bench/aws_calls.py).
COUNT_LAG_SECONDS = 120.0
COUNT_AGE_SECONDS = 115.0


@dataclass
class Tally:
    """What a chain's run has settled and not yet counted: `settled` requests from `head` (the
    chain item's head as last written) on, one lane width apart."""

    model: str
    width: int
    head: int
    since: float  # when the head was last written
    completed: int = 0
    failed: int = 0
    # Cost by the UTC day each request finished (its `finished_at`), the day its usage is charged
    # to however late it is counted: a tally may straddle 00:00 UTC.
    cost_by_day: dict[str, int] = field(default_factory=dict)
    oldest: float | None = None  # when its oldest request finished
    peak_nano: int = 0  # its dearest request's cost

    @property
    def cost_nano(self) -> int:
        return sum(self.cost_by_day.values())

    @property
    def chain(self) -> int:
        return self.head % self.width

    @property
    def settled(self) -> int:
        return self.completed + self.failed

    @property
    def next_head(self) -> int:
        return self.head + self.settled * self.width

    def add(self, status: str, cost_nano: int, finished_at: float) -> None:
        """One more settled request, which finished at `finished_at` (its item's, whole seconds)."""
        if status == RequestStatus.COMPLETED:
            self.completed += 1
        else:
            self.failed += 1
        if cost_nano:
            day = clock.utc_day(int(finished_at))
            self.cost_by_day[day] = self.cost_by_day.get(day, 0) + cost_nano
            self.peak_nano = max(self.peak_nano, cost_nano)
        self.oldest = finished_at if self.oldest is None else min(self.oldest, finished_at)

    def count_due_at(self) -> float | None:
        """When its oldest request is COUNT_AGE_SECONDS old: the count is due then at the latest."""
        return None if self.oldest is None else self.oldest + COUNT_AGE_SECONDS

    def due(self, now: float, dispatch_lease_seconds: float) -> bool:
        """Whether to count now. A count also renews the chain's dispatch lease, which must never
        run out under a live run (the sweep would take the run for dead): so a run counts at least
        every third of that lease, when it is shorter than FLUSH_SECONDS."""
        every = min(FLUSH_SECONDS, dispatch_lease_seconds / 3)
        age_due = self.count_due_at()
        return (self.settled >= FLUSH_EVERY_REQUESTS or now - self.since >= every
                or (age_due is not None and now >= age_due))

    def counted(self, now: float) -> Tally:
        """The tally once a flush has counted this one."""
        return Tally(self.model, self.width, self.next_head, now)


class RunWrites:
    def __init__(self, settings: Settings, table: BatchTable) -> None:
        self.settings = settings
        self.table = table

    def _request(self, batch_id: str, position: int, expression: str, condition: str, names: dict[str, str],
                 **named: Any) -> dict:
        return update_element(self.table.name, request_key(batch_id, position), expression, condition, names,
                              **named)

    def _meta(self, batch_id: str, expression: str, condition: str | None = None, names: dict[str, str] | None = None,
              **named: Any) -> dict:
        return update_element(self.table.name, meta_key(batch_id), expression, condition, names, **named)

    def claim(self, message: RequestMessage, token: str, holder: str, lease_until: float, ttl: int) -> dict:
        """queued -> running (one more attempt) under `token`; it names the slots' holder, which the
        sweep releases should the run die."""
        return self._request(
            message.batch_id, message.position,
            "SET #status = :running, claim = :token, slot_holder = :holder, lease_until = :lease, #ttl = :ttl "
            "ADD attempts :one",
            "(attribute_not_exists(pk) OR #status = :queued) AND (attribute_not_exists(fenced) OR fenced <> :holder)",
            names={"#status": "status", "#ttl": "ttl"},
            running=RequestStatus.RUNNING, queued=RequestStatus.QUEUED, one=1, token=token, holder=holder,
            lease=lease_until, ttl=ttl,
        )

    def start_chain(self, message: RequestMessage, meta: BatchRecord, holder: str, now: float) -> list[dict]:
        """A run takes the message's chain, at its head, and the batch counts one more running
        (and is in progress), if it still starts requests."""
        width = meta.lane_widths[message.model]
        return [
            batch_status.start(self.settings, message.batch_id, now),
            self.table.chain_start_element(message.batch_id, message.model, message.index % width, message.index,
                                           holder, now + self.settings.batch_dispatch_lease_seconds),
        ]

    def settle(self, message: RequestMessage, token: str, now: float, *, status: str, error: dict | None = None,
               stored: dict | None = None, cost_nano: int = 0, lease_until: float | None = None,
               give_back_attempt: bool = False) -> dict:
        """The request's own update when its run ends: final (completed or failed), or queued again
        for a retry at `lease_until`; conditional on the run's claim. `give_back_attempt`: the run
        does not count as an attempt (its claim added one)."""
        names = {"#status": "status"}
        named: dict[str, Any] = {"status": status, "token": token, "running": RequestStatus.RUNNING}
        sets = ["#status = :status"]
        if error is not None:
            sets.append("#error = :error")
            names["#error"] = "error"
            named["error"] = error
        if stored is not None:  # the response's attributes (BatchTable.response_attributes)
            for attribute, value in stored.items():
                sets.append(f"{attribute} = :{attribute}")
                named[attribute] = value
        if status == RequestStatus.QUEUED:
            sets.append("lease_until = :lease")
            named["lease"] = lease_until
            removes = "slot_holder"
        else:
            sets.append("finished_at = :now")
            named["now"] = int(now)
            removes = "slot_holder, lease_until"
        if cost_nano:
            sets.append("cost_nano = :cost")
            named["cost"] = cost_nano
        adds = ""
        if give_back_attempt:
            adds = " ADD attempts :minus_one"
            named["minus_one"] = -1
        # The claim stays, so that this very write, re-sent by botocore after its answer was lost,
        # finds its own earlier success (claim and status as it left them) and writes the same
        # again, instead of taking it for a lost claim. A later claim replaces the token, and the
        # sweep's take-back removes it: after either, a late re-send fails as it must.
        # An attempt given back is an ADD, which must apply once: that settle stays conditional
        # on the run (it is only ever written in a leave's transaction, whose re-send botocore
        # makes with the same ClientRequestToken).
        condition = ("#status = :running AND claim = :token" if give_back_attempt
                     else "claim = :token AND #status IN (:running, :status)")
        return self._request(message.batch_id, message.position, f"SET {', '.join(sets)} REMOVE {removes}{adds}",
                             condition, names, **named)

    def flush(self, batch_id: str, account_id: str, tally: Tally, runner: str | None, now: float,
              lease_until: float, *, stop: bool = False) -> list[dict]:
        """Count the tally's requests and move the chain's head past them, conditional on the head
        the tally starts from and on `runner` having the chain. `stop`: the run gives the chain up,
        and the batch counts one running fewer."""
        elements = [self.table.chain_move_element(batch_id, tally.model, tally.chain, tally.head, tally.next_head,
                                                  lease_until, runner=runner, stop=stop)]
        added = {name: value for name, value in (("completed", tally.completed), ("failed", tally.failed),
                                                 ("cost_nano", tally.cost_nano), ("running", -1 if stop else 0))
                 if value}
        if added:
            elements.append(self._meta(batch_id, "ADD " + ", ".join(f"{name} :{name}" for name in added), **added))
        # Each day's usage its own item: the day each request finished, not the day of the count.
        for day, cost in sorted(tally.cost_by_day.items()):
            if cost:
                elements.append(accounts_table.add_usage_element(self.settings, account_id, cost, day, int(now),
                                                                 peak_nano=tally.peak_nano))
        return elements

    def stop_chain(self, batch_id: str, model: str, chain: int, runner: str,
                   fence_position: int | None = None) -> list[dict]:
        """The sweep gives up the chain of a run that died: one running fewer. `fence_position`: the
        chain's next request, not claimed yet, which that run may then never claim (should it be
        alive after all, only stalled): the chain's message goes to a run of its own."""
        elements = [self.table.chain_stop_element(batch_id, model, chain, runner),
                    self._meta(batch_id, "ADD running :minus_one", minus_one=-1)]
        if fence_position is not None:
            elements.append(self._request(
                batch_id, fence_position, "SET fenced = :runner, #status = if_not_exists(#status, :queued)",
                "attribute_not_exists(#status) OR #status = :queued", {"#status": "status"},
                runner=runner, queued=RequestStatus.QUEUED))
        return elements

    def fail_request(self, batch_id: str, position: int, claim: str, error: dict, now: float) -> dict:
        """The sweep takes back a request whose every run died: running -> failed, with `error`,
        conditional on the dead run's claim (a late settle of that run then fails)."""
        return self._request(
            batch_id, position, "SET #status = :failed, #error = :error, finished_at = :now "
            "REMOVE claim, slot_holder, lease_until", "#status = :running AND claim = :claim",
            {"#status": "status", "#error": "error"}, failed=RequestStatus.FAILED, error=error,
            now=int(now), running=RequestStatus.RUNNING, claim=claim)

    def requeue_request(self, batch_id: str, position: int, claim: str) -> dict:
        """The sweep takes back a request whose run died: running -> queued, due at once,
        conditional on the dead run's claim (a late settle of that run then fails)."""
        return self._request(
            batch_id, position, "SET #status = :queued, lease_until = :zero REMOVE claim, slot_holder",
            "#status = :running AND claim = :claim", {"#status": "status"},
            queued=RequestStatus.QUEUED, running=RequestStatus.RUNNING, claim=claim, zero=0)

    def fail_unrun(self, message: RequestMessage, meta: BatchRecord, error: dict, now: float) -> list[dict]:
        """A request that can never run fails without a claim, counted at once (no run has its
        chain: it moves past it)."""
        width = meta.lane_widths[message.model]
        return [
            self._request(
                message.batch_id, message.position,
                "SET #status = :failed, #error = :error, finished_at = :now, #ttl = :ttl",
                "attribute_not_exists(pk) OR #status = :queued",
                {"#status": "status", "#error": "error", "#ttl": "ttl"},
                failed=RequestStatus.FAILED, error=error, now=int(now), ttl=meta.ttl,
                queued=RequestStatus.QUEUED),
            # Never once the batch is final (it may have become so since the caller's read): a
            # final batch's counts never change.
            self._meta(message.batch_id, "ADD failed :one", NOT_FINAL, {"#status": "status"}, one=1,
                       **{str(status): status for status in FINAL_STATUSES}),
            self.table.chain_move_element(message.batch_id, message.model, message.index % width, message.index,
                                          message.index + width, now + self.settings.batch_dispatch_lease_seconds),
        ]
