"""boto3 clients, created once per process.

boto3 honours `AWS_ENDPOINT_URL` by itself, which is how the local stack points every client at
its moto server; nothing here needs to know whether it runs locally.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

import boto3
from aws_lambda_powertools.utilities.parameters import SecretsProvider
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

_lock = threading.Lock()
MAX_ATTEMPTS = 5
# One attempt that never answers is cut after these (botocore's defaults are 60 s each: longer
# than the API function's 29 s, which would then end with API Gateway's bare 503 and nothing
# logged). A DynamoDB, SQS, EventBridge, CloudWatch or Secrets Manager call answers in
# milliseconds; S3 keeps botocore's 60 s read timeout, since CompleteMultipartUpload may answer
# slowly (it sends whitespace while it joins the parts).
CONNECT_TIMEOUT_SECONDS = 3.0
READ_TIMEOUT_SECONDS = 10.0
S3_READ_TIMEOUT_SECONDS = 60.0
# A plain write to an item that a transaction is writing answers TransactionConflictException,
# which botocore's retry modes do not retry (DynamoDB's documentation asks the caller to). It
# was applied nowhere, so it is re-sent like a throttle: up to this many attempts in all, with
# exponential backoff and full jitter.
CONFLICT_ATTEMPTS = 6
CONFLICT_BACKOFF_SECONDS = 0.02


def retry_transaction_conflict(response: Any = None, attempts: int = 1, **_: Any) -> float | None:
    """A `needs-retry` handler: the delay before re-sending a write that met a transaction, or
    None (let botocore's own retry policy decide)."""
    if not response or attempts >= CONFLICT_ATTEMPTS:
        return None
    code = (response[1] or {}).get("Error", {}).get("Code")
    if code != "TransactionConflictException":
        return None
    return random.uniform(0, CONFLICT_BACKOFF_SECONDS * 2**attempts)


# What AWS answers on a bad day, that the same call may not meet a moment later: throttling, a
# server error, a write that met a transaction, a connection that broke.
_PASSING_ERROR_CODES = frozenset({
    "ThrottlingException", "ProvisionedThroughputExceededException", "RequestLimitExceeded", "Throttling",
    "SlowDown", "TransactionConflictException", "TransactionInProgressException", "InternalServerError",
    "InternalError", "ServiceUnavailable", "RequestTimeout", "RequestTimeoutException",
})
_CONNECTION_FAILURES = (EndpointConnectionError, ConnectionClosedError, ReadTimeoutError, ConnectTimeoutError)


class OutOfTime(BotoCoreError):
    """A call that would retry, but whose next attempt could not end before the deadline of the
    invocation (`deadline`): the caller answers now, while the client still waits for it."""

    fmt = "{operation} failed ({reason}) and the invocation has no time left to retry it"


_PASSING_EXCEPTIONS = (*_CONNECTION_FAILURES, OutOfTime)


def is_passing_failure(error: BaseException) -> bool:
    """An AWS error that outlasted botocore's retries but says nothing about the call itself:
    answered as `503` with Retry-After, never as the service's own fault."""
    if isinstance(error, _PASSING_EXCEPTIONS):
        return True
    if not isinstance(error, ClientError):
        return False
    code = error.response.get("Error", {}).get("Code", "")
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
    return code in _PASSING_ERROR_CODES or int(status) >= 500


# ---- an invocation's deadline ---------------------------------------------------------------
# botocore's standard mode knows nothing of the caller: its backoff (full jitter up to 1, 2, 4 and
# 8 s for a throttle, raised to a server's x-amz-retry-after up to 5 s more) can outlast the API
# function's 29 s timeout and API Gateway's 30 s, and the client then gets a bare 503 or 504 with
# nothing logged. Within `deadline`, a call gives up retrying as soon as the longest delay botocore
# may take plus this reserve (the next attempt, the rest of the request, the answer) no longer fit.
ANSWER_RESERVE_SECONDS = 2.0
_BACKOFF_CEILING_SECONDS = 20.0  # botocore's ExponentialBackoff._MAX_BACKOFF
_RETRY_AFTER_EXTRA_SECONDS = 5.0  # its _RETRY_AFTER_MAX_ADDITIONAL
_invocation = threading.local()  # per thread: an in-process local stack runs other functions beside


@contextmanager
def deadline(remaining_seconds: float | None) -> Iterator[None]:
    """Within it, this thread's AWS calls stop retrying (raising `OutOfTime`) rather than run past
    `remaining_seconds` from now; None: no deadline."""
    _invocation.deadline = None if remaining_seconds is None else time.monotonic() + remaining_seconds
    try:
        yield
    finally:
        _invocation.deadline = None


def _longest_delay(attempts: int, http_response: Any) -> float:
    """The most botocore's standard mode may sleep after attempt `attempts` (1-based) failed."""
    ceiling = min(2.0 ** (attempts - 1), _BACKOFF_CEILING_SECONDS)  # a throttle's: the longest
    retry_after = getattr(http_response, "headers", {}).get("x-amz-retry-after")
    if retry_after is not None and retry_after.isdigit():
        return max(ceiling, min(int(retry_after) / 1000, ceiling + _RETRY_AFTER_EXTRA_SECONDS))
    return ceiling


def give_up_at_the_deadline(response: Any = None, caught_exception: BaseException | None = None,
                            attempts: int = 1, operation: Any = None, **_: Any) -> None:
    """A `needs-retry` handler, called before botocore's own: raises `OutOfTime` instead of a
    retry that could not end in time. It never retries anything itself (answers None)."""
    ends = getattr(_invocation, "deadline", None)
    if ends is None or attempts >= max(MAX_ATTEMPTS, CONFLICT_ATTEMPTS):
        return None  # no deadline, or botocore gives up by itself (and its error is answered)
    hang = 0.0  # an attempt that did not answer: the next may not either, for as long
    if caught_exception is not None:
        if not isinstance(caught_exception, _CONNECTION_FAILURES):
            return None
        reason, http_response = type(caught_exception).__name__, None
        if isinstance(caught_exception, ReadTimeoutError):
            hang = _read_timeout(getattr(getattr(operation, "service_model", None), "service_name", ""))
        elif isinstance(caught_exception, ConnectTimeoutError):
            hang = CONNECT_TIMEOUT_SECONDS
    else:
        http_response, parsed = response or (None, {})
        error = (parsed or {}).get("Error", {}).get("Code", "")
        status = int((parsed or {}).get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        if error not in _PASSING_ERROR_CODES and status < 500:
            return None
        reason = error or f"HTTP {status}"
    if ends - time.monotonic() - _longest_delay(attempts, http_response) - hang < ANSWER_RESERVE_SECONDS:
        raise OutOfTime(operation=getattr(operation, "name", "an AWS call"), reason=reason)
    return None


def _read_timeout(service: str) -> float:
    return S3_READ_TIMEOUT_SECONDS if service == "s3" else READ_TIMEOUT_SECONDS


@cache
def _client(service: str) -> Any:
    config = Config(retries={"max_attempts": MAX_ATTEMPTS, "mode": "standard"}, max_pool_connections=64,
                    connect_timeout=CONNECT_TIMEOUT_SECONDS, read_timeout=_read_timeout(service))
    with _lock:  # boto3's default session is not thread-safe while it creates clients
        client = boto3.session.Session().client(service, config=config)
    client.meta.events.register_first("needs-retry", give_up_at_the_deadline)
    if service == "dynamodb":
        # After botocore's own handler, which answers None for an error it does not retry.
        client.meta.events.register("needs-retry.dynamodb", retry_transaction_conflict)
    return client


def dynamodb() -> Any:
    return _client("dynamodb")


def sqs() -> Any:
    return _client("sqs")


def s3() -> Any:
    return _client("s3")


def events() -> Any:
    return _client("events")


def cloudwatch() -> Any:
    return _client("cloudwatch")


@cache
def _secrets() -> SecretsProvider:
    # Our own provider on our own client (not Powertools' module-level default): it follows
    # reset_clients(), so a new moto endpoint or mock is never read through a stale client.
    return SecretsProvider(boto3_client=_client("secretsmanager"))


_last_read: dict[str, str] = {}


def secret_string(secret_id: str, max_age: int) -> str:
    """A Secrets Manager secret's current value, fetched at most once per `max_age` seconds
    (Powertools Parameters caches it for the life of the execution environment).

    A refresh that fails (a throttle, a blip) answers the last value read, if there is one: a
    worker asks for the upstream credential after claiming a request, and failing then would
    cost the request an attempt for nothing. A worker that never read it raises: its handler
    reads it before claiming anything (functions/worker/app.py)."""
    try:
        value = _secrets().get(secret_id, max_age=max_age)
    except Exception:
        if secret_id not in _last_read:
            raise
        logging.getLogger(__name__).warning("could not refresh secret %s; using the value last read", secret_id)
        return _last_read[secret_id]
    _last_read[secret_id] = value if isinstance(value, str) else bytes(value).decode("utf-8")
    return _last_read[secret_id]


def reset_clients() -> None:
    """Forget cached clients and cached secrets (tests that start a new moto mock)."""
    _secrets.cache_clear()
    _client.cache_clear()
    _last_read.clear()
