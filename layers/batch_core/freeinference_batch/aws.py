"""boto3 clients, created once per process.

boto3 honours `AWS_ENDPOINT_URL` by itself, which is how the local stack points every client at
its moto server; nothing here needs to know whether it runs locally.
"""

from __future__ import annotations

import logging
import threading
from functools import cache
from typing import Any

import boto3
from aws_lambda_powertools.utilities.parameters import SecretsProvider
from botocore.config import Config

_lock = threading.Lock()
_CONFIG = Config(retries={"max_attempts": 5, "mode": "standard"}, max_pool_connections=64)


@cache
def _client(service: str) -> Any:
    with _lock:  # boto3's default session is not thread-safe while it creates clients
        return boto3.session.Session().client(service, config=_CONFIG)


def dynamodb() -> Any:
    return _client("dynamodb")


def sqs() -> Any:
    return _client("sqs")


def s3() -> Any:
    return _client("s3")


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
    cost the request an attempt for nothing. A worker that never read it fails at cold start."""
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
