"""The service's SQS queues: the models' request queues and the webhook delivery queue (and its
dead-letter queue). Which queue a message goes to, and when, is the caller's."""

from __future__ import annotations

import random
import time

from freeinference_batch.core import aws

# SendMessageBatch takes at most 10 entries.
ENTRIES_PER_CALL = 10


def send_messages(queue_url: str, bodies: list[str], *, delay_seconds: int | None = None,
                  attempts: int = 1) -> None:
    """Send `bodies` to the queue, 10 a SendMessageBatch call; an entry SQS refuses is sent again
    (after a short, jittered pause), up to `attempts` tries in all. Raises when entries are still
    refused (those before them were sent)."""
    delay = {} if delay_seconds is None else {"DelaySeconds": delay_seconds}
    for start in range(0, len(bodies), ENTRIES_PER_CALL):
        entries = [{"Id": str(n), "MessageBody": body, **delay}
                   for n, body in enumerate(bodies[start : start + ENTRIES_PER_CALL])]
        refused: list[dict] = []
        for attempt in range(attempts):
            answer = aws.sqs().send_message_batch(QueueUrl=queue_url, Entries=entries)
            refused = answer.get("Failed", [])
            refused_ids = {failure["Id"] for failure in refused}
            entries = [entry for entry in entries if entry["Id"] in refused_ids]
            if not entries:
                break
            if attempt < attempts - 1:
                time.sleep(random.uniform(0, 0.05 * 2**attempt))
        else:
            raise RuntimeError(f"SQS refused {len(entries)} messages for {queue_url}: {refused}")


def send_message(queue_url: str, body: str) -> None:
    aws.sqs().send_message(QueueUrl=queue_url, MessageBody=body)


def change_visibility(queue_url: str, receipt_handle: str, seconds: int) -> None:
    """A received message hidden `seconds` from now (0: visible at once)."""
    aws.sqs().change_message_visibility(QueueUrl=queue_url, ReceiptHandle=receipt_handle, VisibilityTimeout=seconds)
