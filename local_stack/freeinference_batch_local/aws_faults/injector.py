"""AWS's bad days on demand: faults injected into the local stack's moto server.

`LOCAL_AWS_FAULTS` (comma-separated `name=value`) turns them on, `LOCAL_AWS_FAULTS_SEED` (an
integer) fixes their schedule. Each name reproduces one thing AWS does (docs/DESIGN "AWS failure
modes"):

- `dynamodb.throttle=R`: a share R of DynamoDB item calls answer `ThrottlingException` or
  `ProvisionedThroughputExceededException` (400) before anything is applied; botocore retries
  them, so only runs of them reach the code. A throttled `BatchGetItem`/`BatchWriteItem` instead
  leaves some of its keys in `UnprocessedKeys`/`UnprocessedItems` (all of them: the exception),
  as DynamoDB mostly does.
- `dynamodb.error=R`: `InternalServerError` (500) before anything is applied.
- `dynamodb.lost_answer=R`: a write (PutItem, UpdateItem, DeleteItem, BatchWriteItem,
  TransactWriteItems) is applied, then its answer is lost (a 500), so botocore sends it again: a
  conditional write sent again meets its own earlier success. `TransactWriteItems` carries a
  `ClientRequestToken` (botocore fills it in, and a retry re-sends it), which is emulated for
  every caller while any fault is on: the same token and request within 10 minutes answer the
  earlier success without applying again; the same token with another request answers
  `IdempotentParameterMismatchException`.
- `dynamodb.conflict=R`: a `TransactWriteItems` is cancelled with reason `TransactionConflict`
  on one of its items (`TransactionCanceledException`, one reason per item, the others `None`);
  a PutItem/UpdateItem/DeleteItem answers `TransactionConflictException`. Neither is retried by
  botocore. Never for a transaction its token has already applied (DynamoDB answers that one's
  success).
- `dynamodb.stale_ms=MS`: eventually consistent reads (GetItem, BatchGetItem, Query and Scan
  without `ConsistentRead`, and every query of a global secondary index) may answer items as
  they were up to MS ms earlier. Each table has a lagging replica inside moto's backend (same
  keys and indexes, named `<table>.lagging-replica`, hidden from ListTables); every write's
  resulting item images (read from moto after the write, from any caller) reach it at now +
  uniform(0, MS), in order per item, and are applied before each request is served. While a
  table's replica has nothing pending it equals the table and reads go to the table itself.
  Its count is of stale answers served: answers that differ from what the consistent read at
  that moment answers.
- `sqs.duplicate=R`: a message a ReceiveMessage returns is, with probability R, made visible
  again at once, so another receive gets the same MessageId with a new receipt handle.
- `sqs.lost_answer=R`: SendMessage(Batch), DeleteMessage(Batch), ChangeMessageVisibility(Batch)
  are applied, then answer a 500, so botocore sends them again (a message sent twice is two
  messages, as on SQS).
- `s3.error=R` (any call: a 500 before it is applied), `s3.lost_answer=R` (a PUT, POST or DELETE
  applied, then a 500).

Only the service's own calls are faulted: those whose User-Agent carries `app/<SERVICE_APP_ID>`,
which botocore adds when `AWS_SDK_UA_APP_ID` is set. The local stack sets it for its functions,
pollers and schedules only after its own setup (tables, queues, the dev key), and leaves it out
of the state file the admin CLI and tests read; an unmarked caller is never faulted.

The errors are written as each service's protocol carries them, so that botocore classifies
them as AWS's own (`botocore.retries.standard`): DynamoDB and SQS (JSON protocol in the
installed botocore) a JSON body whose `__type` names the error, SQS also the
`x-amzn-query-error` header of its query-compatible errors; S3 an XML `<Error>`. 5xx and the
two throttling codes are retried; `TransactionCanceledException`,
`TransactionConflictException` and `IdempotentParameterMismatchException` (400) are not.

Determinism: each fault has its own `random.Random`, seeded from the seed and the fault's name,
and draws only for the calls that fault can hit. The server serves one request at a time, so
the fault schedule is a function of the seed and the sequence of calls it serves. Threads
interleave their calls differently from one run to the next, so a seed reproduces the
schedule, not a whole run of the stack; what a stale read answers also depends on how much time
passed. Without a seed one is drawn and logged.

With no fault configured the moto app is wrapped only to answer `GET /_local/faults` (the
counts, all 0): one string comparison per request. The counts: `GET /_local/faults` answers a
JSON object of every name and how many times it was injected; moto never sees that path (no S3
bucket can be named `_local`).
"""

