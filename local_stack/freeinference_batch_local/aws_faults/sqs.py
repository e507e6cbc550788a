"""SQS's faults (`sqs.duplicate`, `sqs.lost_answer`, `sqs.failed_entry`, `sqs.stale_receipt`) and
its errors as its JSON protocol carries them (with the `x-amzn-query-error` header of its
query-compatible errors). What each fault does: the package's docstring."""

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
_SQS_BATCH_CALLS = frozenset({"SendMessageBatch", "DeleteMessageBatch", "ChangeMessageVisibilityBatch"})
# A batch entry SQS could not apply on its side: `SenderFault` false, the caller may send it again.
_FAILED_ENTRY = {"SenderFault": False, "Code": "InternalError",
                 "Message": "The request processing has failed because of an unknown error, exception or failure."}


class SqsFaults:
    """SQS's calls, faulted by `schedule`; `forward` sends a request on to moto."""

    def __init__(self, schedule: FaultSchedule, forward: Callable[[dict[str, Any]], Answer]) -> None:
        self.schedule = schedule
        self.forward = forward

    def answer(self, operation: str, request: Request) -> Answer:
        """moto's answer to an SQS call, or the fault it meets."""
        if operation == "DeleteMessage" and self._stale_delete(request, request.document.get("ReceiptHandle")):
            answer = json_answer("200 OK", {})
        elif operation in _SQS_BATCH_CALLS:
            answer = self._batch(operation, request)
        else:
            answer = self.forward(request.fresh())
        if not answer.ok:
            return answer
        if operation == "ReceiveMessage" and self.schedule.config.rate("sqs.duplicate"):
            messages = answer.json().get("Messages") or []
            if messages:
                backend = moto_backend(sqs_backends, request.environ)
                for message in messages:
                    if self.schedule.hit("sqs.duplicate"):
                        self.schedule.counts["sqs.duplicate"] += 1
                        backend.change_message_visibility(_queue_name(request), message["ReceiptHandle"], 0)
        elif operation in _SQS_WRITES and self.schedule.hit("sqs.lost_answer"):
            self.schedule.counts["sqs.lost_answer"] += 1
            return _sqs_internal_error()
        return answer

    def _batch(self, operation: str, request: Request) -> Answer:
        """A batch call with some entries `Failed` (`sqs.failed_entry`: not applied) and, for
        DeleteMessageBatch, old receipt handles answered `Successful` without deleting
        (`sqs.stale_receipt`); the rest sent on to moto."""
        entries = list(request.document.get("Entries") or [])
        failed: list[dict[str, Any]] = []
        succeeded: list[dict[str, Any]] = []
        remaining: list[dict[str, Any]] = []
        for entry in entries:
            if self.schedule.hit("sqs.failed_entry"):
                self.schedule.counts["sqs.failed_entry"] += 1
                failed.append({"Id": entry.get("Id"), **_FAILED_ENTRY})
            elif operation == "DeleteMessageBatch" and self._stale_delete(request, entry.get("ReceiptHandle")):
                succeeded.append({"Id": entry.get("Id")})
            else:
                remaining.append(entry)
        if not failed and not succeeded:
            return self.forward(request.fresh())
        if not remaining:  # SQS refuses an empty batch: the whole answer is ours
            return json_answer("200 OK", {"Successful": succeeded, "Failed": failed})
        answer = self.forward(request.replaced({**request.document, "Entries": remaining}))
        if not answer.ok:
            return answer
        document = answer.json()
        document["Successful"] = [*(document.get("Successful") or []), *succeeded]
        document["Failed"] = [*(document.get("Failed") or []), *failed]
        return answer.with_json(document)

    def _stale_delete(self, request: Request, receipt_handle: Any) -> bool:
        """Whether a delete by `receipt_handle` is answered as done and deletes nothing: the handle
        is one of a message's earlier receives (it was received again since), and the fault hits."""
        if not self.schedule.config.rate("sqs.stale_receipt") or not isinstance(receipt_handle, str):
            return False
        backend = moto_backend(sqs_backends, request.environ)
        try:
            queue = backend.get_queue(_queue_name(request))
        except Exception:  # no such queue: moto answers the delete as it does
            return False
        for message in list(queue._messages):
            if message.receipt_handle != receipt_handle and message.had_receipt_handle(receipt_handle):
                if self.schedule.hit("sqs.stale_receipt"):
                    self.schedule.counts["sqs.stale_receipt"] += 1
                    return True
                return False
        return False


def _queue_name(request: Request) -> str:
    return str(request.document.get("QueueUrl", "")).rstrip("/").rsplit("/", 1)[-1]


def _sqs_internal_error() -> Answer:
    return json_answer(
        "500 Internal Server Error",
        {"__type": "com.amazonaws.sqs#InternalFailure",
         "message": "The request processing has failed because of an unknown error, exception or failure."},
        [("x-amzn-query-error", "InternalFailure;Receiver")],
    )
