"""Putting request messages on the models' queues.

A batch is never pushed into SQS whole: each (batch, model) lane keeps `width` chains of
requests in flight (chain k runs the lane's requests k, k+width, k+2·width, ...). A chain moves
on when its request settles, in the same transaction that settles it, so a model's queue holds
about width messages per active lane and a small batch submitted behind a huge one gets an
equal share at once.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from freeinference_batch.core import clock
from freeinference_batch.core.catalog import Catalog
from freeinference_batch.core.observability import logger
from freeinference_batch.core.schemas import RequestMessage
from freeinference_batch.core.settings import Settings
from freeinference_batch.store import queues
from freeinference_batch.store.batch_table import BatchTable

# How many times a message SQS refuses is sent before the send fails.
SEND_ATTEMPTS = 5


@dataclass(frozen=True)
class Lanes:
    """A new batch's lanes, as its create (or its file's check) stores and starts them."""

    positions: dict[str, list[int]]  # each model's requests, by position
    widths: dict[str, int]  # each model's chains: its batch concurrency
    items: list[dict]  # the lanes' items (store/lanes.py)
    first_messages: list[RequestMessage]  # each chain's first request


def plan_lanes(table: BatchTable, catalog: Catalog, batch_id: str, models: list[str], *, account_id: str,
               key_hash: str, lease_until: float, ttl: int) -> Lanes:
    """`models`: each request's model, in input order."""
    positions: dict[str, list[int]] = {}
    for position, model in enumerate(models):
        positions.setdefault(model, []).append(position)
    widths, items, first_messages = {}, [], []
    for model, in_lane in positions.items():
        width = widths[model] = catalog.models[model].batch_concurrency
        items.extend(table.lane_items(batch_id, model, in_lane, width, lease_until, ttl))
        first_messages.extend(RequestMessage(batch_id=batch_id, model=model, index=i, position=in_lane[i],
                                             account_id=account_id, key_hash=key_hash)
                              for i in range(min(width, len(in_lane))))
    return Lanes(positions, widths, items, first_messages)


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


def start_chains(settings: Settings, table: BatchTable, batch_id: str, lanes: Lanes) -> None:
    """Send a new batch's first messages; if that fails, mark its chains due for the next sweep.

    The sweep re-sends a chain whose dispatch lease has run out; setting the leases to now makes
    that the next tick instead of BATCH_DISPATCH_LEASE_SECONDS later. Best effort: if this fails
    too, the leases set at create still run out and recover the batch."""
    try:
        send(settings, lanes.first_messages)
        return
    except Exception:
        logger.exception("dispatch failed after the batch was stored; its chains are left to the sweep",
                         extra={"batch_id": batch_id})
    now = clock.now(settings.clock_offset_file)
    try:
        for model, positions in lanes.positions.items():
            for slot in range(min(lanes.widths[model], len(positions))):
                table.set_lane_lease(batch_id, model, slot, slot, now)  # only if the chain has not moved
    except Exception:
        logger.exception("could not mark the chains due; their dispatch leases will recover them",
                         extra={"batch_id": batch_id})
