"""boto3 clients, created once per process.

boto3 honours `AWS_ENDPOINT_URL` by itself, which is how the local stack points every client at
its moto server; nothing here needs to know whether it runs locally.
"""

from __future__ import annotations

import threading
from functools import cache
from typing import Any

import boto3
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


def reset_clients() -> None:
    """Forget cached clients (tests that start a new moto mock)."""
    _client.cache_clear()
