"""The faults of EventBridge (`events.*`), Secrets Manager (`secretsmanager.*`) and CloudWatch
(`cloudwatch.*`): a throttle or a 500 before the call is applied, a write's answer lost after it
was (botocore sends it again), and PutEvents entries refused one by one (`events.failed_entry`,
`FailedEntryCount`). Their errors as each one's protocol carries them: EventBridge and Secrets
Manager JSON (`__type`), CloudWatch JSON or Smithy RPC v2 CBOR (as the request came) with the
`x-amzn-query-error` header of its query-compatible errors. What each fault does: the package's docstring."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from moto.core.cbor import CBOREncoder

from freeinference_batch_local.aws_faults.schedule import FaultSchedule
from freeinference_batch_local.aws_faults.wsgi import Answer, Request, json_answer, scope

_CBOR_OPERATION = "/operation/"


@dataclass(frozen=True)
class ServiceErrors:
    """One service's faults: its name in them, the SigV4 signing name or X-Amz-Target prefix it is
    known by, the calls a lost answer hits (writes), and its errors (code, query code)."""

    name: str
    writes: frozenset[str]
    throttling: tuple[str, str]
    internal: tuple[str, str]


EVENTS = ServiceErrors("events", frozenset({"PutEvents"}), ("ThrottlingException", ""), ("InternalException", ""))
SECRETS_MANAGER = ServiceErrors("secretsmanager", frozenset(), ("ThrottlingException", ""),
                                ("InternalServiceError", ""))
CLOUDWATCH = ServiceErrors("cloudwatch", frozenset({"PutMetricData"}), ("ThrottlingException", "Throttling;Sender"),
                           ("InternalServiceFault", "InternalServiceError;Receiver"))
# X-Amz-Target prefix (JSON protocols) or SigV4 signing name -> the service.
_BY_TARGET = {"AWSEvents": EVENTS, "secretsmanager": SECRETS_MANAGER, "GraniteServiceVersion20100801": CLOUDWATCH}
_BY_SIGNING_NAME = {"events": EVENTS, "secretsmanager": SECRETS_MANAGER, "monitoring": CLOUDWATCH}


def service_call(environ: Mapping[str, Any], body: bytes) -> tuple[ServiceErrors, str] | None:
    """(the service, the operation) of a call to one of these services, else None."""
    target = str(environ.get("HTTP_X_AMZ_TARGET") or "")
    if target:
        prefix, _, operation = target.partition(".")
        service = _BY_TARGET.get(prefix)
        return (service, operation) if service is not None else None
    service = _BY_SIGNING_NAME.get(scope(environ)[2])
    if service is None:
        return None
    path = str(environ.get("PATH_INFO") or "")
    if _CBOR_OPERATION in path:  # Smithy RPC v2: /service/<service>/operation/<operation>
        return service, path.rsplit(_CBOR_OPERATION, 1)[1]
    action = parse_qs(body.decode("utf-8", "replace")).get("Action") or [""]  # the query protocol
    return service, action[0]


class ServiceFaults:
    """The calls of the services above, faulted by `schedule`; `forward` sends a request on to moto."""

    def __init__(self, schedule: FaultSchedule, forward: Callable[[dict[str, Any]], Answer]) -> None:
        self.schedule = schedule
        self.forward = forward

    def answer(self, service: ServiceErrors, operation: str, request: Request) -> Answer:
        """moto's answer to the call, or the fault it meets."""
        if self._hit(f"{service.name}.throttle"):
            return _error(request, "400 Bad Request", *service.throttling, "Rate exceeded")
        if self._hit(f"{service.name}.error"):
            return _error(request, "500 Internal Server Error", *service.internal,
                          "The request processing has failed because of an unknown error.")
        if service is EVENTS and operation == "PutEvents":
            answer = self._put_events(request)
        else:
            answer = self.forward(request.fresh())
        if answer.ok and operation in service.writes and self._hit(f"{service.name}.lost_answer"):
            return _error(request, "500 Internal Server Error", *service.internal,
                          "The request processing has failed because of an unknown error.")
        return answer

    def _put_events(self, request: Request) -> Answer:
        """PutEvents with some entries refused (`events.failed_entry`): each in its place of
        `Entries` with an `ErrorCode`, counted in `FailedEntryCount`, the others put."""
        entries = list(request.document.get("Entries") or [])
        refused = [index for index in range(len(entries)) if self._hit("events.failed_entry")]
        if not refused:
            return self.forward(request.fresh())
        kept = [entry for index, entry in enumerate(entries) if index not in refused]
        put: list[dict[str, Any]] = []
        failed_count = len(refused)
        if kept:
            answer = self.forward(request.replaced({**request.document, "Entries": kept}))
            if not answer.ok:
                return answer
            document = answer.json()
            put = list(document.get("Entries") or [])
            failed_count += int(document.get("FailedEntryCount") or 0)
        results = iter(put)
        merged = [
            {"ErrorCode": "InternalFailure", "ErrorMessage": "Internal Failure"} if index in refused
            else next(results, {"EventId": str(uuid.uuid4())})
            for index in range(len(entries))
        ]
        return json_answer("200 OK", {"FailedEntryCount": failed_count, "Entries": merged})

    def _hit(self, name: str) -> bool:
        if not self.schedule.hit(name):
            return False
        self.schedule.counts[name] += 1
        return True


def _error(request: Request, status: str, code: str, query_code: str, message: str) -> Answer:
    """The error as the request's protocol carries it: JSON, or CBOR (Smithy RPC v2, which
    botocore may choose for CloudWatch)."""
    extra = [("x-amzn-query-error", query_code)] if query_code else []
    if not request.environ.get("HTTP_SMITHY_PROTOCOL"):
        return json_answer(status, {"__type": code, "message": message}, extra)
    body = CBOREncoder().encode({"__type": f"com.amazonaws.cloudwatch#{code}", "message": message})
    headers = [("Content-Type", "application/cbor"), ("smithy-protocol", "rpc-v2-cbor"),
               ("Content-Length", str(len(body))), ("x-amzn-RequestId", str(uuid.uuid4())), *extra]
    return Answer(status, headers, body)