from __future__ import annotations

import copy
import hashlib
import heapq
import io
import json
import logging
import os
import random
import re
import secrets
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

FAULTS_ENV = "LOCAL_AWS_FAULTS"
SEED_ENV = "LOCAL_AWS_FAULTS_SEED"
APP_ID_ENV = "AWS_SDK_UA_APP_ID"  # botocore adds `app/<value>` to every User-Agent it sends
SERVICE_APP_ID = "freeinference-batch-service"
FAULTS_PATH = "/_local/faults"

STALE_MS = "dynamodb.stale_ms"
# Every fault, in the order `admin faults` prints them.
FAULT_NAMES = (
    "dynamodb.throttle",
    "dynamodb.error",
    "dynamodb.lost_answer",
    "dynamodb.conflict",
    STALE_MS,
    "sqs.duplicate",
    "sqs.lost_answer",
    "s3.lost_answer",
    "s3.error",
)
TOKEN_IDEMPOTENCY_SECONDS = 600.0  # DynamoDB keeps a ClientRequestToken this long
REPLICA_SUFFIX = ".lagging-replica"

_SERVICE_MARK = f"app/{SERVICE_APP_ID}"
_CREDENTIAL_SCOPE = re.compile(r"Credential=([^/,\s]+)/\d{8}/([^/]+)/([^/]+)/aws4_request")
_DYNAMODB_ITEM_CALLS = frozenset({
    "GetItem", "PutItem", "UpdateItem", "DeleteItem", "Query", "Scan", "BatchGetItem", "BatchWriteItem",
    "TransactGetItems", "TransactWriteItems",
})
_DYNAMODB_WRITES = frozenset({"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"})
_DYNAMODB_CONFLICTING = frozenset({"PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems"})
_DYNAMODB_EVENTUAL_READS = frozenset({"GetItem", "Query", "Scan", "BatchGetItem"})
_SQS_WRITES = frozenset({
    "SendMessage", "SendMessageBatch", "DeleteMessage", "DeleteMessageBatch", "ChangeMessageVisibility",
    "ChangeMessageVisibilityBatch",
})
_S3_WRITE_METHODS = frozenset({"PUT", "POST", "DELETE"})
_DYNAMODB_ERROR_PREFIX = "com.amazonaws.dynamodb.v20120810#"
_JSON_1_0 = "application/x-amz-json-1.0"


class FaultConfigError(ValueError):
    """LOCAL_AWS_FAULTS or LOCAL_AWS_FAULTS_SEED cannot be used; the message says why."""


@dataclass(frozen=True)
class FaultConfig:
    """The faults turned on (name -> rate, or ms for `dynamodb.stale_ms`) and the seed."""

    values: Mapping[str, float] = field(default_factory=dict)
    seed: int = 0

    @property
    def enabled(self) -> bool:
        return any(self.values.values())

    def rate(self, name: str) -> float:
        return self.values.get(name, 0.0)

    def describe(self) -> str:
        """The faults on, as LOCAL_AWS_FAULTS writes them (parse_faults reads it back)."""
        return ",".join(
            f"{name}={int(value) if name == STALE_MS else repr(value)}"
            for name in FAULT_NAMES if (value := self.values.get(name))
        )


