"""Data access for the batch table and the payload bucket: the only module that knows their
item keys and shapes.

Items of one batch share the partition `BATCH#<id>`:

| sk | written | holds |
|---|---|---|
| `META` | create, then every state change | owner, status, timestamps, counters, cost (nano-USD), metadata |
| `IN#00000` | create (immutable) | a run of consecutive requests (`input_chunks.py`); S3 when too big |
| `LANE#<model>` | create (immutable) | the lane's model, size (requests) and width (chains) |
| `LANE#<model>#00003` | create, chain 3's runs | chain 3's head (the first request not counted), lease, runner |
| `LANEPOS#<model>` | create (immutable) | the lane's request positions, delta-encoded and compressed |
| `REQ#000000042` | when a request first runs | status, attempts, last error, response (compressed; S3 when large) |

The mutable items stay small on purpose: DynamoDB bills an update by the size of the whole
item, so the big immutable parts live in items of their own, and each chain of a lane (up to
hundreds) moves its own item rather than an entry of a lane-wide list. Model ids hold no `#`
(catalog.py), so a chain's key names its lane unambiguously: `LANE#glm#00003` is of lane `glm`
whatever other models' ids begin with `glm`.

META is read as a `BatchRecord` (batch_record.py): every read of it answers one.
"""

from __future__ import annotations

import array
import gzip
import json
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from botocore.exceptions import ClientError

from freeinference_batch.core import aws
from freeinference_batch.core.settings import Settings
from freeinference_batch.store import input_chunks
from freeinference_batch.store.batch_record import BatchRecord
from freeinference_batch.store.dynamo import (
    apply_update,
    batch_get,
    batch_write,
    from_item,
    is_conditional_failure,
    key,
    query_all,
    to_attr,
    to_item,
    values,
)

META = "META"
OPEN_SHARD = "OPEN"
PURGE_SHARD = "PURGE"
COUNTER_KEY = key("COUNTER", "RESULT_IDS")
# Responses whose JSON is larger than this go to S3 (DynamoDB items stop at 400 KB). Smaller ones
# are stored compressed in the request's item, so none of those can outgrow a results page alone.
INLINE_RESPONSE_LIMIT = 300_000
# How long a presigned URL of a stored response is valid.
RESPONSE_URL_SECONDS = 3600
# S3 lists and deletes at most 1,000 keys a call; a delete's pages go out this many at once.
S3_KEYS_PER_CALL = 1000
DELETE_THREADS = 8


def batch_pk(batch_id: str) -> str:
    return f"BATCH#{batch_id}"


def created_key(batch_id: str) -> str:
    """The owner index's sort key, derived from the id alone: ids begin with the creation time
    in microseconds (14 hex digits), so a list cursor needs no stored item."""
    micros = int(batch_id[6:20], 16)
    return f"{micros:017d}#{batch_id}"


def batch_id_of(item: dict) -> str:
    """The batch id of any item of a batch (index queries answer keys only)."""
    return item["pk"].removeprefix("BATCH#")


def meta_key(batch_id: str) -> dict:
    return key(batch_pk(batch_id), META)


def record_of(item: dict[str, Any] | None) -> BatchRecord | None:
    """The batch record of a META item as `from_item` gives it (None for no item)."""
    return None if item is None else BatchRecord.model_validate(item)


def chunk_sk(number: int) -> str:
    return f"IN#{number:05d}"


def request_key(batch_id: str, position: int) -> dict:
    return key(batch_pk(batch_id), f"REQ#{position:09d}")


def lane_sk(model: str) -> str:
    return f"LANE#{model}"


def chain_sk(model: str, chain: int) -> str:
    return f"{lane_sk(model)}#{chain:05d}"


def chain_key(batch_id: str, model: str, chain: int) -> dict:
    return key(batch_pk(batch_id), chain_sk(model, chain))


def encode_positions(positions: list[int]) -> bytes:
    """Positions ascend, so their gaps are small numbers that compress to almost nothing."""
    gaps = array.array("I", (b - a for a, b in zip([-1, *positions[:-1]], positions, strict=True)))
    return zlib.compress(gaps.tobytes(), 6)


def decode_positions(blob: bytes) -> list[int]:
    gaps = array.array("I")
    gaps.frombytes(zlib.decompress(blob))
    out, last = [], -1
    for gap in gaps:
        last += gap
        out.append(last)
    return out


