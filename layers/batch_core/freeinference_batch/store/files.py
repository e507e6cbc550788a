"""Files (OpenAI's Files API, purpose `batch` and `batch_output`): their items and their content.

A file is one item of the batch table, `FILE#<file id>` / `FILE`, keyed by its id alone (so a
batch's output files are found from the batch id, `batch_file_id`); its content lives in the
payload bucket as the objects `objects` names, read in order (an upload's parts stay the objects
they were sent as: S3 multipart needs parts of 5 MiB, and a part that reaches Lambda is at most
~4.5 MB). The item also carries:

- `owner` = `FILES#<account id>` and `created_key` (the owner index, as batches have it, under
  an owner value no batch has): `files.list` newest or oldest first, a cursor being an id.
- input files only: `purge_shard` = `FILES` and `purge_at` = `expires_at` (the purge index's own
  partition, which the batch purge never reads): the purge schedule deletes expired input files
  on time and gives their count and bytes back to the account; `ttl` a day later is a backstop.
- `deleted_at` on a batch's output or error file a user deleted: a tombstone, so that the
  batch's writer running again does not bring it back.

An input file is counted on the account's item (`input_files`, `input_file_bytes`: accounts
table), in the same transaction that writes or deletes it, so the caps hold as files come and go.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any, Literal

from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict

from freeinference_batch.core import aws, clock
from freeinference_batch.core.ids import time_ordered_id
from freeinference_batch.core.settings import Settings
from freeinference_batch.store import objects
from freeinference_batch.store.accounts_table import account_item_key
from freeinference_batch.store.dynamo import (
    TransactionConflict,
    TransactionFailed,
    batch_get,
    batch_write,
    from_item,
    is_conditional_failure,
    key,
    query_all,
    to_attr,
    to_item,
    transact,
    update_element,
    values,
)

FILE_SK = "FILE"
FILES_SHARD = "FILES"
# DynamoDB's TTL deletes an expired input file's item at most this long after the purge should have.
TTL_MARGIN_SECONDS = 24 * 3600
# How much of an object iter_lines reads at once.
READ_CHUNK_BYTES = 1024 * 1024

Purpose = Literal["batch", "batch_output"]
BatchFileKind = Literal["output", "error"]


class FileRecord(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    id: str
    account_id: str
    purpose: Purpose
    filename: str
    bytes: int
    created_at: int
    expires_at: int | None
    status: str
    objects: list[str]
    batch_id: str | None = None


class FileCapReached(Exception):
    """The account's stored input files or bytes would pass their cap."""


# -- ids and keys --


def new_file_id(now: float) -> str:
    """Time-ordered like batch ids (core/ids.py), so a list cursor is an id; unguessable."""
    return time_ordered_id("file-", now)


def batch_file_id(batch_id: str, kind: BatchFileKind) -> str:
    """The id of a batch's output or error file, the same every time: the batch's creation time
    (so it sorts where its batch does) and 72 bits of a hash of the batch id and the kind."""
    digest = hashlib.sha256(f"{batch_id}:{kind}".encode()).hexdigest()[:18]
    return f"file-{batch_id.removeprefix('batch_')[:14]}{digest}"


def file_key(file_id: str) -> dict[str, dict]:
    return key(f"FILE#{file_id}", FILE_SK)


def owner_of(account_id: str) -> str:
    return f"FILES#{account_id}"


def created_key(file_id: str) -> str:
    """The owner index's sort key, from the id alone (its first 14 hex digits are microseconds)."""
    return f"{int(file_id[5:19], 16):017d}#{file_id}"


def input_object_key(file_id: str) -> str:
    """Where an input file's content lives when it is one object (files.create, or an upload's
    parts once joined)."""
    return f"files/{file_id}/content"


def _record(item: dict[str, Any] | None) -> FileRecord | None:
    # A null is not stored (to_item drops it): an output file's item has no expires_at.
    return None if item is None else FileRecord.model_validate({"expires_at": None, **item})


def _item(record: FileRecord) -> dict[str, dict]:
    item = {
        "pk": f"FILE#{record.id}",
        "sk": FILE_SK,
        "owner": owner_of(record.account_id),
        "created_key": created_key(record.id),
        **record.model_dump(),
    }
    if record.purpose == "batch" and record.expires_at is not None:
        item.update(purge_shard=FILES_SHARD, purge_at=record.expires_at,
                    ttl=record.expires_at + TTL_MARGIN_SECONDS)
    return to_item(item)


