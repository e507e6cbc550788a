"""AWS's failures injected by the local stack's moto server (`aws_faults.py`), one fault at a time,
on an in-process MotoServer with a fixed seed, through boto3 clients that carry the service's mark.

Each rate is checked over enough calls with a tolerance that a fixed seed cannot flake: the
schedule is a function of the seed and the calls (asserted below), so each test sees the same
draws on every run.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from freeinference_batch_local import aws_faults
from freeinference_batch_local.aws_faults import SERVICE_APP_ID, FaultConfigError, parse_faults
from freeinference_batch_local.moto_server import MotoServer

SEED = "20261204"
CREDENTIALS = {"region_name": "us-east-1", "aws_access_key_id": "test", "aws_secret_access_key": "test"}


@pytest.fixture
def moto() -> Iterator[Callable[..., str]]:
    """`moto("name=value,...", seed=SEED)` starts a MotoServer injecting those faults; its endpoint."""
    servers: list[MotoServer] = []

    def start(faults: str, seed: str = SEED) -> str:
        server = MotoServer(faults=parse_faults(faults, seed))
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop()


def client(service: str, endpoint: str, *, marked: bool = True, attempts: int = 5) -> Any:
    """A boto3 client as the service's (marked) or anyone else's; botocore's standard retries."""
    config = Config(retries={"mode": "standard", "total_max_attempts": attempts},
                    user_agent_appid=SERVICE_APP_ID if marked else None)
    return boto3.client(service, endpoint_url=endpoint, config=config, **CREDENTIALS)


def counts(endpoint: str) -> dict[str, int]:
    with urllib.request.urlopen(endpoint + aws_faults.FAULTS_PATH, timeout=10) as answer:
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


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize(("text", "seed", "says"), [
    ("dynamodb.throtle=0.1", None, "unknown fault 'dynamodb.throtle'"),
    ("dynamodb.throttle=1.5", None, "from 0 to 1"),
    ("dynamodb.throttle=nan", None, "from 0 to 1"),
    ("dynamodb.error", None, "needs a value"),
    ("dynamodb.stale_ms=0.5", None, "whole milliseconds"),
    ("sqs.duplicate=0.1,,s3.error=0.1", None, "empty entry"),
    ("s3.error=0.1,s3.error=0.2", None, "given twice"),
    ("s3.error=0.1", "soon", "LOCAL_AWS_FAULTS_SEED='soon' is not an integer"),
])
def test_a_bad_configuration_is_refused_naming_what_is_wrong(text, seed, says):
    with pytest.raises(FaultConfigError, match=re.escape(says)):
        parse_faults(text, seed)


def test_a_configuration_reads_back_as_it_was_written():
    config = parse_faults(" dynamodb.throttle=0.25 , dynamodb.stale_ms=1500,sqs.duplicate=1", "-3")
    assert config.values == {"dynamodb.throttle": 0.25, "dynamodb.stale_ms": 1500.0, "sqs.duplicate": 1.0}
    assert config.seed == -3
    assert parse_faults(config.describe(), "-3") == config
    assert not parse_faults("", None).enabled and not parse_faults("s3.error=0", None).enabled


def test_the_local_stack_refuses_to_start_on_a_bad_configuration(tmp_path):
    from freeinference_batch_local.stack import LocalStack

    stack = LocalStack(env={"LOCAL_AWS_FAULTS": "dynamodb.oops=1"}, state_dir=tmp_path, write_state_file=False)
    with pytest.raises(FaultConfigError, match=re.escape("unknown fault 'dynamodb.oops'")):
        stack.start()
    assert stack.moto is None  # refused before anything started


def test_without_faults_moto_is_served_as_it_is_and_the_counts_are_all_zero():
    with MotoServer() as server:
        assert isinstance(server.app.app, aws_faults.CountsOnly)  # nothing between the lock and moto
        assert counts(server.endpoint_url) == dict.fromkeys(aws_faults.FAULT_NAMES, 0)


# ---------------------------------------------------------------- DynamoDB


