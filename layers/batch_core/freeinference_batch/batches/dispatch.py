"""Putting request messages on the models' queues.

A batch is never pushed into SQS whole: each (batch, model) lane keeps `width` chains of
requests in flight (chain k runs the lane's requests k, k+width, k+2·width, ...). A chain moves
on when its request settles, in the same transaction that settles it, so a model's queue holds
about width messages per active lane and a small batch submitted behind a huge one gets an
equal share at once.
"""

from __future__ import annotations

from collections import defaultdict

from freeinference_batch.core.schemas import RequestMessage
from freeinference_batch.core.settings import Settings
from freeinference_batch.store import queues

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
