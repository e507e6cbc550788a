"""Calls to a faulty moto server for the AWS faults' tests: boto3 clients as the service's (marked)
or anyone else's, the counts, and tables, queues and buckets of their own per test."""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError
from freeinference_batch_local.aws_faults.config import FAULTS_PATH, SERVICE_APP_ID

SEED = "20261204"
CREDENTIALS = {"region_name": "us-east-1", "aws_access_key_id": "test", "aws_secret_access_key": "test"}


def client(service: str, endpoint: str, *, marked: bool = True, attempts: int = 5) -> Any:
    """A boto3 client as the service's (marked) or anyone else's; botocore's standard retries."""
    config = Config(retries={"mode": "standard", "total_max_attempts": attempts},
                    user_agent_appid=SERVICE_APP_ID if marked else None)
    return boto3.client(service, endpoint_url=endpoint, config=config, **CREDENTIALS)


def counts(endpoint: str) -> dict[str, int]:
    with urllib.request.urlopen(endpoint + FAULTS_PATH, timeout=10) as answer:
        return json.loads(answer.read())


def unique(prefix: str) -> str:
    # moto's backends are shared by every server of this process: each test its own names.
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def table(endpoint: str, *, index: bool = False) -> str:
    name = unique("t")
    request: dict[str, Any] = {
        "TableName": name, "BillingMode": "PAY_PER_REQUEST",
        "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}],
        "AttributeDefinitions": [{"AttributeName": "pk", "AttributeType": "S"}],
    }
    if index:
        request["AttributeDefinitions"].append({"AttributeName": "g", "AttributeType": "S"})
        request["GlobalSecondaryIndexes"] = [{"IndexName": "g-index", "Projection": {"ProjectionType": "ALL"},
                                              "KeySchema": [{"AttributeName": "g", "KeyType": "HASH"}]}]
    client("dynamodb", endpoint, marked=False).create_table(**request)
    return name


def key(n: int | str) -> dict[str, Any]:
    return {"pk": {"S": f"k{n}"}}


def stored(endpoint: str, table_name: str, n: int | str) -> dict[str, Any] | None:
    """The item as a consistent read by someone else than the service sees it."""
    return client("dynamodb", endpoint, marked=False).get_item(
        TableName=table_name, Key=key(n), ConsistentRead=True).get("Item")


def error_code(call: Callable[[], Any]) -> str | None:
    try:
        call()
    except ClientError as error:
        return error.response["Error"]["Code"]
    return None


def new_queue(endpoint: str) -> str:
    return client("sqs", endpoint, marked=False).create_queue(QueueName=unique("q"))["QueueUrl"]


def receive_all(sqs: Any, url: str, deadline_seconds: float = 20.0) -> list[dict[str, Any]]:
    """Every message a receive gets until one gets none (with a deadline)."""
    received: list[dict[str, Any]] = []
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=300).get("Messages")
        if not messages:
            return received
        received.extend(messages)
    raise AssertionError(f"the queue was not drained within {deadline_seconds} s")


def new_bucket(endpoint: str) -> str:
    name = unique("bucket")
    client("s3", endpoint, marked=False).create_bucket(Bucket=name)
    return name