def test_throttling_refuses_a_share_of_the_calls_before_applying_them(moto):
    endpoint = moto("dynamodb.throttle=0.3")
    name = table(endpoint)
    once = client("dynamodb", endpoint, attempts=1)
    outcomes = [error_code(lambda n=n: once.put_item(TableName=name, Item={**key(n), "v": {"N": "1"}}))
                for n in range(300)]
    throttled = [n for n, code in enumerate(outcomes) if code]
    assert {outcomes[n] for n in throttled} == {"ThrottlingException", "ProvisionedThroughputExceededException"}
    assert 60 <= len(throttled) <= 120  # 30% of 300
    assert all(stored(endpoint, name, n) is None for n in throttled)
    assert all(stored(endpoint, name, n) is not None for n in set(range(300)) - set(throttled))
    # botocore retries them: with its 5 attempts a call almost always gets through
    retried = client("dynamodb", endpoint)
    for n in range(300, 400):
        retried.put_item(TableName=name, Item=key(n))
    assert counts(endpoint)["dynamodb.throttle"] > len(throttled) + 20


def test_a_throttled_batch_write_leaves_some_items_unprocessed_and_unwritten(moto):
    endpoint = moto("dynamodb.throttle=1")
    name = table(endpoint)
    dynamodb = client("dynamodb", endpoint)
    answer = dynamodb.batch_write_item(RequestItems={name: [{"PutRequest": {"Item": key(n)}} for n in range(25)]})
    left = {item["PutRequest"]["Item"]["pk"]["S"] for item in answer["UnprocessedItems"][name]}
    assert 0 < len(left) < 25
    for n in range(25):
        assert (stored(endpoint, name, n) is None) == (f"k{n}" in left)


def test_a_throttled_batch_get_leaves_some_keys_unprocessed(moto):
    endpoint = moto("dynamodb.throttle=1")
    name = table(endpoint)
    writer = client("dynamodb", endpoint, marked=False)
    for n in range(30):
        writer.put_item(TableName=name, Item=key(n))
    answer = client("dynamodb", endpoint).batch_get_item(
        RequestItems={name: {"Keys": [key(n) for n in range(30)], "ConsistentRead": True}})
    got = {item["pk"]["S"] for item in answer["Responses"][name]}
    left = {k["pk"]["S"] for k in answer["UnprocessedKeys"][name]["Keys"]}
    assert answer["UnprocessedKeys"][name]["ConsistentRead"] is True  # asked again as it was asked
    assert got and left and not got & left and got | left == {f"k{n}" for n in range(30)}
    # A batch of one key throttled is DynamoDB's exception, which botocore retries
    one = client("dynamodb", endpoint, attempts=1)
    assert error_code(lambda: one.batch_get_item(RequestItems={name: {"Keys": [key(0)]}})) == (
        "ProvisionedThroughputExceededException")


def test_an_internal_error_refuses_a_share_of_the_calls_with_500_before_applying_them(moto):
    endpoint = moto("dynamodb.error=0.25")
    name = table(endpoint)
    once = client("dynamodb", endpoint, attempts=1)
    failed = []
    for n in range(200):
        try:
            once.update_item(TableName=name, Key=key(n), UpdateExpression="ADD v :one",
                             ExpressionAttributeValues={":one": {"N": "1"}})
        except ClientError as error:
            assert error.response["Error"]["Code"] == "InternalServerError"
            assert error.response["ResponseMetadata"]["HTTPStatusCode"] == 500
            failed.append(n)
    assert 30 <= len(failed) <= 70  # 25% of 200
    assert all(stored(endpoint, name, n) is None for n in failed)
    assert counts(endpoint)["dynamodb.error"] == len(failed)


def test_a_lost_answer_is_applied_then_sent_again_by_botocore(moto):
    endpoint = moto("dynamodb.lost_answer=0.3")
    name = table(endpoint)
    dynamodb = client("dynamodb", endpoint, attempts=10)
    for _ in range(100):
        dynamodb.update_item(TableName=name, Key=key("counter"), UpdateExpression="ADD v :one",
                             ExpressionAttributeValues={":one": {"N": "1"}})
    lost = counts(endpoint)["dynamodb.lost_answer"]
    assert 25 <= lost <= 60  # 30% of about 140 sends
    # Each send was applied exactly once: 100 calls, plus one application per answer lost
    assert int(stored(endpoint, name, "counter")["v"]["N"]) == 100 + lost