def _live(item: dict[str, Any] | None, now: float) -> bool:
    if item is None or item.get("deleted_at") is not None:
        return False
    expires_at = item.get("expires_at")
    return expires_at is None or now < expires_at


# -- reads --


def get_file(settings: Settings, account_id: str, file_id: str) -> FileRecord | None:
    """The file, or None for an unknown id, another account's file, a deleted or an expired one."""
    if not file_id.startswith("file-") or len(file_id) < 19:
        return None
    answer = aws.dynamodb().get_item(TableName=settings.batch_table_name, Key=file_key(file_id),
                                     ConsistentRead=True)
    item = from_item(answer.get("Item"))
    if not _live(item, clock.now(settings.clock_offset_file)) or item["account_id"] != account_id:
        return None
    return _record(item)


def iter_lines(settings: Settings, record: FileRecord) -> Iterator[bytes]:
    """The content's lines in order, without their newline, read an object at a time in chunks of
    a MiB (never the whole file in memory); a line that spans two objects comes out joined."""
    pending = b""
    for object_key in record.objects:
        stream = objects.get(settings.payload_bucket_name, object_key).stream
        try:
            for chunk in stream.iter_chunks(READ_CHUNK_BYTES):
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()
                yield from lines
        finally:
            stream.close()
    if pending:
        yield pending


def list_files(settings: Settings, account_id: str, *, purpose: str | None, limit: int, after: str | None,
               newest_first: bool) -> tuple[list[FileRecord], bool]:
    """A page of the account's live files, newest or oldest first, after the file `after` (an id:
    its position is in it, so a deleted file still works as a cursor); and whether more follow."""
    conditions = "#owner = :owner"
    named: dict[str, Any] = {"owner": owner_of(account_id)}
    if after:
        conditions += f" AND created_key {'<' if newest_first else '>'} :after"
        named["after"] = created_key(after)
    query: dict[str, Any] = {
        "TableName": settings.batch_table_name, "IndexName": "owner-index",
        "KeyConditionExpression": conditions, "ExpressionAttributeNames": {"#owner": "owner"},
        "ExpressionAttributeValues": values(**named), "ScanIndexForward": not newest_first,
    }
    now = clock.now(settings.clock_offset_file)
    page: list[FileRecord] = []
    keys: list[dict] = []

    def fetch() -> None:
        found = batch_get({settings.batch_table_name: {"Keys": keys, "ConsistentRead": True}})
        by_id = {item["id"]: item for item in found[settings.batch_table_name]}
        for k in keys:
            item = by_id.get(k["pk"]["S"].removeprefix("FILE#"))
            if _live(item, now) and (purpose is None or item["purpose"] == purpose):
                page.append(_record(item))
        keys.clear()

    for item in query_all(**query):
        keys.append(key(item["pk"], item["sk"]))
        if len(keys) == limit + 1 - len(page):
            fetch()
            if len(page) > limit:
                return page[:limit], True
    if keys:
        fetch()
    return page[:limit], len(page) > limit


# -- input files --


def count_element(settings: Settings, account_id: str, size: int, *, max_files: int, max_bytes: int) -> dict:
    """The transaction element that counts one more input file (or pending upload) of `size` bytes
    on its account, on the condition that the account stays within `max_files` and `max_bytes`."""
    return update_element(
        settings.accounts_table_name, account_item_key(account_id),
        "ADD input_files :one, input_file_bytes :size SET account_id = if_not_exists(account_id, :account)",
        "(attribute_not_exists(input_files) OR input_files < :max_files) AND "
        "(attribute_not_exists(input_file_bytes) OR input_file_bytes <= :room)",
        one=1, size=size, account=account_id, max_files=max_files, room=max_bytes - size,
    )


def give_back_element(settings: Settings, account_id: str, size: int) -> dict:
    """The transaction element that gives an input file's (or pending upload's) count and bytes back."""
    return update_element(settings.accounts_table_name, account_item_key(account_id),
                          "ADD input_files :minus_one, input_file_bytes :minus_size", minus_one=-1, minus_size=-size)


def new_file_element(settings: Settings, record: FileRecord) -> dict:
    """The transaction element that writes an input file's item (new)."""
    return {"Put": {"TableName": settings.batch_table_name, "Item": _item(record),
                    "ConditionExpression": "attribute_not_exists(pk)"}}