def parse_faults(text: str | None, seed_text: str | None = None) -> FaultConfig:
    """`LOCAL_AWS_FAULTS` and `LOCAL_AWS_FAULTS_SEED` as a FaultConfig; FaultConfigError names
    what is wrong (an unknown name, a bad value, a name given twice, a seed that is no integer)."""
    values: dict[str, float] = {}
    for entry in (text or "").split(","):
        entry = entry.strip()
        if not entry:
            if text and text.strip():
                raise FaultConfigError(f"{FAULTS_ENV}={text!r}: an empty entry (two commas, or one at an end)")
            continue
        name, equals, value = (part.strip() for part in entry.partition("="))
        if name not in FAULT_NAMES:
            raise FaultConfigError(
                f"{FAULTS_ENV}: unknown fault {name!r}; known: {', '.join(FAULT_NAMES)}"
            )
        if not equals or not value:
            raise FaultConfigError(f"{FAULTS_ENV}: {name} needs a value ({name}={'MS' if name == STALE_MS else 'R'})")
        if name in values:
            raise FaultConfigError(f"{FAULTS_ENV}: {name} is given twice")
        values[name] = _stale_ms(value) if name == STALE_MS else _rate(name, value)
    if seed_text is None or not seed_text.strip():
        seed = secrets.randbelow(2**32)
    else:
        try:
            seed = int(seed_text.strip())
        except ValueError:
            raise FaultConfigError(f"{SEED_ENV}={seed_text!r} is not an integer") from None
    return FaultConfig(values, seed)


def _rate(name: str, value: str) -> float:
    try:
        rate = float(value)
    except ValueError:
        rate = -1.0
    if not 0.0 <= rate <= 1.0:  # also refuses nan
        raise FaultConfigError(f"{FAULTS_ENV}: {name}={value!r}: the rate must be a number from 0 to 1")
    return rate


def _stale_ms(value: str) -> float:
    try:
        milliseconds = int(value)
    except ValueError:
        milliseconds = -1
    if milliseconds < 0:
        raise FaultConfigError(f"{FAULTS_ENV}: {STALE_MS}={value!r}: give whole milliseconds, 0 or more")
    return float(milliseconds)


def config_from_env(environ: Mapping[str, str] | None = None) -> FaultConfig:
    environ = os.environ if environ is None else environ
    return parse_faults(environ.get(FAULTS_ENV), environ.get(SEED_ENV))


def wrap(app: Callable[..., Iterable[bytes]], config: FaultConfig) -> Callable[..., Iterable[bytes]]:
    """The moto WSGI app with `config`'s faults, or only the counts' path when none is on."""
    if config.enabled:
        log.warning("AWS faults on: %s (%s=%d)", config.describe(), SEED_ENV, config.seed)
        return FaultInjector(app, config)
    return CountsOnly(app)


# ---------------------------------------------------------------- WSGI plumbing


@dataclass
class Answer:
    status: str
    headers: list[tuple[str, str]]
    body: bytes

    @property
    def code(self) -> int:
        return int(self.status.split(" ", 1)[0])

    @property
    def ok(self) -> bool:
        return 200 <= self.code < 300

    def json(self) -> Any:
        return json.loads(self.body or b"{}")

    def with_json(self, document: Any) -> Answer:
        body = json.dumps(document, separators=(",", ":")).encode("utf-8")
        replaced = {"content-length": str(len(body)), "x-amz-crc32": str(zlib.crc32(body) & 0xFFFFFFFF)}
        headers = [(name, replaced.get(name.lower(), value)) for name, value in self.headers]
        return Answer(self.status, headers, body)


def _json_answer(status: str, document: Any, extra_headers: Iterable[tuple[str, str]] = ()) -> Answer:
    body = json.dumps(document, separators=(",", ":")).encode("utf-8")
    headers = [
        ("Content-Type", _JSON_1_0),
        ("Content-Length", str(len(body))),
        ("x-amzn-RequestId", str(uuid.uuid4())),
        ("x-amz-crc32", str(zlib.crc32(body) & 0xFFFFFFFF)),
        *extra_headers,
    ]
    return Answer(status, headers, body)


