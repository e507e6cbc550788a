"""Putting request messages on the models' queues.

A batch is never pushed into SQS whole: each (batch, model) lane keeps `width` chains of
requests in flight (chain k runs the lane's requests k, k+width, k+2·width, ...). A chain moves
on when its request settles, in the same transaction that settles it, so a model's queue holds
about width messages per active lane and a small batch submitted behind a huge one gets an
equal share at once.
"""

from __future__ import annotations

from collections import defaultdict

from freeinference_batch.core import clock
from freeinference_batch.core.observability import logger
from freeinference_batch.core.schemas import RequestMessage
from freeinference_batch.core.settings import Settings
from freeinference_batch.store import queues
from freeinference_batch.store.batch_table import BatchTable

# How many times a message SQS refuses is sent before the send fails.
SEND_ATTEMPTS = 5


def send(settings: Settings, messages: list[RequestMessage], delay_seconds: int = 0) -> None:
    """Put the messages on their models' queues."""
    by_queue: dict[str, list[str]] = defaultdict(list)
    for message in messages:
        by_queue[settings.model_queue_url(message.model)].append(message.model_dump_json())
    for queue_url, bodies in by_queue.items():
        queues.send_messages(queue_url, bodies, delay_seconds=delay_seconds, attempts=SEND_ATTEMPTS)


def park(settings: Settings, model: str, receipt_handle: str, seconds: float) -> None:
    """Hide a received message for `seconds` (SQS caps one visibility change at 12 hours)."""
    queues.change_visibility(settings.model_queue_url(model), receipt_handle,
                             max(0, min(round(seconds), 12 * 3600 - 1)))


def start_chains(settings: Settings, table: BatchTable, batch_id: str, messages: list[RequestMessage],
                 lane_widths: dict[str, int], lanes: dict[str, list[int]]) -> None:
    """Send a new batch's first messages; if that fails, mark its chains due for the next sweep.

    The sweep re-sends a chain whose dispatch lease has run out; setting the leases to now makes
    that the next tick instead of BATCH_DISPATCH_LEASE_SECONDS later. Best effort: if this fails
    too, the leases set at create still run out and recover the batch."""
    try:
        send(settings, messages)
        return
    except Exception:
        logger.exception("dispatch failed after the batch was stored; its chains are left to the sweep",
                         extra={"batch_id": batch_id})
    now = clock.now(settings.clock_offset_file)
    try:
        for model, positions in lanes.items():
            for slot in range(min(lane_widths[model], len(positions))):
                table.set_lane_lease(batch_id, model, slot, slot, now)  # only if the chain has not moved
    except Exception:
        logger.exception("could not mark the chains due; their dispatch leases will recover them",
                         extra={"batch_id": batch_id})