def test_a_conditional_put_whose_answer_was_lost_meets_its_own_success(moto):
    endpoint = moto("dynamodb.lost_answer=1")
    name = table(endpoint)
    dynamodb = client("dynamodb", endpoint, attempts=2)
    with pytest.raises(ClientError) as raised:
        dynamodb.put_item(TableName=name, Item={**key("new"), "v": {"N": "1"}},
                          ConditionExpression="attribute_not_exists(pk)")
    # As on DynamoDB: the first send wrote it, the re-send's condition fails on that write
    assert raised.value.response["Error"]["Code"] == "ConditionalCheckFailedException"
    assert stored(endpoint, name, "new") == {**key("new"), "v": {"N": "1"}}


def _add_one(table_name: str) -> list[dict[str, Any]]:
    return [{"Update": {"TableName": table_name, "Key": key("counter"), "UpdateExpression": "ADD v :one",
                        "ConditionExpression": "attribute_not_exists(done)",
                        "ExpressionAttributeValues": {":one": {"N": "1"}}}}]


def test_a_transaction_sent_again_with_its_token_answers_its_success_and_applies_once(moto):
    endpoint = moto("dynamodb.lost_answer=1")
    name = table(endpoint)
    # Every answer is lost once: botocore re-sends with the ClientRequestToken it filled in
    client("dynamodb", endpoint, attempts=2).transact_write_items(TransactItems=_add_one(name))
    assert stored(endpoint, name, "counter")["v"] == {"N": "1"}
    assert counts(endpoint)["dynamodb.lost_answer"] == 1
    # The same token and request again (anyone's): success, nothing applied
    plain = client("dynamodb", endpoint, marked=False)
    plain.transact_write_items(TransactItems=_add_one(name), ClientRequestToken="token-1")
    plain.transact_write_items(TransactItems=_add_one(name), ClientRequestToken="token-1")
    assert stored(endpoint, name, "counter")["v"] == {"N": "2"}
    # The same token with another request: DynamoDB's mismatch
    other = _add_one(name)
    other[0]["Update"]["ExpressionAttributeValues"] = {":one": {"N": "5"}}
    assert error_code(lambda: plain.transact_write_items(TransactItems=other, ClientRequestToken="token-1")) == (
        "IdempotentParameterMismatchException")
    assert stored(endpoint, name, "counter")["v"] == {"N": "2"}


def test_conflicts_cancel_transactions_and_plain_writes_unretried_and_unapplied(moto):
    endpoint = moto("dynamodb.conflict=0.3")
    name = table(endpoint)
    dynamodb = client("dynamodb", endpoint)  # botocore's 5 attempts: it must not use them
    cancelled = []
    for n in range(100):
        elements = [{"Put": {"TableName": name, "Item": key(f"{n}-{i}")}} for i in range(3)]
        try:
            dynamodb.transact_write_items(TransactItems=elements)
        except ClientError as error:
            assert error.response["Error"]["Code"] == "TransactionCanceledException"
            codes = [reason["Code"] for reason in error.response["CancellationReasons"]]
            assert sorted(codes) == ["None", "None", "TransactionConflict"]
            assert "[" + ", ".join(codes) + "]" in error.response["Error"]["Message"]
            cancelled.append(n)
    conflicting_puts = []
    for n in range(100):
        if error_code(lambda n=n: dynamodb.put_item(TableName=name, Item=key(f"plain-{n}"))) is not None:
            conflicting_puts.append(n)
    assert 15 <= len(cancelled) <= 45 and 15 <= len(conflicting_puts) <= 45  # 30% of 100 each
    # Not retried: one injected conflict per call that failed, and nothing of them applied
    assert counts(endpoint)["dynamodb.conflict"] == len(cancelled) + len(conflicting_puts)
    assert all(stored(endpoint, name, f"{n}-{i}") is None for n in cancelled for i in range(3))
    assert all(stored(endpoint, name, f"plain-{n}") is None for n in conflicting_puts)


def test_a_plain_write_in_conflict_answers_transaction_conflict_exception(moto):
    endpoint = moto("dynamodb.conflict=1")
    name = table(endpoint)
    dynamodb = client("dynamodb", endpoint)
    for call in (lambda: dynamodb.put_item(TableName=name, Item=key(1)),
                 lambda: dynamodb.update_item(TableName=name, Key=key(1), UpdateExpression="SET v = :v",
                                              ExpressionAttributeValues={":v": {"N": "1"}}),
                 lambda: dynamodb.delete_item(TableName=name, Key=key(1))):
        assert error_code(call) == "TransactionConflictException"
    assert counts(endpoint)["dynamodb.conflict"] == 3  # none of them retried


