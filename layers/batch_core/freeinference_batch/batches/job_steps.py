"""The jobs function's side of a batch's background jobs (batches/jobs.py): each kind of job's
step, and one step run."""

from __future__ import annotations

from collections.abc import Callable

from freeinference_batch.batches import file_batches, jobs, output_files
from freeinference_batch.core.observability import logger
from freeinference_batch.core.schemas import BatchJob
from freeinference_batch.core.settings import SQS_MAX_VISIBILITY_SECONDS, Settings
from freeinference_batch.store import queues

# A job's step: (settings, batch id, the monotonic deadline it must end by) -> whether the job is done.
Step = Callable[[Settings, str, float], bool]

STEPS: dict[str, Step] = {"validate": file_batches.validate, "write_files": output_files.write_files}


def run_step(settings: Settings, job: BatchJob, deadline: float) -> bool:
    """Run one step of `job`; when the job is not done, its next step is queued. Answers whether it is done."""
    done = STEPS[job.kind](settings, job.batch_id, deadline)
    if not done:
        jobs.send(settings, job)
    return done


def retry_later(settings: Settings, receipt_handle: str, receive_count: int) -> int | None:
    """After a step that failed on its `receive_count`-th receive: its message hidden for the
    base delay doubled at each failure, so it runs again in a minute or so, not after the queue's
    visibility timeout. Answers the delay; None when the message could not be hidden (it then
    comes back after the queue's visibility timeout, as before)."""
    delay = min(settings.batch_jobs_retry_base_seconds * 2 ** max(0, receive_count - 1), SQS_MAX_VISIBILITY_SECONDS)
    try:
        queues.change_visibility(settings.batch_jobs_queue_url, receipt_handle, delay)
    except Exception:
        logger.exception("a failed batch job step's retry could not be scheduled: it comes back after the "
                         "queue's visibility timeout")
        return None
    logger.info("batch job step retried later", extra={"delay": delay, "receives": receive_count})
    return delay