def input_file_elements(settings: Settings, record: FileRecord, *, max_files: int, max_bytes: int) -> list[dict]:
    """The two transaction elements that store an input file: its item (new), and its count and
    bytes added to its account's (a refused second element is FileCapReached: see `create_input_file`)."""
    return [new_file_element(settings, record),
            count_element(settings, record.account_id, record.bytes, max_files=max_files, max_bytes=max_bytes)]


def create_input_file(settings: Settings, record: FileRecord, *, max_files: int, max_bytes: int) -> None:
    """Write an input file's item and count it on its account, in one transaction; raise
    FileCapReached when the account already holds `max_files` files or would pass `max_bytes`."""
    if record.bytes > max_bytes:
        raise FileCapReached()
    try:
        transact(input_file_elements(settings, record, max_files=max_files, max_bytes=max_bytes))
    except TransactionFailed as failed:
        if failed.failed(1):
            raise FileCapReached() from failed
        raise


def delete_input_file(settings: Settings, record: FileRecord, now: float) -> bool:
    """Delete an input file: in one transaction its item becomes a tombstone (`deleted_at`: gone
    for every read at once, the purge removes it) and its count and bytes go back to its account;
    then its objects. False when it was already deleted (another delete, or the purge, gave them
    back). A tombstone rather than DeleteItem: no function's role may delete items one by one."""
    tombstone = update_element(settings.batch_table_name, file_key(record.id),
                               "SET deleted_at = :now, purge_shard = :shard, purge_at = :now",
                               "attribute_exists(pk) AND attribute_not_exists(deleted_at)",
                               now=int(now), shard=FILES_SHARD)
    try:
        transact([tombstone, give_back_element(settings, record.account_id, record.bytes)])
    except TransactionFailed as failed:
        if failed.failed(0):
            return False
        raise
    # The item is a tombstone first, so the content is a 404 at once; an object left by a failed
    # delete is the bucket lifecycle's (9 days).
    objects.delete_keys(settings.payload_bucket_name, record.objects)
    return True


def purge_input_files(settings: Settings, now: float) -> int:
    """The purge schedule's part: input files whose `expires_at` has passed deleted (their count
    and bytes given back), and the items of deleted ones removed with their join's. How many
    expired."""
    expired = 0
    for item in query_all(TableName=settings.batch_table_name, IndexName="purge-index",
                          KeyConditionExpression="purge_shard = :shard AND purge_at <= :now",
                          ExpressionAttributeValues=values(shard=FILES_SHARD, now=now)):
        answer = aws.dynamodb().get_item(TableName=settings.batch_table_name,
                                         Key=key(item["pk"], item["sk"]), ConsistentRead=True)
        found = from_item(answer.get("Item"))
        if found is None:
            continue
        if found.get("deleted_at") is None:
            try:
                expired += delete_input_file(settings, _record(found), now)
            except TransactionConflict:
                # Its account's item busy past the retries: the next purge takes it (its content is
                # already gone for every read, past its expires_at), and this one goes on.
                continue
        batch_write(settings.batch_table_name, deletes=[file_key(found["id"]), join_key(found["id"])])
    return expired


def set_objects(settings: Settings, file_id: str, object_keys: list[str], expected: list[str]) -> bool:
    """Point a file at other objects holding the same content (its parts once joined into one),
    if it still points at `expected`; False when it does not (deleted, or already changed)."""
    try:
        aws.dynamodb().update_item(
            TableName=settings.batch_table_name, Key=file_key(file_id),
            UpdateExpression="SET objects = :new", ConditionExpression="objects = :old",
            ExpressionAttributeValues={":new": to_attr(object_keys), ":old": to_attr(expected)},
        )
        return True
    except ClientError as error:
        if is_conditional_failure(error):
            return False
        raise


# -- a batch's output and error files --


def batch_object_prefix(batch_id: str) -> str:
    """Where a batch's output and error objects are written: under the batch's own prefix, so
    its purge deletes them with the rest of it."""
    return f"{batch_id}/files/"


