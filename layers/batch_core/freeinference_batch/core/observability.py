"""Logger, metrics and tracer shared by every function (Powertools).

Logs go to stderr: on Lambda both streams reach CloudWatch, and on the local stack stdout is
kept for the one line that tells the user where the stack is. Nothing here ever logs a key or a
request body: only ids.
"""

from __future__ import annotations

import sys
import warnings

from aws_lambda_powertools import Logger, Metrics, Tracer

logger = Logger(service="freeinference-batch", stream=sys.stderr)
metrics = Metrics(namespace="FreeInferenceBatch", service="freeinference-batch")
tracer = Tracer(service="freeinference-batch")

# Powertools warns at every flush of an invocation that added no metric: every schedule tick with
# nothing to report, every worker batch whose messages were all parked. Nothing is wrong then,
# and on Lambda the warning would fill the log groups as it fills the local stack's terminal.
warnings.filterwarnings("ignore", message="No application metrics to publish", category=UserWarning)


def log_status_change(message: str, batch_id: str, status: str, previous: str | None, **extra: object) -> None:
    """A batch's status changed (written by this invocation): `batch_status` and
    `previous_batch_status` (left out when the batch is created: Powertools drops None) are the fields that say so, what
    the local stack's terminal shows and a log query can filter on."""
    logger.info(message, extra={"batch_id": batch_id, "batch_status": str(status),
                                "previous_batch_status": str(previous) if previous is not None else None, **extra})

