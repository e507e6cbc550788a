"""A faster TransactWriteItems for moto, installed by the local stack and the moto tests.

moto deep-copies every table a transaction touches, once per element, so that it can roll back:
a transaction costs O(table size), and on a table holding a few big batches each of the worker's
two transactions per request takes tens of milliseconds, which is not what DynamoDB does. This
version keeps DynamoDB's semantics (all conditions hold or nothing is written) by checking every
condition first, against the state before the transaction, and only then applying the writes;
it snapshots just the items it touches, for the rare write that still fails.
"""

from __future__ import annotations

import copy
from typing import Any

from moto.dynamodb.comparisons import get_filter_expression
from moto.dynamodb.exceptions import (
    ConditionalCheckFailed,
    MultipleTransactionsException,
    TooManyTransactionsException,
    TransactionCanceledException,
    TransactWriteSingleOpException,
)
from moto.dynamodb.models import DynamoDBBackend

_original = DynamoDBBackend.transact_write_items


def _key_of(backend: DynamoDBBackend, op_type: str, op: dict[str, Any]) -> dict[str, Any]:
    if op_type != "Put":
        return op["Key"]
    table = backend.get_table(op["TableName"])
    key = {table.hash_key_attr: op["Item"][table.hash_key_attr]}
    if table.range_key_attr is not None:
        key[table.range_key_attr] = op["Item"][table.range_key_attr]
    return key


def transact_write_items(self: DynamoDBBackend, transact_items: list[dict[str, Any]]) -> None:
    if len(transact_items) > 100:
        raise TooManyTransactionsException()
    planned: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    seen: set[tuple[str, str]] = set()
    errors: list[tuple[Any, Any, Any]] = []
    for item in transact_items:
        if len(item) > 1:
            raise TransactWriteSingleOpException
        op_type, op = next(iter(item.items()))
        if op_type not in {"ConditionCheck", "Put", "Delete", "Update"}:
            raise ValueError("Unsupported transaction operation")
        key = _key_of(self, op_type, op)
        identity = (str(op["TableName"]), str(dict(sorted(key.items()))))
        if identity in seen:
            raise MultipleTransactionsException()
        seen.add(identity)
        planned.append((op_type, op, key))
        condition = op.get("ConditionExpression")
        if condition is None:
            errors.append((None, None, None))
            continue
        current = self.get_item(op["TableName"], key)
        check = get_filter_expression(condition, op.get("ExpressionAttributeNames"),
                                      op.get("ExpressionAttributeValues"))
        if check.expr(current):
            errors.append((None, None, None))
        else:
            old = current.to_json()["Attributes"] if current and \
                op.get("ReturnValuesOnConditionCheckFailure") == "ALL_OLD" else None
            errors.append(("ConditionalCheckFailed", ConditionalCheckFailed().message, old))
    if any(code is not None for code, _, _ in errors):
        raise TransactionCanceledException(errors)

    snapshots = [(op["TableName"], key, copy.deepcopy(self.get_item(op["TableName"], key)))
                 for op_type, op, key in planned if op_type != "ConditionCheck"]
    try:
        for op_type, op, key in planned:
            names, values = op.get("ExpressionAttributeNames"), op.get("ExpressionAttributeValues")
            if op_type == "Put":
                self.put_item(op["TableName"], op["Item"], expression_attribute_names=names,
                              expression_attribute_values=values)
            elif op_type == "Delete":
                self.delete_item(op["TableName"], key, expression_attribute_names=names,
                                 expression_attribute_values=values)
            elif op_type == "Update":
                # The condition (already checked) is passed on only so that moto sees every name
                # and value used; it holds, as nothing else changed these items meanwhile.
                self.update_item(op["TableName"], key, update_expression=op["UpdateExpression"],
                                 condition_expression=op.get("ConditionExpression"),
                                 expression_attribute_names=names, expression_attribute_values=values)
    except Exception:
        for table_name, key, before in snapshots:
            if before is None:
                self.delete_item(table_name, key)
            else:
                self.put_item(table_name, before.to_json()["Attributes"])
        raise


def install() -> None:
    DynamoDBBackend.transact_write_items = transact_write_items  # type: ignore[method-assign]


def uninstall() -> None:
    DynamoDBBackend.transact_write_items = _original  # type: ignore[method-assign]