class _LruCache:
    """Immutable items (input chunks, lane positions) read by warm workers again and again, up to
    a total weight (`weigh` of each value; by default each counts one)."""

    def __init__(self, size: int, weigh: Callable[[Any], int] = lambda _: 1) -> None:
        self._size = size
        self._weigh = weigh
        self._weight = 0
        self._items: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, name: Any) -> Any:
        with self._lock:
            if name in self._items:
                self._items.move_to_end(name)
                return self._items[name]
        return None

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._weight = 0

    def put(self, name: Any, value: Any) -> None:
        weight = self._weigh(value)
        if weight > self._size:
            return  # bigger than the whole cache: keeping it would evict everything else
        with self._lock:
            if name in self._items:
                self._weight -= self._weigh(self._items.pop(name))
            self._items[name] = value
            self._weight += weight
            while self._weight > self._size:
                _, evicted = self._items.popitem(last=False)
                self._weight -= self._weigh(evicted)


# Chunks are weighed by their bodies' bytes, so a worker's cache stays small beside its 256 MB
# whatever the batches hold (one chunk may be a single 32 MiB request: too big to keep). The
# worker's memory budget counts it (worker/memory.py).
CHUNK_CACHE_BYTES = 16 * 1024 * 1024
_chunks = _LruCache(CHUNK_CACHE_BYTES, weigh=lambda run: run.size)
_lane_positions = _LruCache(256)


