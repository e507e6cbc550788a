"""The local stack's TransactWriteItems keeps DynamoDB's all-or-nothing semantics."""

from __future__ import annotations

import boto3
import pytest
from botocore.exceptions import ClientError
from freeinference_batch_local.moto import transactions
from moto import mock_aws
from moto.dynamodb.models import DynamoDBBackend


@pytest.fixture
def table(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setattr(DynamoDBBackend, "transact_write_items", transactions.transact_write_items)
    with mock_aws():
        client = boto3.client("dynamodb")
        client.create_table(TableName="t", KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
                            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                            BillingMode="PAY_PER_REQUEST")
        client.put_item(TableName="t", Item={"pk": {"S": "a"}, "n": {"N": "1"}})
        yield client


def add(pk: str, condition: str | None = None) -> dict:
    update = {"TableName": "t", "Key": {"pk": {"S": pk}}, "UpdateExpression": "ADD n :one",
              "ExpressionAttributeValues": {":one": {"N": "1"}}}
    if condition:
        update["ConditionExpression"] = condition
    return {"Update": update}


def n(client, pk: str) -> int | None:
    item = client.get_item(TableName="t", Key={"pk": {"S": pk}}).get("Item")
    return int(item["n"]["N"]) if item else None


def test_all_conditions_hold_every_write_applies(table):
    table.transact_write_items(TransactItems=[add("a", "n = :one"), add("b", "attribute_not_exists(pk)")])
    assert (n(table, "a"), n(table, "b")) == (2, 1)


def test_one_failed_condition_writes_nothing_and_says_which(table):
    with pytest.raises(ClientError) as raised:
        table.transact_write_items(TransactItems=[add("b"), add("a", "n > :one")])
    codes = [r["Code"] for r in raised.value.response["CancellationReasons"]]
    assert codes == ["None", "ConditionalCheckFailed"]
    assert (n(table, "a"), n(table, "b")) == (1, None)


def test_two_writes_to_one_item_are_refused(table):
    with pytest.raises(ClientError):
        table.transact_write_items(TransactItems=[add("a"), add("a")])
    assert n(table, "a") == 1
