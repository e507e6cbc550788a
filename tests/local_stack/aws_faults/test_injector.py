"""Who is faulted and when: only the service's marked calls, on a schedule the seed fixes; with no
fault on, moto as it is."""

from __future__ import annotations

import boto3
from botocore.config import Config
from freeinference_batch_local.aws_faults.config import APP_ID_ENV, FAULT_NAMES, SERVICE_APP_ID
from freeinference_batch_local.aws_faults.wsgi import CountsOnly
from freeinference_batch_local.moto.server import MotoServer

from tests.local_stack.aws_faults.calls import (
    CREDENTIALS,
    client,
    counts,
    error_code,
    key,
    new_bucket,
    new_queue,
    receive_all,
    table,
)

ALL_AT_ONCE = ",".join(f"{name}={400 if name == 'dynamodb.stale_ms' else 1}" for name in FAULT_NAMES)


def test_without_faults_moto_is_served_as_it_is_and_the_counts_are_all_zero():
    with MotoServer() as server:
        assert isinstance(server.app.app, CountsOnly)  # nothing between the lock and moto
        assert counts(server.endpoint_url) == dict.fromkeys(FAULT_NAMES, 0)


def test_callers_without_the_services_mark_are_never_faulted(moto):
    endpoint = moto(ALL_AT_ONCE)
    name = table(endpoint, index=True)
    dynamodb = client("dynamodb", endpoint, marked=False, attempts=1)
    for n in range(20):
        dynamodb.put_item(TableName=name, Item={**key(n), "g": {"S": "g"}})
        assert dynamodb.get_item(TableName=name, Key=key(n))["Item"]
        dynamodb.transact_write_items(TransactItems=[{"Put": {"TableName": name, "Item": key(f"t{n}")}}])
    assert len(dynamodb.query(TableName=name, IndexName="g-index", KeyConditionExpression="g = :g",
                              ExpressionAttributeValues={":g": {"S": "g"}})["Items"]) == 20
    sqs = client("sqs", endpoint, marked=False, attempts=1)
    url = new_queue(endpoint)
    for n in range(10):
        sqs.send_message(QueueUrl=url, MessageBody=str(n))
    assert len(receive_all(sqs, url)) == 10
    s3 = client("s3", endpoint, marked=False, attempts=1)
    bucket = new_bucket(endpoint)
    s3.put_object(Bucket=bucket, Key="o", Body=b"x")
    assert s3.get_object(Bucket=bucket, Key="o")["Body"].read() == b"x"
    assert counts(endpoint) == dict.fromkeys(FAULT_NAMES, 0)


def test_botocore_marks_a_client_when_aws_sdk_ua_app_id_is_set(moto, monkeypatch):
    # How the local stack marks the service's clients: the variable, no Config of their own
    endpoint = moto("dynamodb.error=1")
    name = table(endpoint)
    monkeypatch.setenv(APP_ID_ENV, SERVICE_APP_ID)
    marked = boto3.client("dynamodb", endpoint_url=endpoint, config=Config(retries={"total_max_attempts": 1}),
                          **CREDENTIALS)
    assert error_code(lambda: marked.put_item(TableName=name, Item=key(1))) == "InternalServerError"


def _schedule(endpoint: str) -> list[str | None]:
    """What a fixed sequence of calls meets on a server."""
    name = table(endpoint)
    dynamodb = client("dynamodb", endpoint, attempts=1)
    return [error_code(lambda n=n: dynamodb.put_item(TableName=name, Item=key(n))) for n in range(60)]


def test_the_same_seed_gives_the_same_schedule(moto):
    faults = "dynamodb.throttle=0.2,dynamodb.error=0.2,dynamodb.conflict=0.2"
    first, second = _schedule(moto(faults, seed="42")), _schedule(moto(faults, seed="42"))
    assert first == second and any(first) and not all(first)
    assert _schedule(moto(faults, seed="43")) != first
