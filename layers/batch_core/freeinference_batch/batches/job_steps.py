"""The jobs function's side of a batch's background jobs (batches/jobs.py): each kind of job's
step, and one step run."""

from __future__ import annotations

from collections.abc import Callable

from freeinference_batch.batches import file_batches, jobs, output_files
from freeinference_batch.core.schemas import BatchJob
from freeinference_batch.core.settings import Settings

# A job's step: (settings, batch id, the monotonic deadline it must end by) -> whether the job is done.
Step = Callable[[Settings, str, float], bool]

STEPS: dict[str, Step] = {"validate": file_batches.validate, "write_files": output_files.write_files}


def run_step(settings: Settings, job: BatchJob, deadline: float) -> bool:
    """Run one step of `job`; when the job is not done, its next step is queued. Answers whether it is done."""
    done = STEPS[job.kind](settings, job.batch_id, deadline)
    if not done:
        jobs.send(settings, job)
    return done
