"""Concurrency slots as leases, kept in the accounts table beside what the interactive gateway
writes: `MODEL#<id>/SLOTS` (the model's batch slots) and `ACCOUNT#<id>/SLOTS` (the account's
concurrent-request slots, shared with its interactive traffic).

A slot is an entry `holder -> expiry` in the item's `leases` map; taking one is a conditional
write on the map's size, so it can sit inside the claim transaction. A worker that dies leaves
an entry that simply expires: whoever next finds the slots full reaps expired entries.
"""

from __future__ import annotations

from botocore.exceptions import ClientError

from freeinference_batch import aws
from freeinference_batch.settings import Settings
from freeinference_batch.store.dynamo import from_item, is_conditional_failure, key, values


def model_slots_key(model: str) -> dict:
    return key(f"MODEL#{model}", "SLOTS")


def account_slots_key(account_id: str) -> dict:
    return key(f"ACCOUNT#{account_id}", "SLOTS")


def model_load_key(model: str) -> dict:
    return key(f"MODEL#{model}", "LOAD")


class Leases:
    def __init__(self, settings: Settings) -> None:
        self.table = settings.accounts_table_name

    def acquire_element(self, slots_key: dict, holder: str, capacity: int, until: float) -> dict:
        return {"Update": {
            "TableName": self.table, "Key": slots_key,
            "UpdateExpression": "SET leases.#holder = :until",
            "ConditionExpression": "attribute_exists(leases) AND size(leases) < :capacity",
            "ExpressionAttributeNames": {"#holder": holder},
            "ExpressionAttributeValues": values(until=until, capacity=capacity),
        }}

    def release_element(self, slots_key: dict, holder: str) -> dict:
        return {"Update": {
            "TableName": self.table, "Key": slots_key,
            "UpdateExpression": "REMOVE leases.#holder",
            "ExpressionAttributeNames": {"#holder": holder},
        }}

    def release(self, slots_key: dict, holder: str) -> None:
        aws.dynamodb().update_item(**self.release_element(slots_key, holder)["Update"])

    def reap(self, slots_key: dict, now: float) -> int:
        """Make sure the slots item exists and drop expired leases; returns how many were freed."""
        answer = aws.dynamodb().get_item(TableName=self.table, Key=slots_key, ConsistentRead=True)
        item = from_item(answer.get("Item"))
        if item is None or "leases" not in item:
            try:
                aws.dynamodb().update_item(
                    TableName=self.table, Key=slots_key, UpdateExpression="SET leases = :empty",
                    ConditionExpression="attribute_not_exists(leases)", ExpressionAttributeValues=values(empty={}),
                )
            except ClientError as error:
                if not is_conditional_failure(error):
                    raise
            return 1
        freed = 0
        for holder, until in item["leases"].items():
            if until > now:
                continue
            try:
                aws.dynamodb().update_item(
                    TableName=self.table, Key=slots_key, UpdateExpression="REMOVE leases.#holder",
                    ConditionExpression="leases.#holder = :until",
                    ExpressionAttributeNames={"#holder": holder}, ExpressionAttributeValues=values(until=until),
                )
                freed += 1
            except ClientError as error:
                if not is_conditional_failure(error):
                    raise
        return freed

    def holders(self, slots_key: dict) -> dict[str, float]:
        answer = aws.dynamodb().get_item(TableName=self.table, Key=slots_key, ConsistentRead=True)
        item = from_item(answer.get("Item")) or {}
        return item.get("leases", {})
