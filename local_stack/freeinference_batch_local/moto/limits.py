"""DynamoDB's and SQS's limits that moto does not enforce, installed by the local stack and the tests.

moto 5.2.5 already refuses items over 400 KB (PutItem, UpdateItem, and so the transactions that
write through them), BatchGetItem over 100 keys, and stops a BatchGetItem answer at 16 MB with
the rest in `UnprocessedKeys`. It accepts what AWS refuses:

- an empty attribute name or map key: `ValidationException`;
- BatchWriteItem with more than 25 requests: `ValidationException` "Too many items requested
  for the BatchWriteItem call";
- TransactWriteItems whose items add up to more than 4 MB: `ValidationException` "Transaction
  request cannot be larger than 4 MB";
- SendMessage over the queue's `MaximumMessageSize`: `InvalidParameterValue` "One or more
  parameters are invalid. Reason: Message must be shorter than N bytes.";
- SendMessageBatch whose messages add up to more than that: `BatchRequestTooLong` "Batch
  requests cannot be longer than N bytes. You have sent M bytes."

A queue created without `MaximumMessageSize` gets 262,144 bytes (256 KiB), the default the
design and SDK documentation give; moto 5.2.5 defaults to 1 MiB, the highest value SQS allows
since 2025. A message that fits 256 KiB fits either way.

The checks sit on moto's request handlers (`DynamoHandler`, `SQSBackend`), before any write, so
they hold whichever TransactWriteItems implementation runs (moto's or `transactions.py`').
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterable
from typing import Any

from moto.dynamodb.exceptions import MockValidationException
from moto.dynamodb.responses import DynamoHandler
from moto.sqs.exceptions import BatchRequestTooLong, InvalidParameterValue
from moto.sqs.models import SQSBackend

BATCH_WRITE_MAX_REQUESTS = 25
TRANSACTION_MAX_BYTES = 4 * 1024 * 1024
SQS_DEFAULT_MAXIMUM_MESSAGE_SIZE = 256 * 1024

# DynamoDB's own texts where they are known. AWS's text for an empty map key could not be found;
# this one is in DynamoDB's wording for invalid values (the error code is what clients act on).
_EMPTY_NAME = "One or more parameter values were invalid: An attribute name or map key cannot be empty"
_TOO_MANY_WRITES = "Too many items requested for the BatchWriteItem call"
_TRANSACTION_TOO_LARGE = "Transaction request cannot be larger than 4 MB"

_originals: dict[tuple[type, str], Any] = {}


# ---------------------------------------------------------------- DynamoDB


def attribute_value_bytes(value: dict[str, Any]) -> int:
    """An attribute value's size as DynamoDB counts it (binary by its bytes, not its base64)."""
    kind, content = next(iter(value.items()))
    if kind == "S":
        return len(content.encode("utf-8"))
    if kind == "N":
        return len(str(content).lstrip("-").replace(".", "")) // 2 + 1
    if kind == "B":
        return len(_binary(content))
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(item.encode("utf-8")) for item in content)
    if kind == "NS":
        return sum(attribute_value_bytes({"N": item}) for item in content)
    if kind == "BS":
        return sum(len(_binary(item)) for item in content)
    if kind == "L":
        return 3 + sum(1 + attribute_value_bytes(item) for item in content)
    if kind == "M":
        return 3 + sum(1 + len(name.encode("utf-8")) + attribute_value_bytes(item) for name, item in content.items())
    return 0


def item_bytes(attributes: dict[str, Any]) -> int:
    """An item's (or a key's, or a set of values') size: names plus values."""
    return sum(len(name.encode("utf-8")) + attribute_value_bytes(value) for name, value in attributes.items())


def _binary(content: Any) -> bytes:
    if isinstance(content, bytes):
        return content
    try:
        return base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError):
        return str(content).encode("utf-8")


def _refuse_empty_names(attributes: dict[str, Any] | None) -> None:
    """Refuse an empty attribute name, at the top or as a key of a map at any depth."""
    pending: list[Any] = [attributes or {}]
    while pending:
        named = pending.pop()
        for name, value in named.items():
            if name == "":
                raise MockValidationException(_EMPTY_NAME)
            pending.extend(_maps_within(value))


def _maps_within(value: Any) -> Iterable[dict[str, Any]]:
    if not isinstance(value, dict):
        return []
    if isinstance(value.get("M"), dict):
        return [value["M"]]
    if isinstance(value.get("L"), list):
        return [{"list item": item} for item in value["L"]]
    return []


def _written_bytes(operation: str, request: dict[str, Any]) -> int:
    """What one element of a transaction writes: a Put's item, an Update's key and values."""
    if operation == "Put":
        return item_bytes(request["Item"])
    return item_bytes(request.get("Key") or {}) + item_bytes(request.get("ExpressionAttributeValues") or {})