def _counts_answer(counts: Mapping[str, int], start_response: Callable[..., Any]) -> list[bytes]:
    body = json.dumps({name: counts.get(name, 0) for name in FAULT_NAMES}).encode("utf-8")
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]


class CountsOnly:
    """No fault on: moto as it is, plus the counts' path (all 0)."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == FAULTS_PATH:
            return _counts_answer({}, start_response)
        return self.app(environ, start_response)


# ---------------------------------------------------------------- errors, as each service answers them


def _dynamodb_error(status: str, code: str, message: str, *, message_key: str = "message", **fields: Any) -> Answer:
    # DynamoDB writes most messages as "message", TransactionCanceledException's as "Message";
    # botocore reads either.
    return _json_answer(status, {"__type": _DYNAMODB_ERROR_PREFIX + code, message_key: message, **fields})


def _dynamodb_internal_error() -> Answer:
    return _dynamodb_error("500 Internal Server Error", "InternalServerError", "Internal server error")


def _sqs_internal_error() -> Answer:
    return _json_answer(
        "500 Internal Server Error",
        {"__type": "com.amazonaws.sqs#InternalFailure",
         "message": "The request processing has failed because of an unknown error, exception or failure."},
        [("x-amzn-query-error", "InternalFailure;Receiver")],
    )


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


# ---------------------------------------------------------------- the injector


@dataclass
class _Request:
    environ: dict[str, Any]
    body: bytes
    marked: bool
    modified: bool = False  # `document` was changed: it, not `body`, is what moto must get
    _document: Any = None

    @property
    def document(self) -> Any:
        if self._document is None:
            self._document = json.loads(self.body or b"{}")
        return self._document

    def replaced(self, document: Any) -> dict[str, Any]:
        """This request's environ with another JSON body."""
        body = json.dumps(document).encode("utf-8")
        environ = dict(self.environ)
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        return environ

    def fresh(self) -> dict[str, Any]:
        """This request's environ with its body readable again."""
        self.environ["wsgi.input"] = io.BytesIO(self.body)
        return self.environ

    def current(self) -> dict[str, Any]:
        """The environ of the request as it is now (`document`, if it was changed)."""
        return self.replaced(self.document) if self.modified else self.fresh()