def register_batch_file(settings: Settings, account_id: str, batch_id: str, kind: BatchFileKind, key: str,
                        size: int, now: float, ttl: int) -> FileRecord:
    """The item of a batch's output or error file whose object is already written at `key`.
    Idempotent: a writer that runs again gets the item that is there (a tombstone if a user
    deleted it meanwhile: a deleted file stays deleted). Not counted in the account's caps: it
    lives and dies with its batch (`delete_batch_files`). `ttl`: the DynamoDB TTL backstop (an
    epoch second), past the batch's own purge."""
    record = FileRecord(
        id=batch_file_id(batch_id, kind), account_id=account_id, purpose="batch_output",
        filename=f"{batch_id}_{kind}.jsonl", bytes=size, created_at=int(now), expires_at=None,
        status="processed", objects=[key], batch_id=batch_id,
    )
    item = {**_item(record), "ttl": to_attr(ttl)}
    try:
        aws.dynamodb().put_item(TableName=settings.batch_table_name, Item=item,
                                ConditionExpression="attribute_not_exists(pk)")
        return record
    except ClientError as error:
        if not is_conditional_failure(error):
            raise
    answer = aws.dynamodb().get_item(TableName=settings.batch_table_name, Key=file_key(record.id),
                                     ConsistentRead=True)
    return _record(from_item(answer.get("Item"))) or record


def delete_batch_file(settings: Settings, record: FileRecord, now: float) -> None:
    """A user's delete of a batch's output or error file: a tombstone (its content is a 404 at
    once, the batch keeps the id, and the batch's writer cannot bring it back); its object goes
    with the batch."""
    try:
        # Only on the item as it is: racing the batch's purge, an unconditional update would make a
        # stub of the deleted item (no ttl) that nothing removes.
        aws.dynamodb().update_item(TableName=settings.batch_table_name, Key=file_key(record.id),
                                   UpdateExpression="SET deleted_at = :now", ConditionExpression="attribute_exists(pk)",
                                   ExpressionAttributeValues=values(now=int(now)))
    except ClientError as error:
        if not is_conditional_failure(error):
            raise


def delete_batch_files(settings: Settings, batch_id: str) -> None:
    """Delete a batch's output and error file items (the batch's purge deletes their objects)."""
    batch_write(settings.batch_table_name, deletes=[file_key(batch_file_id(batch_id, kind))
                                                    for kind in ("output", "error")])


# -- joining an upload's parts into one object (files/content.py) --
#
# Its progress is an item of its own, `FILE#<id>` / `JOIN` (the file's item may hold a thousand
# object keys: each step would rewrite them all): the S3 multipart upload's id, the next of the
# file's objects to read, and the ETags of the parts written so far. A step writes whole objects
# only, so progress is a position in `objects`, and a run that dies resumes from the last step.

JOIN_SK = "JOIN"


def join_key(file_id: str) -> dict[str, dict]:
    return key(f"FILE#{file_id}", JOIN_SK)


def get_join(settings: Settings, file_id: str) -> dict[str, Any] | None:
    answer = aws.dynamodb().get_item(TableName=settings.batch_table_name, Key=join_key(file_id), ConsistentRead=True)
    return from_item(answer.get("Item"))


def start_join(settings: Settings, file_id: str, upload_id: str, now: float, ttl: int) -> bool:
    """Record a join's start; False when another one started first (its progress is the one)."""
    item = to_item({"pk": f"FILE#{file_id}", "sk": JOIN_SK, "upload_id": upload_id, "next_object": 0,
                    "etags": [], "started_at": int(now), "ttl": ttl})
    try:
        aws.dynamodb().put_item(TableName=settings.batch_table_name, Item=item,
                                ConditionExpression="attribute_not_exists(pk)")
        return True
    except ClientError as error:
        if is_conditional_failure(error):
            return False
        raise


def advance_join(settings: Settings, file_id: str, upload_id: str, read_before: int, next_object: int,
                 etag: str) -> bool:
    """One step's progress: the part written, from objects `read_before` up to `next_object`;
    False when another run moved it first (this run's part is then not counted: it stops)."""
    try:
        aws.dynamodb().update_item(
            TableName=settings.batch_table_name, Key=join_key(file_id),
            UpdateExpression="SET next_object = :next, etags = list_append(etags, :etag)",
            ConditionExpression="upload_id = :upload AND next_object = :before",
            ExpressionAttributeValues=values(next=next_object, etag=[etag], upload=upload_id, before=read_before),
        )
        return True
    except ClientError as error:
        if is_conditional_failure(error):
            return False
        raise


def end_join(settings: Settings, file_id: str) -> None:
    batch_write(settings.batch_table_name, deletes=[join_key(file_id)])