def _put_item(self: DynamoHandler) -> Any:
    _refuse_empty_names(self.body.get("Item"))
    _refuse_empty_names(self.body.get("ExpressionAttributeValues"))
    return _original(DynamoHandler, "put_item")(self)


def _update_item(self: DynamoHandler) -> Any:
    _refuse_empty_names(self.body.get("ExpressionAttributeValues"))
    return _original(DynamoHandler, "update_item")(self)


def _batch_write_item(self: DynamoHandler) -> Any:
    requests = [request for table_requests in self.body["RequestItems"].values() for request in table_requests]
    if len(requests) > BATCH_WRITE_MAX_REQUESTS:
        raise MockValidationException(_TOO_MANY_WRITES)
    for request in requests:
        _refuse_empty_names((request.get("PutRequest") or {}).get("Item"))
    return _original(DynamoHandler, "batch_write_item")(self)


def _transact_write_items(self: DynamoHandler) -> Any:
    total = 0
    for element in self.body["TransactItems"]:
        for operation, request in element.items():
            _refuse_empty_names(request.get("Item"))
            _refuse_empty_names(request.get("ExpressionAttributeValues"))
            total += _written_bytes(operation, request)
    if total > TRANSACTION_MAX_BYTES:
        raise MockValidationException(_TRANSACTION_TOO_LARGE)
    return _original(DynamoHandler, "transact_write_items")(self)


# ---------------------------------------------------------------- SQS


def message_bytes(body: str, attributes: dict[str, Any] | None) -> int:
    """A message's size as SQS counts it against MaximumMessageSize: its body and its attributes
    (each one's name, data type and value)."""
    size = len(body.encode("utf-8"))
    for name, attribute in (attributes or {}).items():
        size += len(name.encode("utf-8")) + len(str(attribute.get("DataType", "")).encode("utf-8"))
        for field in ("StringValue", "BinaryValue"):
            value = attribute.get(field)
            if value is not None:
                size += len(value) if isinstance(value, bytes) else len(str(value).encode("utf-8"))
    return size


def _maximum_message_size(backend: SQSBackend, queue_name: str) -> int:
    return int(backend.get_queue(queue_name).maximum_message_size)  # type: ignore[attr-defined]


def _create_queue(self: SQSBackend, name: str, tags: dict[str, str] | None = None, **kwargs: Any) -> Any:
    kwargs.setdefault("MaximumMessageSize", SQS_DEFAULT_MAXIMUM_MESSAGE_SIZE)
    return _original(SQSBackend, "create_queue")(self, name, tags, **kwargs)


def _send_message(self: SQSBackend, queue_name: str, message_body: str, *args: Any, **kwargs: Any) -> Any:
    limit = _maximum_message_size(self, queue_name)
    attributes = kwargs.get("message_attributes") if "message_attributes" in kwargs else (args[0] if args else None)
    if message_bytes(message_body, attributes) > limit:
        raise InvalidParameterValue(
            f"One or more parameters are invalid. Reason: Message must be shorter than {limit} bytes."
        )
    return _original(SQSBackend, "send_message")(self, queue_name, message_body, *args, **kwargs)


def _send_message_batch(self: SQSBackend, queue_name: str, entries: dict[str, dict[str, Any]]) -> Any:
    limit = _maximum_message_size(self, queue_name)
    total = sum(message_bytes(entry["MessageBody"], entry.get("MessageAttributes")) for entry in entries.values())
    if total > limit:
        error = BatchRequestTooLong(total)
        # moto's text names its own 1 MiB; SQS names the limit that applied.
        error.message = f"Batch requests cannot be longer than {limit} bytes. You have sent {total} bytes."
        raise error
    return _original(SQSBackend, "send_message_batch")(self, queue_name, entries)


# ---------------------------------------------------------------- install


_PATCHES: dict[tuple[type, str], Callable[..., Any]] = {
    (DynamoHandler, "put_item"): _put_item,
    (DynamoHandler, "update_item"): _update_item,
    (DynamoHandler, "batch_write_item"): _batch_write_item,
    (DynamoHandler, "transact_write_items"): _transact_write_items,
    (SQSBackend, "create_queue"): _create_queue,
    (SQSBackend, "send_message"): _send_message,
    (SQSBackend, "send_message_batch"): _send_message_batch,
}


def _original(owner: type, name: str) -> Callable[..., Any]:
    return _originals.get((owner, name)) or getattr(owner, name)


def install() -> None:
    """Patch moto's handlers (idempotent)."""
    for (owner, name), patched in _PATCHES.items():
        if (owner, name) not in _originals:
            _originals[(owner, name)] = getattr(owner, name)
            setattr(owner, name, patched)


def uninstall() -> None:
    for (owner, name), original in list(_originals.items()):
        setattr(owner, name, original)
        del _originals[(owner, name)]
