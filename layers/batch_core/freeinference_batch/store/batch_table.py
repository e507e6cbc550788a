"""Data access for the batch table and the payload bucket: the only code that knows their item
keys and shapes. `BatchTable` is the table's reads and writes, one module per kind of item.

Items of one batch share the partition `BATCH#<id>` (keys: batch_keys.py):

| sk | written | holds |
|---|---|---|
| `META` | create, then every state change | owner, status, timestamps, counters, cost (nano-USD), metadata |
| `IN#00000` | create (immutable) | a run of consecutive requests (`input_chunks.py`); S3 when too big |
| `LANE#<model>`, `LANEPOS#<model>` | create (immutable) | a lane: its model, size and width; its positions |
| `LANE#<model>#00003` | create, chain 3's runs | chain 3's head (the first request not counted), lease, runner |
| `REQ#000000042` | when a request first runs | status, attempts, last error, response (compressed; S3 when large) |

By kind of item: META's reads are here, its status changes `batch_status.py`'s and its counts
`runs.py`'s; `IN#` is `batch_inputs.py`'s, `LANE#` and `LANEPOS#` `lanes.py`'s, `REQ#`
`request_items.py`'s (a run's writes of it: `runs.py`); the bucket's objects are `objects.py`'s.

The mutable items stay small on purpose: DynamoDB bills an update by the size of the whole
item, so the big immutable parts live in items of their own, and each chain of a lane (up to
hundreds) moves its own item rather than an entry of a lane-wide list. Model ids hold no `#`
(catalog.py), so a chain's key names its lane unambiguously: `LANE#glm#00003` is of lane `glm`
whatever other models' ids begin with `glm`.

META is read as a `BatchRecord` (batch_record.py): every read of it answers one.
"""

from __future__ import annotations

import secrets
from typing import Any

from botocore.exceptions import ClientError

from freeinference_batch.core import aws
from freeinference_batch.core.settings import Settings
from freeinference_batch.store import objects
from freeinference_batch.store.batch_inputs import InputChunks
from freeinference_batch.store.batch_keys import (
    COUNTER_KEY,
    META,
    OPEN_SHARD,
    batch_id_of,
    batch_pk,
    created_key,
    meta_key,
    record_of,
)
from freeinference_batch.store.batch_record import BatchRecord
from freeinference_batch.store.dynamo import (
    batch_get,
    batch_write,
    from_item,
    is_conditional_failure,
    key,
    query_all,
    refused_item,
    to_attr,
    values,
)
from freeinference_batch.store.lanes import Lanes
from freeinference_batch.store.request_items import RequestItems


