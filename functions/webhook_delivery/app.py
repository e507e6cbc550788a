"""Webhook delivery function: an SQS batch of deliveries -> partial batch response.

The records are delivered concurrently, one thread each, so that an endpoint that hangs for its
whole deadline does not hold up the other records' endpoints; every attempt ends by its deadline,
within the invocation (webhooks/delivery.py). A record "fails" (stays on the
queue) when it waits for its next attempt: its visibility was already set to when.
"""

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from aws_lambda_powertools.utilities.batch import (
    AsyncBatchProcessor,
    EventType,
    async_process_partial_response,
)
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext
from freeinference_batch.core.observability import logger, metrics, tracer
from freeinference_batch.core.settings import get_settings
from freeinference_batch.webhooks import delivery


class DeliveryWaits(Exception):
    """Not an error: the delivery waits on the queue for its next attempt."""


# Leave this long before the function's timeout to answer which records are done.
ANSWER_MARGIN_SECONDS = 5.0


@metrics.log_metrics
@logger.inject_lambda_context(log_event=False)
@tracer.capture_lambda_handler(capture_response=False)
def lambda_handler(event: dict, context: LambdaContext) -> dict:
    processor = AsyncBatchProcessor(event_type=EventType.SQS, raise_on_entire_batch_failure=False)
    # Every attempt ends by the deadline it is given (webhooks/sender.py: connect, TLS and the
    # answer's head within one total, whatever a receiver trickles), and none is given more than
    # the invocation has left: so the executor's exit waits for threads that end on time, and no
    # attempt runs on into the next invocation. An attempt cut short backs off like any failed one.
    deadline = time.monotonic() + max(1.0, context.get_remaining_time_in_millis() / 1000 - ANSWER_MARGIN_SECONDS)
    with ThreadPoolExecutor(max_workers=max(1, len(event.get("Records", [])))) as executor:

        async def handle_record(record: SQSRecord) -> None:
            done = await asyncio.get_running_loop().run_in_executor(
                executor, lambda: delivery.handle_record(get_settings(), record.raw_event,
                                                         budget=deadline - time.monotonic()))
            if not done:
                raise DeliveryWaits(record.message_id)

        return async_process_partial_response(event=event, record_handler=handle_record, processor=processor,
                                              context=context)
