"""Uploads (OpenAI's Uploads API): an upload's item, its parts' items and objects, its completion.

Items of the batch table, under the upload's partition:

- `UPLOAD#<upload id>` / `UPLOAD`: account_id, filename, purpose, bytes (as declared), mime_type,
  created_at, expires_at, status (pending | completed | cancelled), file_id once completed; while
  pending, `purge_shard` = `UPLOADS` and `purge_at` = `expires_at`, so the purge schedule ends
  an expired one and deletes its parts (`ttl` a day later is a backstop).
- `UPLOAD#<upload id>` / `PART#<part id>`: the part's object key, its size, created_at, ttl.

A part's object is `uploads/<upload id>/<part id>`: kept as it is when the upload completes (the
file's `objects`), since a part that reaches Lambda (~4.5 MB) is below S3's 5 MiB multipart
minimum.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

from pydantic import BaseModel, ConfigDict

from freeinference_batch.core import aws
from freeinference_batch.core.ids import time_ordered_id
from freeinference_batch.core.settings import Settings
from freeinference_batch.store import files, objects
from freeinference_batch.store.dynamo import (
    TransactionFailed,
    batch_get,
    batch_write,
    from_item,
    key,
    query_all,
    to_item,
    transact,
    update_element,
    values,
)

UPLOAD_SK = "UPLOAD"
UPLOADS_SHARD = "UPLOADS"

UploadStatus = Literal["pending", "completed", "cancelled", "expired"]


class UploadRecord(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    id: str
    account_id: str
    filename: str
    purpose: str
    bytes: int
    mime_type: str
    created_at: int
    expires_at: int
    status: UploadStatus
    file_id: str | None = None
    # Counted on its account as an input file of its declared bytes from its create (uploads made
    # before that rule are not: they complete counted, and end with nothing to give back).
    reserved: bool = False


class PartRecord(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    id: str
    upload_id: str
    object_key: str
    size: int
    created_at: int


class UploadNotPending(Exception):
    """The upload was completed, cancelled or expired by another call meanwhile."""


def new_upload_id(now: float) -> str:
    return time_ordered_id("upload_", now)


def new_part_id(now: float) -> str:
    return time_ordered_id("part_", now)


def upload_key(upload_id: str) -> dict[str, dict]:
    return key(f"UPLOAD#{upload_id}", UPLOAD_SK)


def part_key(upload_id: str, part_id: str) -> dict[str, dict]:
    return key(f"UPLOAD#{upload_id}", f"PART#{part_id}")


def part_object_key(upload_id: str, part_id: str) -> str:
    return f"uploads/{upload_id}/{part_id}"


def create_upload(settings: Settings, record: UploadRecord, *, max_files: int, max_bytes: int) -> UploadRecord:
    """Write a pending upload and, in the same transaction, count it on its account as an input
    file of its declared bytes: pending uploads hold their place within the account's caps, so
    parts never store more than the caps allow. Raises files.FileCapReached."""
    record = record.model_copy(update={"reserved": True})
    item = {"pk": f"UPLOAD#{record.id}", "sk": UPLOAD_SK, **record.model_dump(),
            "purge_shard": UPLOADS_SHARD, "purge_at": record.expires_at,
            "ttl": record.expires_at + files.TTL_MARGIN_SECONDS}
    if record.bytes > max_bytes:
        raise files.FileCapReached()
    put = {"Put": {"TableName": settings.batch_table_name, "Item": to_item(item),
                   "ConditionExpression": "attribute_not_exists(pk)"}}
    # (botocore re-sends a transaction whose answer was lost with its idempotency token: DynamoDB
    # answers it as the first, so the new item's condition never refuses its own write.)
    try:
        transact([put, files.count_element(settings, record.account_id, record.bytes, max_files=max_files,
                                           max_bytes=max_bytes)])
    except TransactionFailed as failed:
        if failed.failed(1):
            raise files.FileCapReached() from failed
        raise
    return record


def get_upload(settings: Settings, upload_id: str) -> UploadRecord | None:
    if not upload_id.startswith("upload_"):
        return None
    answer = aws.dynamodb().get_item(TableName=settings.batch_table_name, Key=upload_key(upload_id),
                                     ConsistentRead=True)
    item = from_item(answer.get("Item"))
    return None if item is None else UploadRecord.model_validate(item)


class PartRefused(Exception):
    """The part would take the upload past its declared bytes or its most parts, or the upload
    is no longer pending."""


def add_part(settings: Settings, upload: UploadRecord, data: bytes, now: float, max_parts: int) -> PartRecord:
    """Store a part: its object, then one transaction that counts it on the upload's item (its
    bytes within the declared `bytes`, its count within `max_parts`, so a pending upload never
    stores more than it declared) and writes its item. Counted and stored together: a call that
    dies between the two leaves an object no item names (the bucket's lifecycle rule deletes it),
    never a count without its part; botocore re-sends a transaction whose answer was lost with its
    idempotency token, so it is counted once."""
    if len(data) > upload.bytes:
        raise PartRefused()
    part_id = new_part_id(now)
    part = PartRecord(id=part_id, upload_id=upload.id, object_key=part_object_key(upload.id, part_id),
                      size=len(data), created_at=int(now))
    objects.put(settings.payload_bucket_name, part.object_key, data)
    counted = update_element(
        settings.batch_table_name, upload_key(upload.id), "ADD received :size, parts :one",
        "#status = :pending AND (attribute_not_exists(received) OR (received <= :room AND parts < :max_parts))",
        names={"#status": "status"}, size=len(data), one=1, pending="pending", room=upload.bytes - len(data),
        max_parts=max_parts,
    )
    item = {"pk": f"UPLOAD#{upload.id}", "sk": f"PART#{part_id}", **part.model_dump(),
            "ttl": upload.expires_at + files.TTL_MARGIN_SECONDS}
    try:
        transact([counted, {"Put": {"TableName": settings.batch_table_name, "Item": to_item(item),
                                    "ConditionExpression": "attribute_not_exists(pk)"}}])
    except TransactionFailed as refused:
        objects.delete_keys(settings.payload_bucket_name, [part.object_key])
        raise PartRefused() from refused
    return part


def get_parts(settings: Settings, upload_id: str, part_ids: list[str]) -> dict[str, PartRecord]:
    """The named parts of the upload that exist, by id."""
    table = settings.batch_table_name
    keys = [part_key(upload_id, part_id) for part_id in part_ids]
    found = batch_get({table: {"Keys": keys, "ConsistentRead": True}})[table]
    return {item["id"]: PartRecord.model_validate(item) for item in found}


def all_parts(settings: Settings, upload_id: str) -> Iterator[PartRecord]:
    for item in query_all(TableName=settings.batch_table_name,
                          KeyConditionExpression="pk = :pk AND begins_with(sk, :part)",
                          ExpressionAttributeValues=values(pk=f"UPLOAD#{upload_id}", part="PART#")):
        yield PartRecord.model_validate(item)


def complete(settings: Settings, upload: UploadRecord, file: files.FileRecord, *, max_files: int,
             max_bytes: int) -> None:
    """In one transaction: the upload completed (if still pending), its file's item written, and
    the file counted on its account (an upload counted since its create hands its place to its
    file: its declared bytes are the file's). Raises UploadNotPending, or files.FileCapReached."""
    done = update_element(settings.batch_table_name, upload_key(upload.id),
                          "SET #status = :completed, file_id = :file REMOVE purge_shard, purge_at",
                          "#status = :pending", names={"#status": "status"},
                          completed="completed", file=file.id, pending="pending")
    if file.bytes > max_bytes:
        raise files.FileCapReached()
    stored = ([files.new_file_element(settings, file)] if upload.reserved else
              files.input_file_elements(settings, file, max_files=max_files, max_bytes=max_bytes))
    try:
        transact([done, *stored])
    except TransactionFailed as failed:
        if failed.failed(0):
            raise UploadNotPending() from failed
        if failed.failed(2):
            raise files.FileCapReached() from failed
        raise


def end(settings: Settings, upload: UploadRecord, status: Literal["cancelled", "expired"]) -> bool:
    """Cancel (or expire) a pending upload, give its place within its account's caps back, and
    delete its parts; False when it was no longer pending."""
    ended = update_element(
        settings.batch_table_name, upload_key(upload.id), "SET #status = :status REMOVE purge_shard, purge_at",
        "#status = :pending", names={"#status": "status"}, status=status, pending="pending",
    )
    given_back = [files.give_back_element(settings, upload.account_id, upload.bytes)] if upload.reserved else []
    try:
        transact([ended, *given_back])
    except TransactionFailed:
        return False  # no longer pending (a re-sent transaction is answered as its first: see create_upload)
    delete_parts(settings, upload.id, keep=set())
    return True


def delete_parts(settings: Settings, upload_id: str, keep: set[str]) -> None:
    """Delete the upload's parts (objects, then items) but those in `keep` (a completed file's)."""
    unused = [part for part in all_parts(settings, upload_id) if part.id not in keep]
    for start in range(0, len(unused), objects.S3_KEYS_PER_CALL):
        objects.delete_keys(settings.payload_bucket_name,
                            [part.object_key for part in unused[start : start + objects.S3_KEYS_PER_CALL]])
    if unused:
        batch_write(settings.batch_table_name, deletes=[part_key(upload_id, part.id) for part in unused])


def expired_uploads(settings: Settings, now: float) -> Iterator[UploadRecord]:
    """Pending uploads whose hour has passed, for the purge schedule to end."""
    for item in query_all(TableName=settings.batch_table_name, IndexName="purge-index",
                          KeyConditionExpression="purge_shard = :shard AND purge_at <= :now",
                          ExpressionAttributeValues=values(shard=UPLOADS_SHARD, now=now)):
        record = get_upload(settings, item["pk"].removeprefix("UPLOAD#"))
        if record is not None and record.status == "pending":
            yield record

