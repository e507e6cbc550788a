"""The payload bucket's objects (S3): what is too big for an item (a large input chunk, a large
response), their presigned links, and their deletion. Keys are `<batch id>/input/...` and
`<batch id>/responses/...`: a batch's objects share its prefix (the callers name them)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from freeinference_batch.core import aws

# S3 lists and deletes at most 1,000 keys a call; a delete's pages go out this many at once.
S3_KEYS_PER_CALL = 1000
DELETE_THREADS = 8


@dataclass(frozen=True)
class StoredObject:
    """An object as GetObject answers it: its size is known before its body is read."""

    size: int
    stream: Any

    def read(self) -> bytes:
        return self.stream.read()


def put(bucket: str, key: str, body: bytes, **headers: str) -> None:
    """PutObject; `headers` are its ContentType, ContentEncoding, ..."""
    aws.s3().put_object(Bucket=bucket, Key=key, Body=body, **headers)


def get(bucket: str, key: str) -> StoredObject:
    answer = aws.s3().get_object(Bucket=bucket, Key=key)
    return StoredObject(int(answer["ContentLength"]), answer["Body"])


def exists(bucket: str, key: str) -> bool:
    """HeadObject: whether the object is there (any error but a 404 raises)."""
    try:
        aws.s3().head_object(Bucket=bucket, Key=key)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return False
        raise
    return True


def presigned_get_url(bucket: str, key: str, expires_in: int, **response_headers: str) -> str:
    """A presigned GET of an object (signed here: no call is made); `response_headers` are the
    ResponseContentType, ResponseContentEncoding, ... S3 answers it with."""
    return aws.s3().generate_presigned_url("get_object", ExpiresIn=expires_in,
                                           Params={"Bucket": bucket, "Key": key, **response_headers})


def delete_keys(bucket: str, keys: list[str]) -> None:
    """Delete these objects (at most 1,000), by name: no right to list the bucket is needed."""
    aws.s3().delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys]})


def delete_prefix(bucket: str, prefix: str) -> None:
    """Delete every object under `prefix`, listed a page at a time."""
    paginator = aws.s3().get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
        objects = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        for start in range(0, len(objects), S3_KEYS_PER_CALL):
            aws.s3().delete_objects(Bucket=bucket, Delete={"Objects": objects[start : start + S3_KEYS_PER_CALL]})


def delete_prefix_within(bucket: str, prefix: str, seconds: float) -> bool:
    """Delete the objects under `prefix`, listed 1,000 keys a page, each page deleted by one
    DeleteObjects call, several at once. Bounded by `seconds`: False when objects may be left.
    A failed delete raises."""
    until = time.monotonic() + seconds
    s3 = aws.s3()
    paginator = s3.get_paginator("list_objects_v2")

    def delete(keys: list[dict]) -> None:
        s3.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})

    complete = True
    with ThreadPoolExecutor(max_workers=DELETE_THREADS) as pool:
        deletes = []
        for page in paginator.paginate(Bucket=bucket, Prefix=prefix, PaginationConfig={"PageSize": S3_KEYS_PER_CALL}):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                deletes.append(pool.submit(delete, keys))
            if page.get("IsTruncated") and time.monotonic() > until:
                complete = False
                break
        for done in deletes:
            done.result()
    return complete


# -- multipart uploads (an upload's parts joined into one object: files/content.py) --


def start_multipart(bucket: str, key: str, **headers: str) -> str:
    """CreateMultipartUpload; its upload id."""
    return aws.s3().create_multipart_upload(Bucket=bucket, Key=key, **headers)["UploadId"]


def put_part(bucket: str, key: str, upload_id: str, number: int, body: bytes) -> str:
    """UploadPart (every part but the last at least 5 MiB, S3's rule); its ETag."""
    return aws.s3().upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body)["ETag"]


def complete_multipart(bucket: str, key: str, upload_id: str, etags: list[str]) -> None:
    parts = [{"PartNumber": number, "ETag": etag} for number, etag in enumerate(etags, start=1)]
    aws.s3().complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts})
