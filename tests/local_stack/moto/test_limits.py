"""The local stack's moto refuses what DynamoDB and SQS refuse, with their error codes."""

from __future__ import annotations

import boto3
import pytest
from botocore.exceptions import ClientError
from freeinference_batch_local.moto import limits, transactions
from moto import mock_aws
from moto.dynamodb.models import DynamoDBBackend

KB = 1024
# A string attribute of this many bytes makes an item just under DynamoDB's 400 KB.
ITEM_FILL = 390 * KB


@pytest.fixture
def aws(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    limits.install()
    try:
        with mock_aws():
            yield
    finally:
        limits.uninstall()


@pytest.fixture
def dynamodb(aws):
    client = boto3.client("dynamodb")
    client.create_table(TableName="t", KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
                        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                        BillingMode="PAY_PER_REQUEST")
    return client


@pytest.fixture
def sqs(aws):
    client = boto3.client("sqs")
    url = client.create_queue(QueueName="q")["QueueUrl"]
    return client, url


def refused(call, code: str) -> str:
    with pytest.raises(ClientError) as raised:
        call()
    error = raised.value.response["Error"]
    # SQS's JSON protocol names some errors AWS.SimpleQueueService.X, with X as QueryErrorCode
    assert code in (error["Code"], error.get("QueryErrorCode")), error
    return error["Message"]


def count(client) -> int:
    # A Scan page stops at 1 MB: count every page.
    return sum(page["Count"] for page in client.get_paginator("scan").paginate(TableName="t", Select="COUNT"))


def item(pk: str, fill: int = 0, **attributes) -> dict:
    return {"pk": {"S": pk}, **({"fill": {"S": "x" * fill}} if fill else {}), **attributes}


# ---------------------------------------------------------------- DynamoDB


def test_an_item_over_400_kb_is_refused(dynamodb):
    # moto's own check, kept: PutItem and UpdateItem alike
    dynamodb.put_item(TableName="t", Item=item("a", ITEM_FILL))
    refused(lambda: dynamodb.put_item(TableName="t", Item=item("b", 401 * KB)), "ValidationException")
    refused(lambda: dynamodb.update_item(TableName="t", Key={"pk": {"S": "a"}}, UpdateExpression="SET more = :v",
                                         ExpressionAttributeValues={":v": {"S": "y" * 20 * KB}}),
            "ValidationException")


@pytest.mark.parametrize("attributes", [
    {"m": {"M": {"": {"S": "v"}}}},
    {"m": {"M": {"a": {"M": {"": {"S": "v"}}}}}},
    {"l": {"L": [{"M": {"": {"S": "v"}}}]}},
    {"": {"S": "v"}},
])
def test_an_empty_map_key_or_attribute_name_is_refused(dynamodb, attributes):
    message = refused(lambda: dynamodb.put_item(TableName="t", Item=item("a", **attributes)), "ValidationException")
    assert "empty" in message
    assert "Item" not in dynamodb.get_item(TableName="t", Key={"pk": {"S": "a"}})
    # Non-empty keys (and empty values, which DynamoDB takes) are fine
    dynamodb.put_item(TableName="t", Item=item("a", m={"M": {"k": {"S": ""}}}))


def test_an_empty_map_key_is_refused_in_updates_batches_and_transactions(dynamodb):
    empty = {":m": {"M": {"": {"S": "v"}}}}
    refused(lambda: dynamodb.update_item(TableName="t", Key={"pk": {"S": "a"}}, UpdateExpression="SET m = :m",
                                         ExpressionAttributeValues=empty), "ValidationException")
    refused(lambda: dynamodb.batch_write_item(RequestItems={"t": [
        {"PutRequest": {"Item": item("a", m={"M": {"": {"S": "v"}}})}}]}), "ValidationException")
    refused(lambda: dynamodb.transact_write_items(TransactItems=[
        {"Update": {"TableName": "t", "Key": {"pk": {"S": "a"}}, "UpdateExpression": "SET m = :m",
                    "ExpressionAttributeValues": empty}}]), "ValidationException")
    assert "Item" not in dynamodb.get_item(TableName="t", Key={"pk": {"S": "a"}})


def test_batch_write_item_takes_25_requests_not_26(dynamodb):
    message = refused(lambda: dynamodb.batch_write_item(RequestItems={"t": [
        {"PutRequest": {"Item": item(f"k{i}")}} for i in range(26)]}), "ValidationException")
    assert message == "Too many items requested for the BatchWriteItem call"
    assert count(dynamodb) == 0
    dynamodb.batch_write_item(RequestItems={"t": [{"PutRequest": {"Item": item(f"k{i}")}} for i in range(25)]})
    assert count(dynamodb) == 25


@pytest.mark.parametrize("moto_version", ["moto's", "moto_transactions'"])
def test_a_transaction_over_4_mb_is_refused(dynamodb, monkeypatch, moto_version):
    if moto_version == "moto_transactions'":
        monkeypatch.setattr(DynamoDBBackend, "transact_write_items", transactions.transact_write_items)

    def puts(count: int) -> list[dict]:
        return [{"Put": {"TableName": "t", "Item": item(f"{count}-{i}", ITEM_FILL)}} for i in range(count)]

    # 13 items of 390 KB: each fits DynamoDB's 400 KB, together over 4 MB
    message = refused(lambda: dynamodb.transact_write_items(TransactItems=puts(13)), "ValidationException")
    assert message == "Transaction request cannot be larger than 4 MB"
    assert count(dynamodb) == 0
    # 10 of them (3.9 MB) go through
    dynamodb.transact_write_items(TransactItems=puts(10))
    assert count(dynamodb) == 10


def test_transactions_refuse_an_item_over_400_kb_in_both_versions(dynamodb, monkeypatch):
    oversized = [{"Put": {"TableName": "t", "Item": item("big", 401 * KB)}}]
    refused(lambda: dynamodb.transact_write_items(TransactItems=oversized), "ValidationException")
    monkeypatch.setattr(DynamoDBBackend, "transact_write_items", transactions.transact_write_items)
    refused(lambda: dynamodb.transact_write_items(TransactItems=oversized), "ValidationException")
    assert "Item" not in dynamodb.get_item(TableName="t", Key={"pk": {"S": "big"}})


def test_binary_counts_by_its_bytes_not_its_base64():
    assert limits.attribute_value_bytes({"B": b"\x00" * 300}) == 300
    assert limits.item_bytes({"ab": {"S": "é"}}) == 2 + 2


def test_batch_get_item_takes_100_keys_not_101(dynamodb):
    keys = [{"pk": {"S": f"k{i}"}} for i in range(101)]
    refused(lambda: dynamodb.batch_get_item(RequestItems={"t": {"Keys": keys}}), "ValidationException")
    answer = dynamodb.batch_get_item(RequestItems={"t": {"Keys": keys[:100]}})
    assert answer["Responses"]["t"] == [] and not answer["UnprocessedKeys"]


def test_batch_get_item_answers_stop_at_16_mb_and_the_rest_is_unprocessed(dynamodb):
    # Given 45 items of 390 KB (17.5 MB in all)
    for start in range(0, 45, 5):
        dynamodb.transact_write_items(TransactItems=[
            {"Put": {"TableName": "t", "Item": item(f"k{i}", ITEM_FILL)}} for i in range(start, start + 5)])
    keys = [{"pk": {"S": f"k{i}"}} for i in range(45)]
    # When they are read in one BatchGetItem
    answer = dynamodb.batch_get_item(RequestItems={"t": {"Keys": keys}})
    # Then the answer holds at most 16 MB and the rest come back as UnprocessedKeys
    returned = answer["Responses"]["t"]
    unprocessed = answer["UnprocessedKeys"]["t"]["Keys"]
    assert sum(limits.item_bytes(found) for found in returned) <= 16 * 1024 * 1024
    assert returned and unprocessed
    assert {k["pk"]["S"] for k in unprocessed} | {f["pk"]["S"] for f in returned} == {f"k{i}" for i in range(45)}


# ---------------------------------------------------------------- SQS


def test_a_queue_without_maximum_message_size_takes_256_kib(sqs):
    client, url = sqs
    attributes = client.get_queue_attributes(QueueUrl=url, AttributeNames=["MaximumMessageSize"])["Attributes"]
    assert attributes["MaximumMessageSize"] == "262144"


def test_a_message_over_the_maximum_message_size_is_refused(sqs):
    client, url = sqs
    message = refused(lambda: client.send_message(QueueUrl=url, MessageBody="x" * 300 * KB),
                      "InvalidParameterValue")
    assert message == "One or more parameters are invalid. Reason: Message must be shorter than 262144 bytes."
    # Attributes count too
    refused(lambda: client.send_message(QueueUrl=url, MessageBody="x" * (256 * KB - 10), MessageAttributes={
        "kind": {"DataType": "String", "StringValue": "request"}}), "InvalidParameterValue")
    client.send_message(QueueUrl=url, MessageBody="x" * 256 * KB)
    assert client.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])[
        "Attributes"]["ApproximateNumberOfMessages"] == "1"


def test_a_batch_over_the_maximum_message_size_in_total_is_refused(sqs):
    client, url = sqs
    entries = [{"Id": str(i), "MessageBody": "x" * 100 * KB} for i in range(3)]  # 300 KB together
    message = refused(lambda: client.send_message_batch(QueueUrl=url, Entries=entries), "BatchRequestTooLong")
    assert message.startswith("Batch requests cannot be longer than 262144 bytes.")
    answer = client.send_message_batch(QueueUrl=url, Entries=[
        {"Id": str(i), "MessageBody": "x" * 64 * KB} for i in range(4)])  # exactly 256 KiB
    assert len(answer["Successful"]) == 4


def test_a_queue_with_a_bigger_maximum_message_size_takes_bigger_messages(aws):
    client = boto3.client("sqs")
    url = client.create_queue(QueueName="big", Attributes={"MaximumMessageSize": str(1024 * KB)})["QueueUrl"]
    client.send_message(QueueUrl=url, MessageBody="x" * 300 * KB)
    refused(lambda: client.send_message(QueueUrl=url, MessageBody="x" * (1024 * KB + 1)), "InvalidParameterValue")
