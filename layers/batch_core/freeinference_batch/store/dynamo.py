"""Small helpers over the low-level DynamoDB client, shared by every table module."""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Iterator
from decimal import Decimal
from enum import StrEnum
from typing import Any

from boto3.dynamodb.types import Binary, TypeDeserializer, TypeSerializer
from botocore.exceptions import ClientError

from freeinference_batch.core import aws

_serializer = TypeSerializer()
_deserializer = TypeDeserializer()


def _decimals(value: Any) -> Any:
    """DynamoDB numbers are Decimals; JSON from users and models has floats anywhere. Enum members
    (the statuses) go in as the plain strings they are equal to."""
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, StrEnum):
        return str(value)
    if isinstance(value, dict):
        return {k: _decimals(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_decimals(v) for v in value]
    return value


def to_attr(value: Any) -> dict:
    return _serializer.serialize(_decimals(value))


def to_item(values: dict[str, Any]) -> dict[str, dict]:
    return {name: to_attr(value) for name, value in values.items() if value is not None}


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, set):
        return {_plain(v) for v in value}
    if isinstance(value, Binary):
        return bytes(value.value)
    return value


def from_item(item: dict[str, dict] | None) -> dict[str, Any] | None:
    if item is None:
        return None
    return {name: _plain(_deserializer.deserialize(value)) for name, value in item.items()}


def values(**named: Any) -> dict[str, dict]:
    """ExpressionAttributeValues from keyword arguments: values(now=1) -> {':now': {'N': '1'}}."""
    return {f":{name}": to_attr(value) for name, value in named.items()}


def key(pk: str, sk: str) -> dict[str, dict]:
    return {"pk": {"S": pk}, "sk": {"S": sk}}


def error_code(error: ClientError) -> str:
    return error.response.get("Error", {}).get("Code", "")


def is_conditional_failure(error: ClientError) -> bool:
    return error_code(error) == "ConditionalCheckFailedException"


def refused_item(error: ClientError) -> dict | None:
    """The item as a conditional write that asked for it (ReturnValuesOnConditionCheckFailure
    ALL_OLD) found it when refused; None if the answer carries none."""
    return from_item(error.response.get("Item"))


def cancellation_codes(error: ClientError) -> list[str]:
    """For a cancelled transaction, the reason code of each element ('None' where it passed)."""
    reasons = error.response.get("CancellationReasons") or []
    return [reason.get("Code") or "None" for reason in reasons]


class TransactionFailed(Exception):
    """A transaction was cancelled by a condition; `codes` has one reason per element."""

    def __init__(self, codes: list[str]) -> None:
        super().__init__(f"transaction cancelled: {codes}")
        self.codes = codes

    def failed(self, index: int) -> bool:
        return index < len(self.codes) and self.codes[index] == "ConditionalCheckFailed"


class TransactionConflict(TransactionFailed):
    """A transaction still cancelled by conflicts with other transactions (or throttling) after
    `transact`'s retries: no condition failed, so trying again later may succeed. A subclass,
    so callers that only know TransactionFailed keep treating it as a failed transaction."""


def transact(elements: list[dict], *, attempts: int = 6) -> None:
    """TransactWriteItems, retrying transaction conflicts (another transaction on the same item,
    which DynamoDB reports instead of waiting). Condition failures raise TransactionFailed;
    conflicts that outlast the retries raise TransactionConflict."""
    for attempt in range(attempts):
        try:
            aws.dynamodb().transact_write_items(TransactItems=elements)
            return
        except ClientError as error:
            if error_code(error) != "TransactionCanceledException":
                raise
            codes = cancellation_codes(error)
            if "ConditionalCheckFailed" in codes:
                raise TransactionFailed(codes) from error
            if attempt == attempts - 1:
                raise TransactionConflict(codes) from error
            # Only conflicts/throttling: back off with jitter and try again.
            time.sleep(random.uniform(0, 0.02 * 2**attempt))


def update_element(table: str, item_key: dict, expression: str, condition: str | None = None,
                   names: dict | None = None, **named: Any) -> dict:
    """A transaction `Update` element of one item (`apply_update` writes one alone); `named` are
    its ExpressionAttributeValues by name, `names` its ExpressionAttributeNames."""
    element: dict[str, Any] = {"TableName": table, "Key": item_key, "UpdateExpression": expression}
    if condition:
        element["ConditionExpression"] = condition
    if named:
        element["ExpressionAttributeValues"] = values(**named)
    if names:
        element["ExpressionAttributeNames"] = names
    return {"Update": element}


