"""Webhook endpoints in the accounts table: the only module that knows their items.

| pk | sk | holds |
|---|---|---|
| `ACCOUNT#<id>` | `WEBHOOK#<endpoint id>` | url, name, event types, the secret's nonce (never the |
|  |  | secret: webhooks/signing.py), the previous nonce and until when it still signs, |
|  |  | `unreachable_until`; `deleted_at` and `ttl` once deleted |
|  |  | `last_test_at` and `test_token` (the last `/test`) |
| `ACCOUNT#<id>` | `WEBHOOKS` | `count`: the account's endpoints not deleted (at most `WEBHOOK_MAX_ENDPOINTS`); |
|  |  | `flight_<k>`: until when the account's delivery slot k is taken (`WEBHOOK_ACCOUNT_MAX_IN_FLIGHT`) |

A delete marks the item (and TTL removes it two days later) instead of deleting it: the roles
may not delete items one by one, and a delivery still queued reads the mark and stops. Every
change is a conditional write that also accepts its own earlier success when botocore re-sends
it after a lost answer: create and delete carry a token the item keeps, rotate the new nonce.
"""

from __future__ import annotations

import random
from typing import Any

from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict

from freeinference_batch.core import aws
from freeinference_batch.core.settings import Settings
from freeinference_batch.store.dynamo import (
    TransactionConflict,
    TransactionFailed,
    from_item,
    is_conditional_failure,
    key,
    query_all,
    to_item,
    transact,
    values,
)

DELETED_TTL_SECONDS = 2 * 86400


