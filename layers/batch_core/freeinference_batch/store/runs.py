"""The writes of a request's run, as transaction elements: claim it, count it running, settle
it, count it settled. The worker composes them into its claim, hand-over and settle
transactions (`worker/`); only this module knows their expressions.

Every write of a run is conditional on the run's claim token (or, for a claim, on the request
being queued), so a duplicate delivery or a run that lost its claim never counts anything twice.
"""

from __future__ import annotations

from typing import Any

from freeinference_batch.schemas import RequestMessage
from freeinference_batch.store.batch_table import BatchTable

# The condition on a batch item for a request to start: the batch runs, and is not waiting to fail.
STARTS_REQUESTS = "#status IN (:validating, :in_progress) AND attribute_not_exists(failing)"


class RunWrites:
    def __init__(self, table: BatchTable) -> None:
        self.table = table

    def claim(self, message: RequestMessage, token: str, holder: str, now: float, lease_until: float,
              ttl: int) -> dict:
        """queued -> running (one more attempt) under `token`; it names the slots' holder, which the
        sweep releases should the run die."""
        return self.table.request_update_element(
            message.batch_id, message.position,
            "SET #status = :running, attempts = if_not_exists(attempts, :zero) + :one, claim = :token, "
            "slot_holder = :holder, lease_until = :lease, started_at = if_not_exists(started_at, :now), "
            "#ttl = :ttl, model = :model, lane_index = :index",
            "attribute_not_exists(pk) OR #status = :queued",
            names={"#status": "status", "#ttl": "ttl"},
            running="running", queued="queued", zero=0, one=1, token=token, holder=holder,
            lease=lease_until, now=int(now), ttl=ttl, model=message.model, index=message.index,
        )

    def count_started(self, batch_id: str, now: float) -> dict:
        """The batch runs one more request (and is in progress), if it still starts requests."""
        return self.table.meta_update_element(
            batch_id,
            "SET #status = :in_progress, in_progress_at = if_not_exists(in_progress_at, :now) ADD running :one",
            f"{STARTS_REQUESTS} AND expires_at > :now",
            names={"#status": "status"}, in_progress="in_progress", validating="validating", now=int(now), one=1,
        )

    def settle(self, message: RequestMessage, token: str, now: float, *, status: str, error: dict | None = None,
               stored: dict | None = None, cost_nano: int = 0, lease_until: float | None = None) -> dict:
        """The request's own update when its run ends: final (completed or failed), or queued again
        for a retry at `lease_until`; conditional on the run's claim."""
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

    def count_settled(self, batch_id: str, status: str, cost_nano: int = 0) -> dict:
        """The batch runs one request fewer: counted completed or failed unless it is queued again,
        and charged its cost."""
        counter = {"completed": "completed :one, ", "failed": "failed :one, "}.get(status, "")
        named: dict[str, Any] = {"minus_one": -1}
        if counter:
            named["one"] = 1
        if cost_nano:
            named["cost"] = cost_nano
        return self.table.meta_update_element(
            batch_id, f"ADD {counter}running :minus_one" + (", cost_nano :cost" if cost_nano else ""), **named)

    def count_handed_over(self, batch_id: str, status: str, cost_nano: int, now: float) -> dict:
        """A hand-over's count: one request settled (completed or failed) and the next one running in
        its place, so `running` stays; only while the batch still starts requests."""
        counter = "completed" if status == "completed" else "failed"
        return self.table.meta_update_element(
            batch_id, f"ADD {counter} :one" + (", cost_nano :cost" if cost_nano else ""),
            f"{STARTS_REQUESTS} AND expires_at > :now", names={"#status": "status"},
            one=1, validating="validating", in_progress="in_progress", now=int(now),
            **({"cost": cost_nano} if cost_nano else {}))

    def fail_unrun(self, message: RequestMessage, error: dict, now: float, ttl: int) -> list[dict]:
        """A request that can never run fails without a claim, and counts as failed."""
        return [
            self.table.request_update_element(
                message.batch_id, message.position,
                "SET #status = :failed, #error = :error, finished_at = :now, #ttl = :ttl",
                "attribute_not_exists(pk) OR #status = :queued",
                names={"#status": "status", "#error": "error", "#ttl": "ttl"},
                failed="failed", error=error, now=int(now), ttl=ttl, queued="queued"),
            self.table.meta_update_element(message.batch_id, "ADD failed :one", one=1),
        ]