def update_returning(table: str, item_key: dict, expression: str, condition: str, names: dict | None = None,
                     **named: Any) -> dict[str, Any] | None:
    """A conditional UpdateItem alone: the item as it left it (ALL_NEW), or None when the
    condition did not hold."""
    arguments = {**update_element(table, item_key, expression, condition, names, **named)["Update"],
                 "ReturnValues": "ALL_NEW"}
    try:
        return from_item(aws.dynamodb().update_item(**arguments)["Attributes"])
    except ClientError as error:
        if is_conditional_failure(error):
            return None
        raise


def apply_update(element: dict) -> bool:
    """One transaction `Update` element, written alone (a plain UpdateItem, half a transaction's
    write units); False when its condition does not hold."""
    try:
        aws.dynamodb().update_item(**element["Update"])
        return True
    except ClientError as error:
        if is_conditional_failure(error):
            return False
        raise


def get_written_once(table: str, item_key: dict) -> dict[str, Any] | None:
    """An item that was written once and never changes: an eventually consistent read (half the
    read units) is the item itself, or nothing when it is younger than the replica's lag (a
    worker reads a chunk a moment after create): only then is it read again, consistently."""
    answer = aws.dynamodb().get_item(TableName=table, Key=item_key)
    if "Item" not in answer:
        answer = aws.dynamodb().get_item(TableName=table, Key=item_key, ConsistentRead=True)
    return from_item(answer.get("Item"))


def batch_write(table: str, puts: Iterable[dict] = (), deletes: Iterable[dict] = ()) -> None:
    """BatchWriteItem in runs of 25, re-sending whatever DynamoDB leaves unprocessed."""
    requests = [{"PutRequest": {"Item": item}} for item in puts]
    requests += [{"DeleteRequest": {"Key": k}} for k in deletes]
    for start in range(0, len(requests), 25):
        pending = {table: requests[start : start + 25]}
        for attempt in range(10):
            answer = aws.dynamodb().batch_write_item(RequestItems=pending)
            pending = answer.get("UnprocessedItems") or {}
            if not pending:
                break
            time.sleep(min(1.0, 0.02 * 2**attempt))
        else:
            raise RuntimeError("DynamoDB left items unprocessed after 10 tries")


# BatchGetItem takes at most 100 keys per request, counted over all its tables.
BATCH_GET_MAX_KEYS = 100


def batch_get(requests: dict[str, dict]) -> dict[str, list[dict]]:
    """BatchGetItem for any number of keys: requests of at most 100 keys (over all tables),
    each re-asking for the keys DynamoDB leaves unprocessed (throttling, or an answer that would
    pass 16 MB); answers deserialized items per table."""
    found: dict[str, list[dict]] = {table: [] for table in requests}
    keys = [(table, k) for table, spec in requests.items() for k in spec["Keys"]]
    options = {table: {n: v for n, v in spec.items() if n != "Keys"} for table, spec in requests.items()}
    for start in range(0, len(keys), BATCH_GET_MAX_KEYS):
        pending: dict[str, dict] = {}
        for table, k in keys[start : start + BATCH_GET_MAX_KEYS]:
            pending.setdefault(table, {**options[table], "Keys": []})["Keys"].append(k)
        idle = 0
        while pending:
            answer = aws.dynamodb().batch_get_item(RequestItems=pending)
            got = 0
            for table, items in answer.get("Responses", {}).items():
                found[table].extend(from_item(item) for item in items)
                got += len(items)
            pending = answer.get("UnprocessedKeys") or {}
            # Partial answers (the 16 MB cap) make progress; give up only when none is made.
            idle = 0 if got else idle + 1
            if pending and idle >= 10:
                raise RuntimeError("DynamoDB left keys unprocessed after 10 tries")
            if pending and not got:
                time.sleep(min(1.0, 0.02 * 2**idle))
    return found


def query_all(**kwargs: Any) -> Iterator[dict]:
    """Every item of a Query, following LastEvaluatedKey."""
    while True:
        answer = aws.dynamodb().query(**kwargs)
        for item in answer.get("Items", []):
            yield from_item(item)
        last = answer.get("LastEvaluatedKey")
        if not last:
            return
        kwargs["ExclusiveStartKey"] = last