class EndpointRecord(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    id: str
    account_id: str
    url: str
    name: str
    event_types: list[str]
    created_at: int
    updated_at: int
    secret_nonce: str
    secret_hint: str
    previous_secret_nonce: str | None = None
    previous_secret_until: float | None = None
    unreachable_until: float | None = None
    write_token: str | None = None
    deleted_at: int | None = None


class TooManyEndpoints(Exception):
    """The account already has the most endpoints allowed."""


def _pk(account_id: str) -> str:
    return f"ACCOUNT#{account_id}"


def _key(account_id: str, endpoint_id: str) -> dict:
    return key(_pk(account_id), f"WEBHOOK#{endpoint_id}")


def _record(item: dict | None) -> EndpointRecord | None:
    plain = from_item(item)
    return EndpointRecord.model_validate(plain) if plain else None


class WebhookEndpoints:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.table = settings.accounts_table_name

    def get(self, account_id: str, endpoint_id: str) -> EndpointRecord | None:
        """The endpoint, deleted ones included (callers decide); a consistent read, so a delivery
        never misses a delete or a rotation that was answered."""
        answer = aws.dynamodb().get_item(TableName=self.table, Key=_key(account_id, endpoint_id), ConsistentRead=True)
        return _record(answer.get("Item"))

    def list(self, account_id: str) -> list[EndpointRecord]:
        """The account's endpoints not deleted, oldest first (ids begin with the creation time)."""
        items = query_all(TableName=self.table, KeyConditionExpression="pk = :pk AND begins_with(sk, :prefix)",
                          ExpressionAttributeValues=values(pk=_pk(account_id), prefix="WEBHOOK#"),
                          ConsistentRead=True)
        records = [EndpointRecord.model_validate(item) for item in items]  # query_all answers plain items
        return [r for r in records if r.deleted_at is None]

    def create(self, record: EndpointRecord, max_endpoints: int) -> None:
        """Store a new endpoint and count it, or TooManyEndpoints. `record.write_token` marks the
        write as this call's, so that a re-sent transaction that finds the item knows it was its own.
        TransactionConflict when other writes kept cancelling it (nothing was written)."""
        item = {**_key(record.account_id, record.id), **to_item(record.model_dump())}
        elements = [
            {"Put": {"TableName": self.table, "Item": item, "ConditionExpression": "attribute_not_exists(pk)"}},
            {"Update": {"TableName": self.table, "Key": key(_pk(record.account_id), "WEBHOOKS"),
                        "UpdateExpression": "ADD #count :one",
                        "ConditionExpression": "attribute_not_exists(#count) OR #count < :max",
                        "ExpressionAttributeNames": {"#count": "count"},
                        "ExpressionAttributeValues": values(one=1, max=max_endpoints)}},
        ]
        try:
            transact(elements)
        except TransactionFailed as failure:
            stored = self.get(record.account_id, record.id)
            if stored is not None and stored.write_token == record.write_token:
                return  # our own write, whose answer was lost
            if failure.failed(1):
                raise TooManyEndpoints from None
            raise  # a conflict (TransactionConflict): the caller says "busy, retry"

    def update(self, account_id: str, endpoint_id: str, fields: dict[str, Any], now: int) -> EndpointRecord | None:
        """Set `fields` on an endpoint not deleted; the new record, or None if there is none.
        (Re-sending the same values is harmless: the condition still holds.)"""
        names = {f"#f{i}": name for i, name in enumerate(fields)}
        clauses = [f"#f{i} = :f{i}" for i in range(len(fields))] + ["updated_at = :now"]
        named = {f"f{i}": value for i, value in enumerate(fields.values())}
        return self._update(account_id, endpoint_id, "SET " + ", ".join(clauses),
                            "attribute_exists(pk) AND attribute_not_exists(deleted_at)", names, now=now, **named)

    def rotate(self, account_id: str, endpoint_id: str, old_nonce: str, new_nonce: str, hint: str,
               previous_until: float | None, now: int) -> EndpointRecord | None:
        """Replace the secret's nonce if it is still `old_nonce`; the old one keeps signing until
        `previous_until` (None: not at all). None if the endpoint is gone or rotated meanwhile."""
        if previous_until is None:
            expression = ("SET secret_nonce = :new, secret_hint = :hint, updated_at = :now "
                          "REMOVE previous_secret_nonce, previous_secret_until")
            extra: dict[str, Any] = {}
        else:
            expression = ("SET previous_secret_nonce = secret_nonce, previous_secret_until = :until, "
                          "secret_nonce = :new, secret_hint = :hint, updated_at = :now")
            extra = {"until": previous_until}
        condition = "attribute_exists(pk) AND attribute_not_exists(deleted_at) AND secret_nonce = :old"
        updated = self._update(account_id, endpoint_id, expression, condition, None,
                               new=new_nonce, hint=hint, now=now, old=old_nonce, **extra)
        if updated is None:
            stored = self.get(account_id, endpoint_id)
            if stored is not None and stored.deleted_at is None and stored.secret_nonce == new_nonce:
                return stored  # our own rotation, whose answer was lost
        return updated

    def delete(self, account_id: str, endpoint_id: str, token: str, now: int) -> bool:
        """Mark the endpoint deleted and uncount it; False if there is none (not deleted).
        TransactionConflict when other writes kept cancelling it (the endpoint is still there)."""
        elements = [
            {"Update": {"TableName": self.table, "Key": _key(account_id, endpoint_id),
                        "UpdateExpression": "SET deleted_at = :now, #ttl = :ttl, write_token = :token",
                        "ConditionExpression": "attribute_exists(pk) AND attribute_not_exists(deleted_at)",
                        "ExpressionAttributeNames": {"#ttl": "ttl"},
                        "ExpressionAttributeValues": values(now=now, ttl=now + DELETED_TTL_SECONDS, token=token)}},
            {"Update": {"TableName": self.table, "Key": key(_pk(account_id), "WEBHOOKS"),
                        "UpdateExpression": "ADD #count :minus_one", "ExpressionAttributeNames": {"#count": "count"},
                        "ExpressionAttributeValues": values(minus_one=-1)}},
        ]
        try:
            transact(elements)
        except TransactionConflict:
            raise  # no condition failed: the endpoint may well be there still, not "not found"
        except TransactionFailed:
            stored = self.get(account_id, endpoint_id)
            return stored is not None and stored.write_token == token  # our own, whose answer was lost
        return True

    def mark_unreachable(self, account_id: str, endpoint_id: str, until: float) -> None:
        """Other deliveries to this endpoint wait until `until` instead of each finding out that it
        does not answer (a delete or a later success is not undone: only the time is set)."""
        self._update(account_id, endpoint_id, "SET unreachable_until = :until",
                     "attribute_exists(pk) AND attribute_not_exists(deleted_at)", None, until=until)

    def claim_test(self, account_id: str, endpoint_id: str, now: float, interval: float, token: str) -> float:
        """Take the endpoint's test delivery turn: 0 when taken, else the seconds until the next
        one may be. (A re-sent write whose first answer was lost finds its own token.)"""
        claimed = self._update(account_id, endpoint_id, "SET last_test_at = :now, test_token = :token",
                               "attribute_exists(pk) AND attribute_not_exists(deleted_at) AND "
                               "(attribute_not_exists(last_test_at) OR last_test_at <= :since)",
                               None, now=now, token=token, since=now - interval)
        if claimed is not None:
            return 0.0
        answer = aws.dynamodb().get_item(TableName=self.table, Key=_key(account_id, endpoint_id), ConsistentRead=True)
        item = from_item(answer.get("Item")) or {}
        if item.get("test_token") == token or "last_test_at" not in item:
            return 0.0  # ours, or gone meanwhile (the attempt finds out)
        return max(0.0, float(item["last_test_at"]) + interval - now)

    def claim_slot(self, account_id: str, slots: int, now: float, until: float) -> int | None:
        """Take one of the account's `slots` delivery slots until `until` (a conditional write on a
        slot free or expired, tried in a random order): its number, or None when all are taken.
        A lease, not a count: a crashed attempt's slot, or one whose answer was lost (its re-sent
        write finds it taken), frees itself at `until`."""
        for slot in random.sample(range(slots), slots):
            try:
                aws.dynamodb().update_item(
                    TableName=self.table, Key=key(_pk(account_id), "WEBHOOKS"),
                    UpdateExpression="SET #slot = :until",
                    ConditionExpression="attribute_not_exists(#slot) OR #slot <= :now",
                    ExpressionAttributeNames={"#slot": f"flight_{slot}"},
                    ExpressionAttributeValues=values(until=until, now=now))
            except ClientError as error:
                if is_conditional_failure(error):
                    continue
                raise
            return slot
        return None

    def release_slot(self, account_id: str, slot: int, until: float) -> None:
        """Free a slot this attempt took (`until` is its lease: another's is left alone)."""
        try:
            aws.dynamodb().update_item(
                TableName=self.table, Key=key(_pk(account_id), "WEBHOOKS"), UpdateExpression="SET #slot = :zero",
                ConditionExpression="#slot = :until", ExpressionAttributeNames={"#slot": f"flight_{slot}"},
                ExpressionAttributeValues=values(zero=0, until=until))
        except ClientError as error:
            if not is_conditional_failure(error):
                raise

    def _update(self, account_id: str, endpoint_id: str, expression: str, condition: str,
                names: dict[str, str] | None, **named: Any) -> EndpointRecord | None:
        request: dict[str, Any] = {
            "TableName": self.table, "Key": _key(account_id, endpoint_id), "UpdateExpression": expression,
            "ConditionExpression": condition, "ExpressionAttributeValues": values(**named), "ReturnValues": "ALL_NEW",
        }
        if names:
            request["ExpressionAttributeNames"] = names
        try:
            answer = aws.dynamodb().update_item(**request)
        except ClientError as error:
            if is_conditional_failure(error):
                return None
            raise
        return _record(answer.get("Attributes"))