class FaultInjector:
    """The moto WSGI app with faults (see the module docstring). Not thread-safe: it runs inside
    SerializedWsgiApp's lock, as moto does."""

    def __init__(self, app: Callable[..., Iterable[bytes]], config: FaultConfig,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.app = app
        self.config = config
        self.clock = clock
        self.counts: Counter[str] = Counter()
        self._random = {name: random.Random(f"{config.seed}:{name}") for name in FAULT_NAMES}
        # ClientRequestToken -> (the request's fingerprint, expiry, answer), oldest first
        self._tokens: dict[str, tuple[str, float, Answer]] = {}
        lag_ms = config.rate(STALE_MS)
        self.replicas = LaggingReplicas(lag_ms / 1000.0, self._random[STALE_MS], clock) if lag_ms else None

    def _hit(self, name: str) -> bool:
        rate = self.config.rate(name)
        return bool(rate) and self._random[name].random() < rate

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == FAULTS_PATH:
            return _counts_answer(self.counts, start_response)
        if self.replicas is not None:
            self.replicas.apply_due()
        target = environ.get("HTTP_X_AMZ_TARGET") or ""
        marked = _SERVICE_MARK in (environ.get("HTTP_USER_AGENT") or "")
        if target.startswith("DynamoDB_"):
            answer = self._dynamodb(target.partition(".")[2], self._request(environ, marked))
        elif marked and target.startswith("AmazonSQS."):
            answer = self._sqs(target.partition(".")[2], self._request(environ, marked))
        elif marked and not target and _scope(environ)[2] == "s3":
            answer = self._s3(self._request(environ, marked))
        else:
            return self.app(environ, start_response)
        start_response(answer.status, answer.headers)
        return [answer.body]

    def _request(self, environ: dict[str, Any], marked: bool) -> _Request:
        stream = environ["wsgi.input"]
        body = stream.getvalue() if isinstance(stream, io.BytesIO) else stream.read()
        return _Request(environ, body, marked)

    def _forward(self, environ: dict[str, Any]) -> Answer:
        captured: dict[str, Any] = {}
        written: list[bytes] = []

        def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], Any]:
            captured["status"], captured["headers"] = status, headers
            return written.append

        result = self.app(environ, capture)
        try:
            body = b"".join([*written, *result])
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        return Answer(captured["status"], list(captured["headers"]), body)

    # ------------------------------------------------------------ DynamoDB

    def _dynamodb(self, operation: str, request: _Request) -> Answer:
        faultable = request.marked and operation in _DYNAMODB_ITEM_CALLS
        unprocessed: dict[str, list[Any]] = {}
        if faultable and self._hit("dynamodb.throttle"):
            self.counts["dynamodb.throttle"] += 1
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
        if faultable and self._hit("dynamodb.error"):
            self.counts["dynamodb.error"] += 1
            return _dynamodb_internal_error()

        if operation == "TransactWriteItems":
            replay = self._token_replay(request)
            if replay is not None:
                return replay
        if faultable and operation in _DYNAMODB_CONFLICTING and self._hit("dynamodb.conflict"):
            self.counts["dynamodb.conflict"] += 1
            return self._conflict(operation, request)

        written: list[tuple[str, dict[str, Any]]] = []
        if self.replicas is not None and operation in _DYNAMODB_WRITES:
            written = self.replicas.before_write(_dynamodb_backend(request.environ), operation, request.document)
        answer = self._dynamodb_call(operation, request, unprocessed)
        if answer.ok and operation in _DYNAMODB_WRITES:
            if self.replicas is not None:
                self.replicas.after_write(_dynamodb_backend(request.environ), written)
            if operation == "TransactWriteItems":
                self._remember_token(request, answer)
        elif answer.ok and operation == "DeleteTable" and self.replicas is not None:
            self.replicas.drop(_dynamodb_backend(request.environ), request.document.get("TableName", ""))
        if answer.ok and operation == "ListTables" and self.replicas is not None:
            document = answer.json()
            document["TableNames"] = [n for n in document.get("TableNames", []) if not n.endswith(REPLICA_SUFFIX)]
            answer = answer.with_json(document)
        if faultable and answer.ok and operation in _DYNAMODB_WRITES and self._hit("dynamodb.lost_answer"):
            self.counts["dynamodb.lost_answer"] += 1
            return _dynamodb_internal_error()
        return answer

    def _dynamodb_call(self, operation: str, request: _Request, unprocessed: dict[str, list[Any]]) -> Answer:
        if self.replicas is not None and request.marked and operation in _DYNAMODB_EVENTUAL_READS:
            answer = self._eventually_consistent(operation, request)
        else:
            answer = self._forward(request.current())
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
        if self._random["dynamodb.throttle"].random() < 0.5:
            return _dynamodb_error("400 Bad Request", "ThrottlingException",
                                   "Throughput exceeds the current capacity of your table or index. DynamoDB is "
                                   "automatically scaling your table or index so please try again shortly.")
        return _dynamodb_error("400 Bad Request", "ProvisionedThroughputExceededException",
                               "The level of configured provisioned throughput for the table was exceeded. "
                               "Consider increasing your provisioning level with the UpdateTable API.")

    def _leave_unprocessed(self, operation: str, request: _Request) -> dict[str, list[Any]]:
        """Take about half the keys (at least one) out of a batch call; they are answered unprocessed.
        BatchGetItem's value per table is [its options, the keys left]."""
        draw = self._random["dynamodb.throttle"]
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

    def _conflict(self, operation: str, request: _Request) -> Answer:
        if operation != "TransactWriteItems":
            return _dynamodb_error("400 Bad Request", "TransactionConflictException",
                                   "Transaction is ongoing for the item")
        count = len(request.document.get("TransactItems") or [])
        conflicting = self._random["dynamodb.conflict"].randrange(count) if count else 0
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

    def _token_replay(self, request: _Request) -> Answer | None:
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

    def _remember_token(self, request: _Request, answer: Answer) -> None:
        token = request.document.get("ClientRequestToken")
        if token:
            self._tokens[token] = (_fingerprint(request.document), self.clock() + TOKEN_IDEMPOTENCY_SECONDS, answer)

    def _eventually_consistent(self, operation: str, request: _Request) -> Answer:
        """An eventually consistent read, from the lagging replicas of the tables it reads, when
        they have writes pending (else they equal the tables: the tables answer)."""
        replicas = self.replicas
        assert replicas is not None
        backend = _dynamodb_backend(request.environ)
        document = request.document
        renamed: dict[str, str] = {}
        if operation == "BatchGetItem":
            items = dict(document.get("RequestItems") or {})
            for table, spec in list(items.items()):
                if not spec.get("ConsistentRead") and replicas.lagging(backend, table):
                    replica = replicas.replica_of(backend, table)
                    if replica is not None:
                        items[replica] = items.pop(table)
                        renamed[replica] = table
            stale_request = {**document, "RequestItems": items}
        else:
            table = document.get("TableName", "")
            index = document.get("IndexName")
            consistent = bool(document.get("ConsistentRead")) and not (
                index and replicas.is_global_index(backend, table, index)
            )
            if not consistent and replicas.lagging(backend, table):
                replica = replicas.replica_of(backend, table)
                if replica is not None:
                    renamed[replica] = table
            stale_request = {**document, "TableName": next(iter(renamed), table)}
        consistent_answer = self._forward(request.current())
        if not renamed:
            return consistent_answer
        stale_answer = self._forward(request.replaced(stale_request))
        if not stale_answer.ok or not consistent_answer.ok:
            return consistent_answer  # a refusal is not about staleness: answer the table's own
        stale = _renamed_back(stale_answer.json(), renamed)
        if _normalized(stale) != _normalized(consistent_answer.json()):
            self.counts[STALE_MS] += 1
            return stale_answer.with_json(stale)
        return consistent_answer

    # ------------------------------------------------------------ SQS

    def _sqs(self, operation: str, request: _Request) -> Answer:
        answer = self._forward(request.fresh())
        if not answer.ok:
            return answer
        if operation == "ReceiveMessage" and self.config.rate("sqs.duplicate"):
            messages = answer.json().get("Messages") or []
            if messages:
                backend = _sqs_backend(request.environ)
                queue_name = str(request.document.get("QueueUrl", "")).rstrip("/").rsplit("/", 1)[-1]
                for message in messages:
                    if self._hit("sqs.duplicate"):
                        self.counts["sqs.duplicate"] += 1
                        backend.change_message_visibility(queue_name, message["ReceiptHandle"], 0)
        elif operation in _SQS_WRITES and self._hit("sqs.lost_answer"):
            self.counts["sqs.lost_answer"] += 1
            return _sqs_internal_error()
        return answer

    # ------------------------------------------------------------ S3

    def _s3(self, request: _Request) -> Answer:
        if self._hit("s3.error"):
            self.counts["s3.error"] += 1
            return _s3_internal_error()
        answer = self._forward(request.fresh())
        if answer.ok and request.environ.get("REQUEST_METHOD") in _S3_WRITE_METHODS and self._hit("s3.lost_answer"):
            self.counts["s3.lost_answer"] += 1
            return _s3_internal_error()
        return answer


