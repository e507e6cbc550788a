"""SQS's faults (`sqs.duplicate`, `sqs.lost_answer`) and its errors as its JSON protocol carries
them (with the `x-amzn-query-error` header of its query-compatible errors). What each fault
does: the package's docstring."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from moto.sqs.models import sqs_backends

from freeinference_batch_local.aws_faults.schedule import FaultSchedule
from freeinference_batch_local.aws_faults.wsgi import Answer, Request, json_answer, moto_backend

_SQS_WRITES = frozenset({
    "SendMessage", "SendMessageBatch", "DeleteMessage", "DeleteMessageBatch", "ChangeMessageVisibility",
    "ChangeMessageVisibilityBatch",
})


class SqsFaults:
    """SQS's calls, faulted by `schedule`; `forward` sends a request on to moto."""

    def __init__(self, schedule: FaultSchedule, forward: Callable[[dict[str, Any]], Answer]) -> None:
        self.schedule = schedule
        self.forward = forward

    def answer(self, operation: str, request: Request) -> Answer:
        """moto's answer to an SQS call, or the fault it meets."""
        answer = self.forward(request.fresh())
        if not answer.ok:
            return answer
        if operation == "ReceiveMessage" and self.schedule.config.rate("sqs.duplicate"):
            messages = answer.json().get("Messages") or []
            if messages:
                backend = moto_backend(sqs_backends, request.environ)
                queue_name = str(request.document.get("QueueUrl", "")).rstrip("/").rsplit("/", 1)[-1]
                for message in messages:
                    if self.schedule.hit("sqs.duplicate"):
                        self.schedule.counts["sqs.duplicate"] += 1
                        backend.change_message_visibility(queue_name, message["ReceiptHandle"], 0)
        elif operation in _SQS_WRITES and self.schedule.hit("sqs.lost_answer"):
            self.schedule.counts["sqs.lost_answer"] += 1
            return _sqs_internal_error()
        return answer


def _sqs_internal_error() -> Answer:
    return json_answer(
        "500 Internal Server Error",
        {"__type": "com.amazonaws.sqs#InternalFailure",
         "message": "The request processing has failed because of an unknown error, exception or failure."},
        [("x-amzn-query-error", "InternalFailure;Receiver")],
    )