class BatchTable:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.name = settings.batch_table_name
        self.bucket = settings.payload_bucket_name

    # ---- create -------------------------------------------------------------------------

    def reserve_result_ids(self, count: int) -> int:
        """One atomic counter update reserves `count` consecutive result numbers; returns the
        first. Result ids are unique across batches and `after` maps straight to a position."""
        answer = aws.dynamodb().update_item(
            TableName=self.name,
            Key=COUNTER_KEY,
            UpdateExpression="ADD next_id :n",
            ExpressionAttributeValues=values(n=count),
            ReturnValues="UPDATED_NEW",
        )
        last = int(answer["Attributes"]["next_id"]["N"])
        return 1000 + last - count  # start at batch_req_1000: ids look like the spec's

    def chunk_item(self, batch_id: str, number: int, packed: bytes, ttl: int) -> dict:
        return to_item({"pk": batch_pk(batch_id), "sk": chunk_sk(number), "data": packed, "ttl": ttl})

    def chunk_item_in_s3(self, batch_id: str, number: int, packed: bytes, ttl: int) -> dict:
        s3_key = f"{batch_id}/input/{number:05d}.json.z"
        aws.s3().put_object(Bucket=self.bucket, Key=s3_key, Body=packed)
        return to_item({"pk": batch_pk(batch_id), "sk": chunk_sk(number), "s3_key": s3_key, "ttl": ttl})

    def lane_items(self, batch_id: str, model: str, positions: list[int], width: int, lease_until: float,
                   ttl: int) -> list[dict]:
        """The lane's items: its positions, itself, and one item per chain, chain k at head k."""
        pk = batch_pk(batch_id)
        return [
            to_item({"pk": pk, "sk": f"LANEPOS#{model}", "positions": encode_positions(positions), "ttl": ttl}),
            to_item({"pk": pk, "sk": lane_sk(model), "model": model, "size": len(positions), "width": width,
                     "ttl": ttl}),
            *(to_item({"pk": pk, "sk": chain_sk(model, chain), "head": chain, "lease": lease_until, "ttl": ttl})
              for chain in range(min(width, len(positions)))),
        ]

    def put_items(self, items: list[dict]) -> None:
        batch_write(self.name, puts=items)

    def put_meta_element(self, meta: dict) -> dict:
        return {"Put": {"TableName": self.name, "Item": to_item(meta),
                        "ConditionExpression": "attribute_not_exists(pk)"}}

    # ---- read ---------------------------------------------------------------------------

    def get_meta(self, batch_id: str, *, consistent: bool = True) -> BatchRecord | None:
        answer = aws.dynamodb().get_item(TableName=self.name, Key=meta_key(batch_id), ConsistentRead=consistent)
        return record_of(from_item(answer.get("Item")))

    def get_chunk(self, batch_id: str, number: int,
                  holding: Callable[[int], None] = lambda size: None) -> input_chunks.InputRun:
        """The requests of one input chunk. Cached: chunks never change. `holding(size)` is told
        the size of a chunk's one body (a large body is alone in its chunk) before it is read or
        decompressed: a worker takes its memory permit for a large one then."""
        cached = _chunks.get((batch_id, number))
        if cached is not None:
            return cached
        data = self._chunk_data(batch_id, number, holding)
        lines = input_chunks.header(data)
        if len(lines) == 1:
            holding(int(lines[0][2]))
        run = input_chunks.unpack(data)
        _chunks.put((batch_id, number), run)
        return run

    def get_custom_ids(self, batch_id: str, number: int) -> list[str]:
        """The custom ids of one input chunk's requests (its bodies are not decompressed)."""
        cached = _chunks.get((batch_id, number))
        if cached is not None:
            return cached.custom_ids
        return input_chunks.unpack_custom_ids(self._chunk_data(batch_id, number))

    def _chunk_data(self, batch_id: str, number: int,
                    holding: Callable[[int], None] = lambda size: None) -> bytes:
        item = self._get_written_at_create(key(batch_pk(batch_id), chunk_sk(number)))
        if item is None:
            raise LookupError(f"input chunk {number} of {batch_id} is missing")
        if "data" in item:
            return item["data"]
        obj = aws.s3().get_object(Bucket=self.bucket, Key=item["s3_key"])
        holding(int(obj["ContentLength"]))  # one request, over the item limit even compressed
        return obj["Body"].read()

    def get_lane_positions(self, batch_id: str, model: str) -> list[int]:
        cached = _lane_positions.get((batch_id, model))
        if cached is not None:
            return cached
        item = self._get_written_at_create(key(batch_pk(batch_id), f"LANEPOS#{model}"))
        if item is None:
            raise LookupError(f"lane {model} of {batch_id} is missing")
        positions = decode_positions(item["positions"])
        _lane_positions.put((batch_id, model), positions)
        return positions

    def _get_written_at_create(self, item_key: dict) -> dict | None:
        """An item create wrote and nothing changes: an eventually consistent read (half the read
        units) is the item itself, or nothing when it is younger than the replica's lag (a worker
        reads a chunk a moment after create): only then is it read again, consistently."""
        answer = aws.dynamodb().get_item(TableName=self.name, Key=item_key)
        if "Item" not in answer:
            answer = aws.dynamodb().get_item(TableName=self.name, Key=item_key, ConsistentRead=True)
        return from_item(answer.get("Item"))

    def get_lanes(self, batch_id: str) -> list[dict]:
        """Each lane (`model`, `size`, `width`) with its chains' `heads` and dispatch `leases`,
        chain k's at k: the lanes' items and their chains' items, read with one Query."""
        lanes: dict[str, dict] = {}
        chains: dict[str, dict[int, dict]] = {}
        for item in query_all(
            TableName=self.name,
            KeyConditionExpression="pk = :pk AND begins_with(sk, :lane)",
            ExpressionAttributeValues=values(pk=batch_pk(batch_id), lane="LANE#"),
            ConsistentRead=True,
        ):
            model, _, chain = item["sk"].removeprefix("LANE#").partition("#")
            if chain:
                chains.setdefault(model, {})[int(chain)] = item
            else:
                lanes[model] = {"model": item["model"], "size": item["size"], "width": item["width"]}
        for model, lane in lanes.items():
            ordered = [chain for _, chain in sorted(chains.get(model, {}).items())]
            lane["heads"] = [chain["head"] for chain in ordered]
            lane["leases"] = [chain["lease"] for chain in ordered]
            lane["runners"] = [chain.get("runner") for chain in ordered]
        return list(lanes.values())

    def get_request(self, batch_id: str, position: int) -> dict | None:
        answer = aws.dynamodb().get_item(TableName=self.name, Key=request_key(batch_id, position),
                                         ConsistentRead=True)
        return from_item(answer.get("Item"))

    def iter_requests(self, batch_id: str, first: int, last: int) -> Iterator[tuple[int, dict]]:
        """(position, state) of the requests first..last (inclusive) that have a state, in position
        order, read a Query page (1 MB) at a time as the caller goes: a results page that stops at
        its byte budget reads no further. Consistent: a page read after the batch's (consistent)
        status must not show a request as running that the status counts as finished."""
        for item in query_all(
            TableName=self.name,
            KeyConditionExpression="pk = :pk AND sk BETWEEN :lo AND :hi",
            ExpressionAttributeValues=values(pk=batch_pk(batch_id), lo=f"REQ#{first:09d}", hi=f"REQ#{last:09d}"),
            ConsistentRead=True,
        ):
            yield int(item["sk"][4:]), item

    def load_response(self, state: dict) -> dict | None:
        if "response_z" in state:
            return json.loads(zlib.decompress(state["response_z"]))
        if "response_s3_key" in state:
            body = aws.s3().get_object(Bucket=self.bucket, Key=state["response_s3_key"])["Body"].read()
            return {"status_code": state["response_status"], "request_id": state["response_request_id"],
                    "body": json.loads(gzip.decompress(body))}
        return None

    def response_attributes(self, batch_id: str, position: int, token: str, response: dict) -> dict[str, Any]:
        """The attributes that store a response on its request item: compressed inline when small,
        else its body in S3 (status and request id stay in the item).

        Stored as bytes, never as a DynamoDB map: a completion's JSON may hold empty object keys,
        which DynamoDB refuses as attribute names. The S3 key names the run's claim, so a run that
        lost its claim (and whose settle will fail) never overwrites the winner's body; its own
        object is left for the purge. An S3 body is gzip JSON with a matching Content-Encoding, so
        a presigned URL (`response_url`) serves it as it is."""
        encoded = json.dumps(response, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
        if len(encoded) <= INLINE_RESPONSE_LIMIT:
            return {"response_z": zlib.compress(encoded, 6)}
        body = json.dumps(response["body"], separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
        s3_key = f"{batch_id}/responses/{position:09d}/{token}.json.gz"
        aws.s3().put_object(Bucket=self.bucket, Key=s3_key, Body=gzip.compress(body, 6),
                            ContentType="application/json", ContentEncoding="gzip")
        return {"response_s3_key": s3_key, "response_status": response["status_code"],
                "response_request_id": response["request_id"]}

    def response_url(self, state: dict, expires_in: int = RESPONSE_URL_SECONDS) -> str:
        """A presigned GET of a response body stored in S3 (for a result too big for any page of
        results): S3 answers it as JSON with Content-Encoding gzip, which HTTP clients undo."""
        return aws.s3().generate_presigned_url(
            "get_object", ExpiresIn=expires_in,
            Params={"Bucket": self.bucket, "Key": state["response_s3_key"], "ResponseContentType": "application/json",
                    "ResponseContentEncoding": "gzip"})

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

    def get_metas(self, batch_ids: list[str]) -> dict[str, BatchRecord]:
        if not batch_ids:
            return {}
        found = batch_get({self.name: {"Keys": [meta_key(b) for b in batch_ids], "ConsistentRead": True}})
        return {item["id"]: BatchRecord.model_validate(item) for item in found[self.name]}

    # ---- state changes ------------------------------------------------------------------

    def update_meta(self, batch_id: str, expression: str, condition: str, names: dict | None = None,
                    **named: Any) -> BatchRecord | None:
        """A conditional META update; the new record, or None when the condition did not hold."""
        kwargs: dict[str, Any] = {
            "TableName": self.name, "Key": meta_key(batch_id), "UpdateExpression": expression,
            "ConditionExpression": condition, "ReturnValues": "ALL_NEW",
        }
        if named:
            kwargs["ExpressionAttributeValues"] = values(**named)
        if names:
            kwargs["ExpressionAttributeNames"] = names
        try:
            return record_of(from_item(aws.dynamodb().update_item(**kwargs)["Attributes"]))
        except ClientError as error:
            if is_conditional_failure(error):
                return None
            raise

    def meta_update_element(self, batch_id: str, expression: str, condition: str | None = None,
                            names: dict | None = None, **named: Any) -> dict:
        return self._update_element(meta_key(batch_id), expression, condition, names, named)

    def request_update_element(self, batch_id: str, position: int, expression: str, condition: str | None,
                               names: dict | None = None, **named: Any) -> dict:
        return self._update_element(request_key(batch_id, position), expression, condition, names, named)

    def _update_element(self, item_key: dict, expression: str, condition: str | None, names: dict | None,
                        named: dict[str, Any]) -> dict:
        element: dict[str, Any] = {"TableName": self.name, "Key": item_key, "UpdateExpression": expression}
        if condition:
            element["ConditionExpression"] = condition
        if named:
            element["ExpressionAttributeValues"] = values(**named)
        if names:
            element["ExpressionAttributeNames"] = names
        return {"Update": element}

    def chain_start_element(self, batch_id: str, model: str, chain: int, head: int, holder: str,
                            lease_until: float) -> dict:
        """A run takes chain `chain`, with a fresh dispatch lease: only at the chain's head, and only
        while no other run has it. The chain's `runner` is what the batch's `running` counts (see
        store/runs.py)."""
        return {"Update": {
            "TableName": self.name, "Key": chain_key(batch_id, model, chain),
            "UpdateExpression": "SET runner = :holder, lease = :lease",
            "ConditionExpression": "head = :head AND attribute_not_exists(runner)",
            "ExpressionAttributeValues": values(head=head, holder=holder, lease=lease_until),
        }}

    def chain_move_element(self, batch_id: str, model: str, chain: int, old_head: int, new_head: int,
                           lease_until: float, *, runner: str | None = None, stop: bool = False) -> dict:
        """Move chain `chain`'s head (its watermark: every request before it is settled and counted)
        from `old_head` to `new_head`, with a fresh dispatch lease. `runner`: only while that run
        has the chain (None: only while no run has it); `stop`: the run gives the chain up."""
        condition = "head = :old AND " + ("runner = :runner" if runner else "attribute_not_exists(runner)")
        named: dict[str, Any] = {"old": old_head, "new": new_head, "lease": lease_until}
        if runner:
            named["runner"] = runner
        return {"Update": {
            "TableName": self.name, "Key": chain_key(batch_id, model, chain),
            "UpdateExpression": "SET head = :new, lease = :lease" + (" REMOVE runner" if stop else ""),
            "ConditionExpression": condition,
            "ExpressionAttributeValues": values(**named),
        }}

    def chain_stop_element(self, batch_id: str, model: str, chain: int, runner: str) -> dict:
        """The sweep gives up the chain of a run that died (its head stays)."""
        return {"Update": {
            "TableName": self.name, "Key": chain_key(batch_id, model, chain),
            "UpdateExpression": "REMOVE runner",
            "ConditionExpression": "runner = :runner",
            "ExpressionAttributeValues": values(runner=runner),
        }}

    def get_outcomes(self, batch_id: str, positions: list[int]) -> dict[int, tuple[str, int]]:
        """(status, cost) of those of the given requests that have a state: what counting them needs,
        without their responses."""
        found = batch_get({self.name: {"Keys": [request_key(batch_id, p) for p in positions], "ConsistentRead": True,
                                       "ProjectionExpression": "sk, #status, cost_nano",
                                       "ExpressionAttributeNames": {"#status": "status"}}})
        return {int(item["sk"][4:]): (item["status"], int(item.get("cost_nano", 0))) for item in found[self.name]}

    def set_lane_lease(self, batch_id: str, model: str, slot: int, head: int, lease_until: float) -> bool:
        """Renew one chain's dispatch lease, only if the chain still stands at `head` and no run has
        it (a run keeps its own lease; a chain that does not exist fails the condition too: nothing
        is created)."""
        return apply_update({"Update": {
            "TableName": self.name, "Key": chain_key(batch_id, model, slot),
            "UpdateExpression": "SET lease = :lease",
            "ConditionExpression": "head = :head AND attribute_not_exists(runner)",
            "ExpressionAttributeValues": values(head=head, lease=lease_until),
        }})

    def update_request(self, batch_id: str, position: int, expression: str, condition: str,
                       names: dict | None = None, **named: Any) -> bool:
        return apply_update(self.request_update_element(batch_id, position, expression, condition, names, **named))

    # ---- purge --------------------------------------------------------------------------

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
            self._delete_objects(f"{batch_id}/")
        elif s3_keys:
            aws.s3().delete_objects(Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in s3_keys]})
        batch_write(self.name, deletes=others)
        batch_write(self.name, deletes=[meta] if meta in keys else [])
        return len(keys)

    def delete_responses(self, batch_id: str, seconds: float) -> bool:
        """Delete the batch's stored responses (only those too big for an item are in S3), so the
        presigned links to them stop working: listed by the batch's prefix, 1,000 keys a page,
        each page deleted by one DeleteObjects call, several at once. Bounded by `seconds`: False
        when objects may be left, which the purge deletes (the batch is already deleted, so no
        new link to them is given)."""
        until = time.monotonic() + seconds
        s3 = aws.s3()
        paginator = s3.get_paginator("list_objects_v2")

        def delete(keys: list[dict]) -> None:
            s3.delete_objects(Bucket=self.bucket, Delete={"Objects": keys, "Quiet": True})

        complete = True
        with ThreadPoolExecutor(max_workers=DELETE_THREADS) as pool:
            deletes = []
            for page in paginator.paginate(Bucket=self.bucket, Prefix=f"{batch_id}/responses/",
                                           PaginationConfig={"PageSize": S3_KEYS_PER_CALL}):
                keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
                if keys:
                    deletes.append(pool.submit(delete, keys))
                if page.get("IsTruncated") and time.monotonic() > until:
                    complete = False
                    break
            for done in deletes:
                done.result()  # a failed delete raises: the batch is deleted, the purge retries them
        return complete

    def _delete_objects(self, prefix: str) -> None:
        paginator = aws.s3().get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
            objects = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            for start in range(0, len(objects), 1000):
                aws.s3().delete_objects(Bucket=self.bucket, Delete={"Objects": objects[start : start + 1000]})