def _fingerprint(document: Any) -> str:
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode("utf-8")).hexdigest()


def _renamed_back(document: dict[str, Any], renamed: Mapping[str, str]) -> dict[str, Any]:
    """A replica's answer with the replicas' names made their tables' again."""
    for key in ("Responses", "UnprocessedKeys"):
        if isinstance(document.get(key), dict):
            document[key] = {renamed.get(table, table): value for table, value in document[key].items()}
    consumed = document.get("ConsumedCapacity")
    for entry in consumed if isinstance(consumed, list) else [consumed] if isinstance(consumed, dict) else []:
        if entry.get("TableName") in renamed:
            entry["TableName"] = renamed[entry["TableName"]]
    return document


def _normalized(document: dict[str, Any]) -> Any:
    """An answer compared as DynamoDB means it: BatchGetItem's items per table in no order."""
    if isinstance(document.get("Responses"), dict):
        document = {**document, "Responses": {
            table: sorted(json.dumps(item, sort_keys=True) for item in items)
            for table, items in document["Responses"].items()
        }}
    return json.dumps(document, sort_keys=True)


# ---------------------------------------------------------------- moto's backends


def _scope(environ: Mapping[str, Any]) -> tuple[str, str, str]:
    """(access key, region, service) of a SigV4-signed request; empty strings if unsigned."""
    found = _CREDENTIAL_SCOPE.search(environ.get("HTTP_AUTHORIZATION") or "")
    return (found.group(1), found.group(2), found.group(3)) if found else ("", "", "")


