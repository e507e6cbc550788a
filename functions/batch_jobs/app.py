"""Batch jobs function: one step of a batch's background job per SQS message (batches/jobs.py, job_steps.py)."""

import time

from aws_lambda_powertools.utilities.typing import LambdaContext
from freeinference_batch.batches import job_steps
from freeinference_batch.core.observability import logger, metrics, tracer
from freeinference_batch.core.schemas import BatchJob
from freeinference_batch.core.settings import get_settings

# A step stops taking on work this long before the function's timeout, to keep its progress and
# queue its next step.
STEP_MARGIN_SECONDS = 60.0


@metrics.log_metrics
@logger.inject_lambda_context(log_event=False)
@tracer.capture_lambda_handler(capture_response=False)
def lambda_handler(event: dict, context: LambdaContext) -> dict:
    # BatchSize 1 (template.yaml): one step, with the whole invocation. A step that fails is
    # reported, not raised, and its message hidden for a backoff (job_steps.retry_later).
    failures = []
    settings = get_settings()
    for record in event.get("Records", []):
        try:
            job = BatchJob.model_validate_json(record["body"])
            deadline = time.monotonic() + context.get_remaining_time_in_millis() / 1000 - STEP_MARGIN_SECONDS
            done = job_steps.run_step(settings, job, deadline)
            logger.info("batch job step", extra={"kind": job.kind, "batch_id": job.batch_id, "done": done})
        except Exception:
            logger.exception("batch job step failed", extra={"message_id": record["messageId"]})
            failures.append({"itemIdentifier": record["messageId"]})
            receives = int(record.get("attributes", {}).get("ApproximateReceiveCount", 1))
            job_steps.retry_later(settings, record["receiptHandle"], receives)
    return {"batchItemFailures": failures}