STALE_MS = 400


def test_an_eventually_consistent_read_may_answer_the_item_as_it_was_within_the_lag_and_never_after(moto):
    endpoint = moto(f"dynamodb.stale_ms={STALE_MS}")
    name = table(endpoint)
    dynamodb = client("dynamodb", endpoint)
    for n in range(30):
        dynamodb.put_item(TableName=name, Item={**key(n), "v": {"N": "1"}})
    _wait_past(time.monotonic() + STALE_MS / 1000)
    stale_answers, written_at = 0, 0.0
    for n in range(30):
        dynamodb.put_item(TableName=name, Item={**key(n), "v": {"N": "2"}})
        written_at = time.monotonic()
        eventual = dynamodb.get_item(TableName=name, Key=key(n))["Item"]["v"]["N"]
        assert eventual in ("1", "2")  # an earlier version, never another
        stale_answers += eventual == "1"
        # A consistent read is never stale
        assert dynamodb.get_item(TableName=name, Key=key(n), ConsistentRead=True)["Item"]["v"] == {"N": "2"}
    assert stale_answers >= 5  # the next read came within a few ms; the lag is up to 400 ms
    assert counts(endpoint)["dynamodb.stale_ms"] == stale_answers  # counted: answers that were stale
    _wait_past(written_at + STALE_MS / 1000)
    assert all(dynamodb.get_item(TableName=name, Key=key(n))["Item"]["v"] == {"N": "2"} for n in range(30))
    assert counts(endpoint)["dynamodb.stale_ms"] == stale_answers


def test_index_queries_scans_and_batch_gets_can_be_stale_consistent_ones_never(moto):
    endpoint = moto(f"dynamodb.stale_ms={STALE_MS}")
    name = table(endpoint, index=True)
    dynamodb = client("dynamodb", endpoint)
    missed = {"index": 0, "scan": 0, "batch": 0}
    for n in range(20):
        dynamodb.put_item(TableName=name, Item={**key(n), "g": {"S": f"g{n}"}})
        found = dynamodb.query(TableName=name, IndexName="g-index", KeyConditionExpression="g = :g",
                               ExpressionAttributeValues={":g": {"S": f"g{n}"}})["Items"]
        missed["index"] += not found
        everything = {item["pk"]["S"] for item in dynamodb.scan(TableName=name)["Items"]}
        missed["scan"] += f"k{n}" not in everything
        batch = dynamodb.batch_get_item(RequestItems={name: {"Keys": [key(n)]}})["Responses"][name]
        missed["batch"] += not batch
        assert dynamodb.query(TableName=name, KeyConditionExpression="pk = :k", ConsistentRead=True,
                              ExpressionAttributeValues={":k": key(n)["pk"]})["Items"]
        assert {item["pk"]["S"] for item in dynamodb.scan(TableName=name, ConsistentRead=True)["Items"]} >= {
            f"k{m}" for m in range(n + 1)}
        assert dynamodb.batch_get_item(
            RequestItems={name: {"Keys": [key(n)], "ConsistentRead": True}})["Responses"][name]
    assert all(count >= 3 for count in missed.values()), missed
    # The replicas behind this are moto's business: nobody lists them
    assert client("dynamodb", endpoint).list_tables()["TableNames"].count(name) == 1
    assert not [t for t in client("dynamodb", endpoint, marked=False).list_tables()["TableNames"]
                if t.startswith(name) and t != name]


def _wait_past(moment: float) -> None:
    """Until the monotonic clock passes `moment`: what the lag's bound is stated in."""
    while time.monotonic() <= moment:
        time.sleep(moment - time.monotonic() + 0.001)


# ---------------------------------------------------------------- SQS


def _queue(endpoint: str) -> str:
    return client("sqs", endpoint, marked=False).create_queue(QueueName=unique("q"))["QueueUrl"]


def _receive_all(sqs: Any, url: str, deadline_seconds: float = 20.0) -> list[dict[str, Any]]:
    """Every message a receive gets until one gets none (with a deadline)."""
    received: list[dict[str, Any]] = []
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=300).get("Messages")
        if not messages:
            return received
        received.extend(messages)
    raise AssertionError(f"the queue was not drained within {deadline_seconds} s")


