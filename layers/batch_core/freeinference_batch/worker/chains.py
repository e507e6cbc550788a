"""A lane's chains (see dispatch.py): which chain a request belongs to, the chain's next
request, and moving the chain on when a request settles."""

from __future__ import annotations

from freeinference_batch.batches import dispatch, lifecycle
from freeinference_batch.core.schemas import RequestMessage
from freeinference_batch.core.settings import Settings
from freeinference_batch.store.batch_record import BatchRecord
from freeinference_batch.store.batch_table import BatchTable


def chain_of(message: RequestMessage, meta: BatchRecord) -> int:
    """Which of its lane's chains the message's request belongs to."""
    return message.index % meta.lane_widths[message.model]


def waiter_id(message: RequestMessage, meta: BatchRecord) -> str:
    """The chain's entry among a slots item's waiters: one per waiting chain."""
    return f"{message.batch_id}#{chain_of(message, meta)}"


def waiting_since(message: RequestMessage, record: dict, now: float) -> float:
    """When the message's chain began to wait: when it was sent, or when the message it is a
    fresh copy of was (a copy must not lose its place in the queue of waiting batches)."""
    if message.waiting_since is not None:
        return message.waiting_since
    return float(record.get("attributes", {}).get("SentTimestamp", now * 1000)) / 1000


def remaining(meta: BatchRecord) -> int:
    """The batch's requests not yet settled."""
    return meta.total - meta.completed - meta.failed


class Chains:
    def __init__(self, settings: Settings, table: BatchTable) -> None:
        self.settings = settings
        self.table = table

    def following(self, message: RequestMessage, meta: BatchRecord) -> RequestMessage | None:
        """The chain's next request, or None at the chain's end."""
        width = meta.lane_widths[message.model]
        positions = self.table.get_lane_positions(message.batch_id, message.model)
        index = message.index + width
        if index >= len(positions):
            return None
        return message.model_copy(update={"index": index, "position": positions[index], "waiting_since": None})

    def renew_dispatch_lease(self, message: RequestMessage, meta: BatchRecord, until: float) -> None:
        """Tell the sweep the chain standing at this request is alive (it waits), so it sends no duplicate."""
        self.table.set_lane_lease(message.batch_id, message.model, chain_of(message, meta), message.index, until)
        self.table.set_request_lease(message.batch_id, message.position, until)

    def continue_chain(self, message: RequestMessage, following: RequestMessage | None, now: float,
                       delay_seconds: int = 0) -> None:
        """Send the chain's next request; at the chain's end, see whether the batch is done."""
        if following is not None:
            dispatch.send(self.settings, [following], delay_seconds=delay_seconds)
            return
        fresh = self.table.get_meta(message.batch_id)
        if fresh is not None:
            lifecycle.try_finalize(self.settings, fresh, now)