class BatchTable(InputChunks, Lanes, RequestItems):
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.name = settings.batch_table_name
        self.bucket = settings.payload_bucket_name

    # ---- create (META itself: batch_status.create) ---------------------------------------

    def reserve_result_ids(self, count: int) -> int:
        """One atomic counter update reserves `count` consecutive result numbers; returns the
        first. Result ids are unique across batches and `after` maps straight to a position.

        The update leaves a token of its own in `reserved_by` (the last reservation's), on the
        condition that the token there is not this call's: re-sent by botocore after its answer
        was lost, it is refused and finds its own block in the item the refusal answers, instead
        of reserving a second one. (Another create's reservation in between replaces the token:
        then the re-send reserves anew, leaving a gap in the numbers, never a duplicate.)"""
        token = secrets.token_hex(8)
        try:
            answer = aws.dynamodb().update_item(
                TableName=self.name,
                Key=COUNTER_KEY,
                UpdateExpression="ADD next_id :n SET reserved_by = :token",
                ConditionExpression="attribute_not_exists(reserved_by) OR reserved_by <> :token",
                ExpressionAttributeValues=values(n=count, token=token),
                ReturnValues="UPDATED_NEW",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
            last = int(answer["Attributes"]["next_id"]["N"])
        except ClientError as error:
            if not is_conditional_failure(error):
                raise
            found = refused_item(error) if "Item" in error.response else from_item(aws.dynamodb().get_item(
                TableName=self.name, Key=COUNTER_KEY, ConsistentRead=True).get("Item"))
            if (found or {}).get("reserved_by") != token:
                raise  # not this call's refusal: cannot happen (only a re-send carries its token)
            last = int(found["next_id"])  # type: ignore[index]
        return 1000 + last - count  # start at batch_req_1000: ids look like the spec's

    def put_items(self, items: list[dict]) -> None:
        batch_write(self.name, puts=items)

    def put_new_items(self, items: list[dict]) -> int:
        """Put each item only where none is (one conditional PutItem each, for the few items whose
        later changes a second writer must not undo: a lane's chains move their heads once they
        run); answers how many were new."""
        new = 0
        for item in items:
            try:
                aws.dynamodb().put_item(TableName=self.name, Item=item, ConditionExpression="attribute_not_exists(pk)")
                new += 1
            except ClientError as error:
                if not is_conditional_failure(error):
                    raise
        return new

    # ---- META ----------------------------------------------------------------------------

    def get_meta(self, batch_id: str, *, consistent: bool = True) -> BatchRecord | None:
        answer = aws.dynamodb().get_item(TableName=self.name, Key=meta_key(batch_id), ConsistentRead=consistent)
        return record_of(from_item(answer.get("Item")))

    def get_metas(self, batch_ids: list[str]) -> dict[str, BatchRecord]:
        if not batch_ids:
            return {}
        found = batch_get({self.name: {"Keys": [meta_key(b) for b in batch_ids], "ConsistentRead": True}})
        return {item["id"]: BatchRecord.model_validate(item) for item in found[self.name]}

    def list_owner(self, account_id: str, limit: int,
                   start_key: dict | None) -> tuple[list[BatchRecord], dict | None]:
        kwargs: dict[str, Any] = {
            "TableName": self.name,
            "IndexName": "owner-index",
            "KeyConditionExpression": "#owner = :owner",
            "ExpressionAttributeNames": {"#owner": "owner"},
            "ExpressionAttributeValues": values(owner=account_id),
            "ScanIndexForward": False,
            "Limit": limit,
        }
        if start_key:
            kwargs["ExclusiveStartKey"] = start_key
        answer = aws.dynamodb().query(**kwargs)
        # The index holds keys only: fetch the page's batch items, in the index's order.
        ids = [batch_id_of(from_item(i)) for i in answer.get("Items", [])]
        metas = self.get_metas(ids)
        return [metas[b] for b in ids if b in metas], answer.get("LastEvaluatedKey")

    @staticmethod
    def owner_index_start(account_id: str, batch_id: str) -> dict:
        """ExclusiveStartKey of the owner index at the place `batch_id` has (or had) in the list
        of `account_id`: built from the id alone, so it works after that batch was deleted or
        purged (DynamoDB, and moto, accept a start key whose item does not exist). The owner is
        always the caller's own account: another account's id only names a time."""
        return {"pk": to_attr(batch_pk(batch_id)), "sk": to_attr(META), "owner": to_attr(account_id),
                "created_key": to_attr(created_key(batch_id))}

    def due(self, index: str, shard: str, sort_attr: str, before: float) -> list[dict]:
        """Items of a sparse index whose sort attribute is <= `before` (expiry, purge)."""
        shard_attr = "open_shard" if index == "open-index" else "purge_shard"
        return list(query_all(
            TableName=self.name,
            IndexName=index,
            KeyConditionExpression=f"{shard_attr} = :shard AND {sort_attr} <= :before",
            ExpressionAttributeValues=values(shard=shard, before=before),
        ))

    def open_batches(self) -> list[dict]:
        return list(query_all(
            TableName=self.name, IndexName="open-index",
            KeyConditionExpression="open_shard = :shard", ExpressionAttributeValues=values(shard=OPEN_SHARD),
        ))

    # ---- purge ---------------------------------------------------------------------------

    def purge(self, batch_id: str, s3_keys: list[str] | None = None) -> int:
        """Delete every item and object of a batch; META last, so a crash mid-way is retried.
        `s3_keys`: the batch's objects when the caller knows them all (else they are listed)."""
        # Consistent: an item written in the last moments before the purge is deleted too.
        keys = [key(i["pk"], i["sk"]) for i in query_all(
            TableName=self.name, KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues=values(pk=batch_pk(batch_id)), ProjectionExpression="pk, sk",
            ConsistentRead=True,
        )]
        meta = meta_key(batch_id)
        others = [k for k in keys if k != meta]
        if s3_keys is None:
            objects.delete_prefix(self.bucket, f"{batch_id}/")
        elif s3_keys:
            objects.delete_keys(self.bucket, s3_keys)
        batch_write(self.name, deletes=others)
        batch_write(self.name, deletes=[meta] if meta in keys else [])
        return len(keys)

    def delete_responses(self, batch_id: str, seconds: float) -> bool:
        """Delete the batch's stored responses (only those too big for an item are in S3), so the
        presigned links to them stop working, bounded by `seconds`: False when objects may be
        left, which the purge deletes (the batch is already deleted, so no new link to them is
        given). A failed delete raises: the batch is deleted, the purge retries them."""
        return objects.delete_prefix_within(self.bucket, f"{batch_id}/responses/", seconds)
