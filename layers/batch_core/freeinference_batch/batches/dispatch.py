"""Putting request messages on the models' queues.

A batch is never pushed into SQS whole: each (batch, model) lane keeps `width` chains of
requests in flight (chain k runs the lane's requests k, k+width, k+2·width, ...). A chain moves
on when its request settles, in the same transaction that settles it, so a model's queue holds
about width messages per active lane and a small batch submitted behind a huge one gets an
equal share at once.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict

from freeinference_batch.core import aws
from freeinference_batch.core.schemas import RequestMessage
from freeinference_batch.core.settings import Settings


def send(settings: Settings, messages: list[RequestMessage], delay_seconds: int = 0) -> None:
    by_queue: dict[str, list[RequestMessage]] = defaultdict(list)
    for message in messages:
        by_queue[settings.model_queue_url(message.model)].append(message)
    for queue_url, queued in by_queue.items():
        for start in range(0, len(queued), 10):
            entries = [
                {"Id": str(n), "MessageBody": m.model_dump_json(), "DelaySeconds": delay_seconds}
                for n, m in enumerate(queued[start : start + 10])
            ]
            for attempt in range(5):
                answer = aws.sqs().send_message_batch(QueueUrl=queue_url, Entries=entries)
                failed = {f["Id"] for f in answer.get("Failed", [])}
                entries = [e for e in entries if e["Id"] in failed]
                if not entries:
                    break
                time.sleep(random.uniform(0, 0.05 * 2**attempt))
            else:
                raise RuntimeError(f"SQS refused {len(entries)} messages for {queue_url}")


def park(settings: Settings, model: str, receipt_handle: str, seconds: float) -> None:
    """Hide a received message for `seconds` (SQS caps one visibility change at 12 hours)."""
    aws.sqs().change_message_visibility(
        QueueUrl=settings.model_queue_url(model),
        ReceiptHandle=receipt_handle,
        VisibilityTimeout=max(0, min(round(seconds), 12 * 3600 - 1)),
    )
