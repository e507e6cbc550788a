"""Worker function: an SQS batch of request messages -> partial batch response.

A record's request may be the first of a chain that runs on in the same invocation (see
freeinference_batch.worker). A record "fails" (stays on the queue) when it was parked: waiting for a slot, for its retry
backoff, or for the owner's quota to renew. Its visibility was already set to when it should
come back, so SQS, not this function, does the waiting.
"""

import asyncio
import math
import time
from concurrent.futures import ThreadPoolExecutor

from aws_lambda_powertools.utilities.batch import (
    AsyncBatchProcessor,
    EventType,
    async_process_partial_response,
)
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext
from freeinference_batch.core import clock
from freeinference_batch.core.observability import logger, metrics, tracer
from freeinference_batch.core.settings import get_settings
from freeinference_batch.worker import CredentialUnavailable, Done, InvocationState, Worker, park_unrun, upstream
from freeinference_batch.worker.memory import RECORD_THREADS
from freeinference_batch.worker.outcomes import publish_model_counts
from freeinference_batch.worker.slot_blocks import BlockLeases

# Cold start: an upstream URL that cannot work (Settings refuses it) stops the function here, where
# its Errors alarm shows it. The credential is read by each invocation instead (cached: one read
# per max age): a failed init would leave the event's messages hidden for the queue's visibility
# timeout, a failed invocation parks them for seconds first (the Errors alarm shows it the same).
get_settings()


class MessageParked(Exception):
    """Not an error: the message waits on the queue (its visibility is already set)."""


@metrics.log_metrics
@logger.inject_lambda_context(log_event=False)
@tracer.capture_lambda_handler(capture_response=False)
def lambda_handler(event: dict, context: LambdaContext) -> dict:
    # A processor per invocation: it holds the invocation's records, and the benchmarks' in-process
    # local stack runs several invocations at once in one process (Lambda never does in one container).
    # A batch whose every message was parked is normal (all waiting for slots): report, don't raise.
    processor = AsyncBatchProcessor(event_type=EventType.SQS, raise_on_entire_batch_failure=False)
    # Each record runs its request's chain while the invocation has time: leave room to answer.
    left = context.get_remaining_time_in_millis() / 1000
    deadline = time.monotonic() + left
    # The invocation's length is the function's timeout (a whole number of seconds), of which the
    # runtime's start took a few milliseconds: the most a call may run is sized from the timeout.
    invocation_seconds = float(math.ceil(left))
    settings = get_settings()
    try:  # before any claim: a request claimed without a credential would wait for its lease
        upstream.api_key(settings)
    except Exception as error:
        park_unrun(settings, event.get("Records", []))
        raise CredentialUnavailable("could not read the upstream credential; the messages come back shortly") from error
    # What its records' chains share: the holds on slots (a block per batch, which lasts no
    # longer than the invocation) and the owners' items they reuse.
    invocation = InvocationState.new(settings, ends_at=clock.now(settings.clock_offset_file) + left)
    with ThreadPoolExecutor(max_workers=max(1, min(RECORD_THREADS, len(event.get("Records", []))))) as executor:

        async def handle_record(record: SQSRecord) -> None:
            worker = Worker(settings, memory_mb=context.memory_limit_in_mb, invocation=invocation)
            outcome = await asyncio.get_running_loop().run_in_executor(
                executor, worker.handle_record, record.raw_event, deadline, invocation_seconds)
            if not isinstance(outcome, Done):
                raise MessageParked(record.message_id)

        try:
            answer = async_process_partial_response(event=event, record_handler=handle_record, processor=processor,
                                                    context=context)
        finally:
            publish_model_counts()
    # Every record's chain has returned (the executor waited for them): a slot whose give-back
    # failed goes back now, not at its block's expiry. Only after an answer: should the handler
    # fail, a chain may still run, and its block's entries expire as a killed invocation's do.
    BlockLeases(settings).give_back_leftovers(invocation.blocks)
    return answer
