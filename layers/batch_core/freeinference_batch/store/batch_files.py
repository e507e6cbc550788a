"""A file batch's output and error files as they are written (batches/output_files.py): their S3
objects, written as multipart uploads, and the job's progress, one item `BATCH#<id>` / `FILES`.

The progress item holds, for each of the two files (`output`, `error`), a `FileProgress`: the
multipart upload's id (once it has one), the next part's number, the bytes in its parts, and the
position up to which the file's lines are all in those parts; and `done` with the object's size
once it is whole. Never the parts' ETags (up to 10,000 of them would pass the item's 400 KB):
ListParts gives them back when the upload is completed. Each change is conditional on the
`version` read, so of two runs of the job (SQS delivers at least once) one goes on, the other stops.
"""

from __future__ import annotations

import secrets
from typing import Literal

from botocore.exceptions import ClientError
from pydantic import BaseModel, Field

from freeinference_batch.core import aws
from freeinference_batch.core.settings import Settings
from freeinference_batch.store import objects
from freeinference_batch.store.batch_keys import batch_pk
from freeinference_batch.store.dynamo import from_item, is_conditional_failure, key, refused_item, to_item, values

FILES_SK = "FILES"
Kind = Literal["output", "error"]
KINDS: tuple[Kind, Kind] = ("output", "error")
# S3: parts 1..10,000, each at least 5 MiB but the last (BATCH_FILES_PART_BYTES is at least that).
MAX_PARTS = 10_000
CONTENT_TYPE = "application/jsonl"


class FileProgress(BaseModel):
    upload_id: str | None = None
    next_part: int = 1
    size: int = 0  # bytes in the parts uploaded (when done: the object's)
    position: int = 0  # every line of the file before this position is in its parts
    done: bool = False


class Progress(BaseModel):
    version: int = 0
    touched_at: int = 0  # when a run last started or kept progress (the sweep's sign of life)
    output: FileProgress = Field(default_factory=FileProgress)
    error: FileProgress = Field(default_factory=FileProgress)

    def of(self, kind: Kind) -> FileProgress:
        return self.output if kind == "output" else self.error


def prefix(batch_id: str) -> str:
    """A batch's files' objects: under its own prefix, so its purge deletes them with the rest."""
    return f"{batch_id}/files/"


def object_key(batch_id: str, kind: Kind) -> str:
    return f"{prefix(batch_id)}{kind}.jsonl"


def _key(batch_id: str) -> dict:
    return key(batch_pk(batch_id), FILES_SK)


# ---- progress ----------------------------------------------------------------------------------


def get_progress(settings: Settings, batch_id: str) -> Progress | None:
    answer = aws.dynamodb().get_item(TableName=settings.batch_table_name, Key=_key(batch_id), ConsistentRead=True)
    item = from_item(answer.get("Item"))
    return None if item is None else Progress.model_validate(item)


def save_progress(settings: Settings, batch_id: str, progress: Progress, read: int | None, ttl: int) -> bool:
    """Write `progress` (its version one past `read`) if the item is still at version `read`
    (None: if there is none yet); False when another run moved it first.

    The item carries a token of this write: re-sent by botocore after its answer was lost, the
    write is refused by its own success and finds its token there (without it, the job would stop
    as if another run went on, and wait for the sweep to send it again)."""
    token = secrets.token_hex(8)
    item = {"pk": batch_pk(batch_id), "sk": FILES_SK, **progress.model_dump(mode="json"), "ttl": ttl,
            "written_by": token}
    item["version"] = 0 if read is None else read + 1
    condition = ({"ConditionExpression": "attribute_not_exists(pk)"} if read is None else
                 {"ConditionExpression": "version = :read", "ExpressionAttributeValues": values(read=read)})
    try:
        aws.dynamodb().put_item(TableName=settings.batch_table_name, Item=to_item(item),
                                ReturnValuesOnConditionCheckFailure="ALL_OLD", **condition)
    except ClientError as error:
        if is_conditional_failure(error):
            return (refused_item(error) or {}).get("written_by") == token
        raise
    return True


# ---- objects -----------------------------------------------------------------------------------


def start_upload(settings: Settings, batch_id: str, kind: Kind) -> str:
    answer = aws.s3().create_multipart_upload(Bucket=settings.payload_bucket_name, Key=object_key(batch_id, kind),
                                              ContentType=CONTENT_TYPE)
    return answer["UploadId"]


def upload_part(settings: Settings, batch_id: str, kind: Kind, upload_id: str, number: int, body: bytes) -> None:
    """Part `number` (again, should a run that died have sent it: the content is the same)."""
    aws.s3().upload_part(Bucket=settings.payload_bucket_name, Key=object_key(batch_id, kind), UploadId=upload_id,
                         PartNumber=number, Body=body)


def complete_upload(settings: Settings, batch_id: str, kind: Kind, upload_id: str, parts: int) -> int:
    """Join parts 1..`parts` (their ETags read back with ListParts: a part sent beyond them by a run
    that died is left out); the object's size. An upload already completed (by a run that died
    before keeping that) answers NoSuchUpload: the object is there, and its size is read."""
    bucket, object_name = settings.payload_bucket_name, object_key(batch_id, kind)
    try:
        etags: dict[int, str] = {}
        paginator = aws.s3().get_paginator("list_parts")
        for page in paginator.paginate(Bucket=bucket, Key=object_name, UploadId=upload_id):
            etags.update({part["PartNumber"]: part["ETag"] for part in page.get("Parts", [])})
        missing = [n for n in range(1, parts + 1) if n not in etags]
        if missing:
            raise RuntimeError(f"parts {missing[:5]} of {object_name} are missing from its upload")
        aws.s3().complete_multipart_upload(
            Bucket=bucket, Key=object_name, UploadId=upload_id,
            MultipartUpload={"Parts": [{"PartNumber": n, "ETag": etags[n]} for n in range(1, parts + 1)]},
        )
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") != "NoSuchUpload":
            raise
    return object_size(settings, object_name)


def put_whole(settings: Settings, batch_id: str, kind: Kind, body: bytes) -> int:
    """A file smaller than one part: one PutObject (idempotent: the same content)."""
    objects.put(settings.payload_bucket_name, object_key(batch_id, kind), body, ContentType=CONTENT_TYPE)
    return len(body)


def object_size(settings: Settings, object_name: str) -> int:
    return int(aws.s3().head_object(Bucket=settings.payload_bucket_name, Key=object_name)["ContentLength"])


def delete_objects(settings: Settings, batch_id: str) -> None:
    """A deleted batch's files' objects (two at most, named: no list needed)."""
    objects.delete_keys(settings.payload_bucket_name, [object_key(batch_id, kind) for kind in KINDS])
