"""S3's faults (`s3.error`, `s3.lost_answer`) and its errors as its XML protocol carries them.
What each fault does: the package's docstring."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from freeinference_batch_local.aws_faults.schedule import FaultSchedule
from freeinference_batch_local.aws_faults.wsgi import Answer, Request

_S3_WRITE_METHODS = frozenset({"PUT", "POST", "DELETE"})


class S3Faults:
    """S3's calls, faulted by `schedule`; `forward` sends a request on to moto."""

    def __init__(self, schedule: FaultSchedule, forward: Callable[[dict[str, Any]], Answer]) -> None:
        self.schedule = schedule
        self.forward = forward

    def answer(self, request: Request) -> Answer:
        """moto's answer to an S3 call, or the fault it meets."""
        if self.schedule.hit("s3.error"):
            self.schedule.counts["s3.error"] += 1
            return _s3_internal_error()
        answer = self.forward(request.fresh())
        if (answer.ok and request.environ.get("REQUEST_METHOD") in _S3_WRITE_METHODS
                and self.schedule.hit("s3.lost_answer")):
            self.schedule.counts["s3.lost_answer"] += 1
            return _s3_internal_error()
        return answer


def _s3_internal_error() -> Answer:
    request_id = uuid.uuid4().hex[:16].upper()
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
        "<Message>We encountered an internal error. Please try again.</Message>"
        f"<RequestId>{request_id}</RequestId><HostId>{request_id}</HostId></Error>"
    ).encode()
    headers = [("Content-Type", "application/xml"), ("Content-Length", str(len(body))),
               ("x-amz-request-id", request_id)]
    return Answer("500 Internal Server Error", headers, body)
