"""A batch's background jobs: work too long for an API call or a worker's request, run by the
batch jobs function from the batch jobs queue, one message a step.

This module sends jobs (the API, the worker and the schedules do); `job_steps.py` runs them
(the jobs function). A job is resumable: each step does what fits in its invocation, keeps its
progress in the batch's items, and answers whether the job is done. One that is not sends its next step as a
new message, so a job of any length is a chain of invocations, none near its timeout, and a
step that dies leaves its message to come back (SQS's visibility timeout) and start again from
the progress last kept. A step run twice (SQS delivers at least once) finds its work done.
"""

from __future__ import annotations

from freeinference_batch.core.schemas import BatchJob
from freeinference_batch.core.settings import Settings
from freeinference_batch.store import queues


def send(settings: Settings, job: BatchJob, delay_seconds: int = 0) -> None:
    """Queue a job's (next) step."""
    queues.send_messages(settings.batch_jobs_queue_url, [job.model_dump_json()], delay_seconds=delay_seconds,
                         attempts=3)