def _account_and_region(environ: Mapping[str, Any]) -> tuple[str, str]:
    # As moto's BaseResponse.get_current_account picks the account.
    from moto.iam.models import get_account_id_from

    access_key, region, _ = _scope(environ)
    account = os.environ.get("MOTO_ACCOUNT_ID") or environ.get("HTTP_X_MOTO_ACCOUNT_ID") or get_account_id_from(
        access_key or "AKIAEXAMPLE"
    )
    return account, region or "us-east-1"


def _dynamodb_backend(environ: Mapping[str, Any]) -> Any:
    from moto.dynamodb.models import dynamodb_backends

    account, region = _account_and_region(environ)
    return dynamodb_backends[account][region]


def _sqs_backend(environ: Mapping[str, Any]) -> Any:
    from moto.sqs.models import sqs_backends

    account, region = _account_and_region(environ)
    return sqs_backends[account][region]


class LaggingReplicas:
    """Each table's eventually consistent replica, `lag` seconds behind at most.

    A write's resulting item images reach the replica at now + uniform(0, lag), never before an
    earlier image of the same item: so a replica answers an item as it was at most `lag` ago,
    and images of one item arrive in their order."""

    def __init__(self, lag: float, draw: random.Random, clock: Callable[[], float]) -> None:
        self.lag = lag
        self.draw = draw
        self.clock = clock
        self._due: list[tuple[float, int, Any, Any, Any, Any]] = []  # (when, n, replica, hash, range, image)
        self._sequence = 0
        self._latest: dict[tuple[int, str, Any, Any], float] = {}  # an item's last image's time
        self._pending: Counter[tuple[int, str]] = Counter()  # images on their way, per table

    def replica_of(self, backend: Any, table_name: str) -> str | None:
        """The replica's name, created (as a copy of the table) when first needed; None if the
        table does not exist (the table's own answer says so)."""
        name = table_name + REPLICA_SUFFIX
        if name in backend.tables:
            return name
        table = backend.tables.get(table_name)
        if table is None:
            return None
        from moto.dynamodb.models.table import Table

        replica = Table(
            name, account_id=table.account_id, region=table.region_name, schema=table.schema, attr=table.attr,
            billing_mode=table.billing_mode,
            indexes=[{"IndexName": i.name, "KeySchema": i.schema, "Projection": i.projection} for i in table.indexes],
            global_indexes=[{"IndexName": i.name, "KeySchema": i.schema, "Projection": i.projection}
                            for i in table.global_indexes],
        )
        for hash_key, held in table.items.items():
            replica.items[hash_key] = (
                {range_key: copy.deepcopy(item) for range_key, item in held.items()} if table.range_key_attr
                else copy.deepcopy(held)
            )
        backend.tables[name] = replica
        return name

    def lagging(self, backend: Any, table_name: str) -> bool:
        return self._pending[(id(backend), table_name)] > 0

    @staticmethod
    def is_global_index(backend: Any, table_name: str, index_name: str) -> bool:
        table = backend.tables.get(table_name)
        return table is not None and any(index.name == index_name for index in table.global_indexes)

    def drop(self, backend: Any, table_name: str) -> None:
        backend.tables.pop(table_name + REPLICA_SUFFIX, None)

    def before_write(self, backend: Any, operation: str, document: Mapping[str, Any]) -> list[tuple[str, dict]]:
        """Before moto applies a write: the replicas of the tables it writes exist (a replica made
        later would copy the write at once), and the keys it writes, for `after_write`."""
        written = []
        for table_name, key in _written_keys(operation, document, backend):
            if self.replica_of(backend, table_name) is not None:
                written.append((table_name, key))
        return written

    def after_write(self, backend: Any, written: list[tuple[str, dict]]) -> None:
        """After moto applied a write: the images of the items it wrote on their way."""
        for table_name, key in written:
            self._record(backend, table_name, key)

    def _record(self, backend: Any, table_name: str, key: Mapping[str, Any]) -> None:
        replica_name = table_name + REPLICA_SUFFIX
        table = backend.tables.get(table_name)
        if table is None or replica_name not in backend.tables:
            return
        hash_key, range_key = backend.get_keys_value(table, key)
        image = copy.deepcopy(table.get_item(hash_key, range_key))
        identity = (id(backend), table_name, hash_key, range_key)
        when = max(self.clock() + self.draw.uniform(0.0, self.lag), self._latest.get(identity, 0.0))
        self._latest[identity] = when
        self._pending[(id(backend), table_name)] += 1
        self._sequence += 1
        heapq.heappush(self._due, (when, self._sequence, (backend, table_name), backend.tables[replica_name],
                                   (hash_key, range_key), image))

    def apply_due(self) -> None:
        now = self.clock()
        while self._due and self._due[0][0] <= now:
            when, _, (backend, table_name), replica, (hash_key, range_key), image = heapq.heappop(self._due)
            identity = (id(backend), table_name, hash_key, range_key)
            if self._latest.get(identity) == when:
                del self._latest[identity]
            self._pending[(id(backend), table_name)] -= 1
            if range_key is None:
                if image is None:
                    replica.items.pop(hash_key, None)
                else:
                    replica.items[hash_key] = image
            elif image is None:
                replica.items.get(hash_key, {}).pop(range_key, None)
            else:
                replica.items[hash_key][range_key] = image


