"""DynamoDB's faults (`dynamodb.throttle`, `dynamodb.error`, `dynamodb.lost_answer`,
`dynamodb.conflict`, and the reads `dynamodb.stale_ms` sends to the lagging replicas), its
`ClientRequestToken` idempotency while any fault is on, and its errors as its JSON protocol
carries them. What each fault does: the package's docstring."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from typing import Any

from moto.dynamodb.models import dynamodb_backends

from freeinference_batch_local.aws_faults.config import STALE_MS
from freeinference_batch_local.aws_faults.replicas import REPLICA_SUFFIX, LaggingReplicas
from freeinference_batch_local.aws_faults.schedule import FaultSchedule
from freeinference_batch_local.aws_faults.wsgi import Answer, Request, json_answer, moto_backend

TOKEN_IDEMPOTENCY_SECONDS = 600.0  # DynamoDB keeps a ClientRequestToken this long

_DYNAMODB_ITEM_CALLS = frozenset({
    "GetItem", "PutItem", "UpdateItem", "DeleteItem", "Query", "Scan", "BatchGetItem", "BatchWriteItem",
    "TransactGetItems", "TransactWriteItems",
})
_DYNAMODB_WRITES = frozenset({"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"})
_DYNAMODB_CONFLICTING = frozenset({"PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems"})
_DYNAMODB_EVENTUAL_READS = frozenset({"GetItem", "Query", "Scan", "BatchGetItem"})
_DYNAMODB_ERROR_PREFIX = "com.amazonaws.dynamodb.v20120810#"


class DynamoDBFaults:
    """DynamoDB's calls, faulted by `schedule`; `forward` sends a request on to moto."""

    def __init__(self, schedule: FaultSchedule, forward: Callable[[dict[str, Any]], Answer],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.schedule = schedule
        self.forward = forward
        self.clock = clock
        # ClientRequestToken -> (the request's fingerprint, expiry, answer), oldest first
        self._tokens: dict[str, tuple[str, float, Answer]] = {}
        lag_ms = schedule.config.rate(STALE_MS)
        self.replicas = LaggingReplicas(lag_ms / 1000.0, schedule.draw(STALE_MS), clock) if lag_ms else None

    def answer(self, operation: str, request: Request) -> Answer:
        """moto's answer to a DynamoDB call, or the fault it meets."""
        faultable = request.marked and operation in _DYNAMODB_ITEM_CALLS
        unprocessed: dict[str, list[Any]] = {}
        if faultable and self.schedule.hit("dynamodb.throttle"):
            self.schedule.counts["dynamodb.throttle"] += 1
            if operation not in ("BatchGetItem", "BatchWriteItem"):
                return self._throttled()
            unprocessed = self._leave_unprocessed(operation, request)
            if not any(request.document["RequestItems"].values()):
                return _dynamodb_error("400 Bad Request", "ProvisionedThroughputExceededException",
                                       "The level of configured provisioned throughput for the table was exceeded. "
                                       "Consider increasing your provisioning level with the UpdateTable API.")
            request.document["RequestItems"] = {
                table: keys for table, keys in request.document["RequestItems"].items() if keys
            }
            request.modified = True
        if faultable and self.schedule.hit("dynamodb.error"):
            self.schedule.counts["dynamodb.error"] += 1
            return _dynamodb_internal_error()

        if operation == "TransactWriteItems":
            replay = self._token_replay(request)
            if replay is not None:
                return replay
        if faultable and operation in _DYNAMODB_CONFLICTING and self.schedule.hit("dynamodb.conflict"):
            self.schedule.counts["dynamodb.conflict"] += 1
            return self._conflict(operation, request)

        written: list[tuple[str, dict[str, Any]]] = []
        if self.replicas is not None and operation in _DYNAMODB_WRITES:
            written = self.replicas.before_write(_backend(request), operation, request.document)
        answer = self._call(operation, request, unprocessed)
        if answer.ok and operation in _DYNAMODB_WRITES:
            if self.replicas is not None:
                self.replicas.after_write(_backend(request), written)
            if operation == "TransactWriteItems":
                self._remember_token(request, answer)
        elif answer.ok and operation == "DeleteTable" and self.replicas is not None:
            self.replicas.drop(_backend(request), request.document.get("TableName", ""))
        if answer.ok and operation == "ListTables" and self.replicas is not None:
            document = answer.json()
            document["TableNames"] = [n for n in document.get("TableNames", []) if not n.endswith(REPLICA_SUFFIX)]
            answer = answer.with_json(document)
        if faultable and answer.ok and operation in _DYNAMODB_WRITES and self.schedule.hit("dynamodb.lost_answer"):
            self.schedule.counts["dynamodb.lost_answer"] += 1
            return _dynamodb_internal_error()
        return answer

    def _call(self, operation: str, request: Request, unprocessed: dict[str, list[Any]]) -> Answer:
        if self.replicas is not None and request.marked and operation in _DYNAMODB_EVENTUAL_READS:
            answer, stale = self.replicas.read(_backend(request), operation, request, self.forward)
            if stale:
                self.schedule.counts[STALE_MS] += 1
        else:
            answer = self.forward(request.current())
        if unprocessed and answer.ok:
            key = "UnprocessedKeys" if operation == "BatchGetItem" else "UnprocessedItems"
            document = answer.json()
            merged = document.get(key) or {}
            for table, entries in unprocessed.items():
                if operation == "BatchGetItem":
                    spec = merged.setdefault(table, {**entries[0], "Keys": []})
                    spec["Keys"].extend(entries[1])
                else:
                    merged.setdefault(table, []).extend(entries)
            document[key] = merged
            answer = answer.with_json(document)
        return answer

    def _throttled(self) -> Answer:
        # DynamoDB answers either, by table mode and cause; botocore retries both.
        if self.schedule.draw("dynamodb.throttle").random() < 0.5:
            return _dynamodb_error("400 Bad Request", "ThrottlingException",
                                   "Throughput exceeds the current capacity of your table or index. DynamoDB is "
                                   "automatically scaling your table or index so please try again shortly.")
        return _dynamodb_error("400 Bad Request", "ProvisionedThroughputExceededException",
                               "The level of configured provisioned throughput for the table was exceeded. "
                               "Consider increasing your provisioning level with the UpdateTable API.")

    def _leave_unprocessed(self, operation: str, request: Request) -> dict[str, list[Any]]:
        """Take about half the keys (at least one) out of a batch call; they are answered unprocessed.
        BatchGetItem's value per table is [its options, the keys left]."""
        draw = self.schedule.draw("dynamodb.throttle")
        items = request.document["RequestItems"]
        entries = [(table, index) for table, spec in items.items()
                   for index in range(len(spec["Keys"] if operation == "BatchGetItem" else spec))]
        if not entries:
            return {}
        left = {entry for entry in entries if draw.random() < 0.5} or {entries[draw.randrange(len(entries))]}
        unprocessed: dict[str, list[Any]] = {}
        for table in list(items):
            spec = items[table]
            keys = spec["Keys"] if operation == "BatchGetItem" else spec
            kept = [key for index, key in enumerate(keys) if (table, index) not in left]
            gone = [key for index, key in enumerate(keys) if (table, index) in left]
            if gone:
                if operation == "BatchGetItem":
                    unprocessed[table] = [{n: v for n, v in spec.items() if n != "Keys"}, gone]
                else:
                    unprocessed[table] = gone
            if operation == "BatchGetItem":
                spec["Keys"] = kept
                if not kept:
                    items[table] = []
            else:
                items[table] = kept
        return unprocessed

    def _conflict(self, operation: str, request: Request) -> Answer:
        if operation != "TransactWriteItems":
            return _dynamodb_error("400 Bad Request", "TransactionConflictException",
                                   "Transaction is ongoing for the item")
        count = len(request.document.get("TransactItems") or [])
        conflicting = self.schedule.draw("dynamodb.conflict").randrange(count) if count else 0
        reasons = [
            {"Code": "TransactionConflict", "Message": "Transaction is ongoing for the item"}
            if index == conflicting else {"Code": "None"}
            for index in range(count)
        ]
        codes = ", ".join(reason["Code"] for reason in reasons)
        return _dynamodb_error(
            "400 Bad Request", "TransactionCanceledException",
            f"Transaction cancelled, please refer cancellation reasons for specific reasons [{codes}]",
            message_key="Message", CancellationReasons=reasons,
        )

    def _token_replay(self, request: Request) -> Answer | None:
        token = request.document.get("ClientRequestToken")
        if not token:
            return None
        now = self.clock()
        while self._tokens and next(iter(self._tokens.values()))[1] <= now:
            del self._tokens[next(iter(self._tokens))]
        if token not in self._tokens:
            return None
        fingerprint, _, answer = self._tokens[token]
        if fingerprint != _fingerprint(request.document):
            return _dynamodb_error("400 Bad Request", "IdempotentParameterMismatchException",
                                   "One or more parameter values were invalid: the request does not match the "
                                   "original request of this ClientRequestToken")
        return Answer(answer.status, list(answer.headers), answer.body)

    def _remember_token(self, request: Request, answer: Answer) -> None:
        token = request.document.get("ClientRequestToken")
        if token:
            self._tokens[token] = (_fingerprint(request.document), self.clock() + TOKEN_IDEMPOTENCY_SECONDS, answer)


def _dynamodb_error(status: str, code: str, message: str, *, message_key: str = "message", **fields: Any) -> Answer:
    # DynamoDB writes most messages as "message", TransactionCanceledException's as "Message";
    # botocore reads either.
    return json_answer(status, {"__type": _DYNAMODB_ERROR_PREFIX + code, message_key: message, **fields})


def _dynamodb_internal_error() -> Answer:
    return _dynamodb_error("500 Internal Server Error", "InternalServerError", "Internal server error")


def _backend(request: Request) -> Any:
    return moto_backend(dynamodb_backends, request.environ)


def _fingerprint(document: Any) -> str:
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode("utf-8")).hexdigest()