def test_a_received_message_is_delivered_again_with_the_same_id(moto):
    endpoint = moto("sqs.duplicate=0.2")
    url = _queue(endpoint)
    sqs = client("sqs", endpoint)
    sent = {sqs.send_message(QueueUrl=url, MessageBody=str(n))["MessageId"] for n in range(100)}
    received = _receive_all(sqs, url)
    ids = [message["MessageId"] for message in received]
    assert set(ids) == sent
    duplicated = counts(endpoint)["sqs.duplicate"]
    assert len(ids) == 100 + duplicated and 10 <= duplicated <= 40  # 20% of about 120 receipts
    again = [m for m in received if ids.count(m["MessageId"]) > 1]
    assert len({m["ReceiptHandle"] for m in again}) == len(again)  # a new receipt handle each time


def test_lost_sqs_answers_are_applied_and_sent_again(moto):
    endpoint = moto("sqs.lost_answer=0.3")
    url = _queue(endpoint)
    sqs = client("sqs", endpoint, attempts=10)
    for n in range(50):
        sqs.send_message(QueueUrl=url, MessageBody=str(n))
    lost_sends = counts(endpoint)["sqs.lost_answer"]
    assert 8 <= lost_sends <= 30
    received = _receive_all(client("sqs", endpoint, marked=False), url)
    assert len(received) == 50 + lost_sends  # each lost answer: the message sent once more
    for message in received:  # deleting twice (the re-send) succeeds, as on SQS
        sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    assert counts(endpoint)["sqs.lost_answer"] > lost_sends
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["ApproximateNumberOfMessages"] == attributes["ApproximateNumberOfMessagesNotVisible"] == "0"


# ---------------------------------------------------------------- S3


def _bucket(endpoint: str) -> str:
    name = unique("bucket")
    client("s3", endpoint, marked=False).create_bucket(Bucket=name)
    return name


def test_s3_errors_refuse_a_share_of_the_calls_with_500_before_applying_them(moto):
    endpoint = moto("s3.error=0.3")
    bucket = _bucket(endpoint)
    s3 = client("s3", endpoint, attempts=1)
    failed = []
    for n in range(100):
        try:
            s3.put_object(Bucket=bucket, Key=f"o{n}", Body=b"x")
        except ClientError as error:
            assert error.response["Error"]["Code"] == "InternalError"
            assert error.response["ResponseMetadata"]["HTTPStatusCode"] == 500
            failed.append(n)
    assert 15 <= len(failed) <= 45
    names = {o["Key"] for o in client("s3", endpoint, marked=False).list_objects_v2(Bucket=bucket)["Contents"]}
    assert names == {f"o{n}" for n in range(100)} - {f"o{n}" for n in failed}


def test_a_lost_s3_answer_is_applied_then_sent_again(moto):
    endpoint = moto("s3.lost_answer=1")
    bucket = _bucket(endpoint)
    with pytest.raises(ClientError) as raised:
        client("s3", endpoint, attempts=2).put_object(Bucket=bucket, Key="o", Body=b"written")
    assert raised.value.response["Error"]["Code"] == "InternalError"
    assert counts(endpoint)["s3.lost_answer"] == 2  # both sends applied, both answers lost
    assert client("s3", endpoint, marked=False).get_object(Bucket=bucket, Key="o")["Body"].read() == b"written"


# ---------------------------------------------------------------- who is faulted, and when


ALL_AT_ONCE = ",".join(f"{name}={400 if name == 'dynamodb.stale_ms' else 1}" for name in aws_faults.FAULT_NAMES)


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
    url = _queue(endpoint)
    for n in range(10):
        sqs.send_message(QueueUrl=url, MessageBody=str(n))
    assert len(_receive_all(sqs, url)) == 10
    s3 = client("s3", endpoint, marked=False, attempts=1)
    bucket = _bucket(endpoint)
    s3.put_object(Bucket=bucket, Key="o", Body=b"x")
    assert s3.get_object(Bucket=bucket, Key="o")["Body"].read() == b"x"
    assert counts(endpoint) == dict.fromkeys(aws_faults.FAULT_NAMES, 0)


def test_botocore_marks_a_client_when_aws_sdk_ua_app_id_is_set(moto, monkeypatch):
    # How the local stack marks the service's clients: the variable, no Config of their own
    endpoint = moto("dynamodb.error=1")
    name = table(endpoint)
    monkeypatch.setenv(aws_faults.APP_ID_ENV, SERVICE_APP_ID)
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
