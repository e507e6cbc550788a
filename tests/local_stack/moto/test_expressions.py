"""The local stack's cache of moto's parsed update expressions changes no result."""

from __future__ import annotations

import pickle

import boto3
from freeinference_batch_local.moto import expressions
from moto import mock_aws
from moto.dynamodb.parsing.expressions import UpdateExpressionParser

from tests.local_stack.moto.tables import KEY, create_keyed_table

UPDATES = [
    ("SET #s = :v, n = :n ADD c :one", {":v": {"S": "running"}, ":n": {"N": "1"}, ":one": {"N": "1"}}),
    ("SET #s = :v, n = :n ADD c :one", {":v": {"S": "queued"}, ":n": {"N": "2"}, ":one": {"N": "5"}}),
    ("SET m.#s = :v REMOVE n", {":v": {"S": "x"}}),
    ("SET #s = :v, n = :n ADD c :one", {":v": {"S": "done"}, ":n": {"N": "3"}, ":one": {"N": "-2"}}),
]


def _results() -> list[dict]:
    with mock_aws():
        client = boto3.client("dynamodb", region_name="us-east-1")
        create_keyed_table(client)
        client.put_item(TableName="t", Item={**KEY, "m": {"M": {}}})
        return [client.update_item(TableName="t", Key=KEY, UpdateExpression=expression,
                                   ExpressionAttributeNames={"#s": "status"}, ExpressionAttributeValues=values,
                                   ReturnValues="ALL_NEW")["Attributes"]
                for expression, values in UPDATES]


def test_updates_give_the_same_items_with_and_without_the_cache():
    moto_own = _results()
    expressions.install()
    try:
        cached = _results()
    finally:
        expressions.uninstall()
    assert cached == moto_own
    assert cached[-1]["status"] == {"S": "done"} and cached[-1]["c"] == {"N": "4"}


def test_an_expression_is_parsed_once_and_its_tree_left_as_parsed():
    expressions.install()
    try:
        tree = UpdateExpressionParser.make(UPDATES[0][0])
        shown = pickle.dumps(tree)  # the whole tree, node by node
        _results()
        assert UpdateExpressionParser.make(UPDATES[0][0]) is tree
        assert pickle.dumps(tree) == shown  # moto's validator worked on copies
    finally:
        expressions.uninstall()
    assert UpdateExpressionParser.make(UPDATES[0][0]) is not UpdateExpressionParser.make(UPDATES[0][0])
