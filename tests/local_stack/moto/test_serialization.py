"""The local stack's faster serialization of DynamoDB attribute values writes exactly what moto's
own serializer writes, for every attribute type and every read the service makes."""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal

import boto3
import pytest
from freeinference_batch_local.moto import serialization
from moto import mock_aws

from tests.local_stack.moto.tables import KEY, create_keyed_table

EVERY_TYPE = {
    "pk": {"S": "p"}, "sk": {"S": "s"},
    "text": {"S": "héllo"}, "empty_text": {"S": ""}, "number": {"N": "12.50"}, "big": {"N": "-123456789012345678"},
    "blob": {"B": b"\x00\x01compressed\xff"}, "empty_blob": {"B": b""},
    "strings": {"SS": ["a", "b"]}, "numbers": {"NS": ["1", "2.5"]}, "blobs": {"BS": [b"x", b"\x00y"]},
    "yes": {"BOOL": True}, "no": {"BOOL": False}, "nothing": {"NULL": True},
    "map": {"M": {"holder.1": {"N": "17.5"}, "inner": {"M": {"b": {"B": b"\xfe"}, "l": {"L": []}}}, "e": {"M": {}}}},
    "list": {"L": [{"S": "x"}, {"N": "1"}, {"L": [{"BOOL": False}, {"M": {"k": {"NULL": True}}}]}, {"B": b"z"}]},
}


def _calls(client) -> list[Callable[[], object]]:
    return [
        lambda: client.get_item(TableName="t", Key=KEY, ConsistentRead=True),
        lambda: client.get_item(TableName="t", Key=KEY, ProjectionExpression="#m.inner, #b, #l",
                                ExpressionAttributeNames={"#m": "map", "#b": "blob", "#l": "list"}),
        lambda: client.batch_get_item(RequestItems={"t": {"Keys": [KEY, {"pk": {"S": "none"}, "sk": {"S": "s"}}]}},
                                      ReturnConsumedCapacity="TOTAL"),
        lambda: client.query(TableName="t", KeyConditionExpression="pk = :p",
                             ExpressionAttributeValues={":p": {"S": "p"}}),
        lambda: client.scan(TableName="t"),
        lambda: client.transact_get_items(TransactItems=[{"Get": {"TableName": "t", "Key": KEY}}]),
        lambda: client.update_item(TableName="t", Key=KEY, UpdateExpression="ADD #n :one",
                                   ExpressionAttributeNames={"#n": "number"},
                                   ExpressionAttributeValues={":one": {"N": "1"}}, ReturnValues="ALL_NEW"),
        lambda: client.update_item(TableName="t", Key=KEY, UpdateExpression="REMOVE #n",
                                   ExpressionAttributeNames={"#n": "nothing"}, ReturnValues="ALL_OLD"),
    ]


def _bodies(installed: bool) -> list[dict]:
    if installed:
        serialization.install()
    try:
        with mock_aws():
            client = boto3.client("dynamodb", region_name="us-east-1")
            create_keyed_table(client)
            client.put_item(TableName="t", Item=EVERY_TYPE)
            raw: list[bytes] = []
            client.meta.events.register("after-call.dynamodb",
                                        lambda http_response, **_: raw.append(http_response.content))
            for call in _calls(client):
                call()
            return [json.loads(body, parse_float=Decimal) for body in raw]
    finally:
        serialization.uninstall()


def test_responses_are_the_same_byte_for_value_with_and_without_the_fast_path():
    moto_own, fast = _bodies(installed=False), _bodies(installed=True)
    assert len(fast) == len(_calls(None)) and all(fast)
    assert fast == moto_own


def test_binary_values_are_base64_on_the_wire():
    assert serialization.wire_attribute_value({"B": b"\x00\x01"}) == {"B": "AAE="}
    assert serialization.wire_attribute_value({"M": {"x": {"BS": [b"a"]}}}) == {"M": {"x": {"BS": ["YQ=="]}}}


@pytest.mark.parametrize("value", [{"S": ""}, {"L": []}, {"M": {}}, {"NULL": True}, {"BOOL": False}])
def test_empty_and_false_values_are_kept(value):
    assert serialization.wire_attribute_value(value) == value