def _written_keys(operation: str, document: Mapping[str, Any], backend: Any) -> list[tuple[str, dict[str, Any]]]:
    """(table, key) of every item a successful write wrote."""
    def key_of(table_name: str, item: Mapping[str, Any]) -> dict[str, Any]:
        table = backend.tables.get(table_name)  # none: moto refuses the write, nothing to follow
        return {name: item[name] for name in table.table_key_attrs if name in item} if table else {}

    if operation == "PutItem":
        return [(document["TableName"], key_of(document["TableName"], document["Item"]))]
    if operation in ("UpdateItem", "DeleteItem"):
        return [(document["TableName"], dict(document["Key"]))]
    written: list[tuple[str, dict[str, Any]]] = []
    if operation == "BatchWriteItem":
        for table_name, requests in (document.get("RequestItems") or {}).items():
            for request in requests:
                if "PutRequest" in request:
                    written.append((table_name, key_of(table_name, request["PutRequest"]["Item"])))
                elif "DeleteRequest" in request:
                    written.append((table_name, dict(request["DeleteRequest"]["Key"])))
    elif operation == "TransactWriteItems":
        for element in document.get("TransactItems") or []:
            for kind, request in element.items():
                if kind == "Put":
                    written.append((request["TableName"], key_of(request["TableName"], request["Item"])))
                elif kind in ("Update", "Delete"):
                    written.append((request["TableName"], dict(request["Key"])))
    return written
