"""boto3 clients, created once per process.

boto3 honours `AWS_ENDPOINT_URL` by itself, which is how the local stack points every client at
its moto server; nothing here needs to know whether it runs locally.
"""

from __future__ import annotations

import logging
import random
import threading
from functools import cache
from typing import Any

import boto3
from aws_lambda_powertools.utilities.parameters import SecretsProvider
from botocore.config import Config
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

_lock = threading.Lock()
_CONFIG = Config(retries={"max_attempts": 5, "mode": "standard"}, max_pool_connections=64)
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
_PASSING_EXCEPTIONS = (EndpointConnectionError, ConnectionClosedError, ReadTimeoutError, ConnectTimeoutError)


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


@cache
def _client(service: str) -> Any:
    with _lock:  # boto3's default session is not thread-safe while it creates clients
        client = boto3.session.Session().client(service, config=_CONFIG)
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
