"""A table as the service's tables are keyed (`pk`, `sk`), for tests of the local stack's moto fixes."""

from __future__ import annotations

from typing import Any

KEY = {"pk": {"S": "p"}, "sk": {"S": "s"}}


def create_keyed_table(client: Any, name: str = "t") -> None:
    client.create_table(TableName=name, BillingMode="PAY_PER_REQUEST",
                        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"},
                                   {"AttributeName": "sk", "KeyType": "RANGE"}],
                        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                                              {"AttributeName": "sk", "AttributeType": "S"}])
