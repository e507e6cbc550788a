"""One object to download: a file of several objects (an upload's parts) joined into one.

A download link is a presigned GET of one object, so a file whose content is an upload's parts
(each ~4 MB, under S3's 5 MiB multipart minimum: no UploadPartCopy of them either) is joined
once: read a few parts at a time into a part of at least 5 MiB, written by UploadPart to a
multipart upload of `files/<file id>/content`, its progress recorded after each part
(store/files.py `advance_join`). The first download does it (200 MB at Lambda's S3 throughput
is a few seconds) within the time its call has; a call that runs out of time leaves the progress
for the next one (the SDK's retry of the 409, or the user's), which resumes where it stopped.
When it is done the file points at the one object and the parts are deleted. Idempotent: a
second call meanwhile finds the progress moved and stops; the file's `objects` change only
from the parts to the joined object (a conditional write)."""

from __future__ import annotations

import time

from botocore.exceptions import ClientError

from freeinference_batch.core import clock
from freeinference_batch.core.settings import Settings
from freeinference_batch.store import files, objects

# Each written part is at least S3's 5 MiB (the last may be less).
MIN_PART_BYTES = 5 * 1024 * 1024
# A join abandoned this long is the bucket lifecycle's (incomplete multipart uploads: one day).
JOIN_TTL_SECONDS = 24 * 3600


def single_object(settings: Settings, record: files.FileRecord, seconds: float) -> str | None:
    """The key of one object holding the file's content, joining its objects into one first if
    it has several; None when the join did not finish within `seconds` (or another call is at it)."""
    if len(record.objects) == 1:
        return record.objects[0]
    until = time.monotonic() + seconds
    bucket = settings.payload_bucket_name
    target = files.input_object_key(record.id)
    progress = files.get_join(settings, record.id)
    if progress is None:
        upload_id = objects.start_multipart(bucket, target, ContentType="application/jsonl")
        now = clock.now(settings.clock_offset_file)
        if not files.start_join(settings, record.id, upload_id, now, int(now) + JOIN_TTL_SECONDS):
            # Another call started first: its join goes on; this multipart upload, never used, is
            # aborted by the bucket's lifecycle rule (AbortIncompleteMultipartUpload, a day).
            progress = files.get_join(settings, record.id)
        else:
            progress = {"upload_id": upload_id, "next_object": 0, "etags": []}
        if progress is None:
            return None
    upload_id, position, etags = progress["upload_id"], int(progress["next_object"]), list(progress["etags"])
    while position < len(record.objects):
        if time.monotonic() > until:
            return None
        buffer, end = bytearray(), position
        while end < len(record.objects) and len(buffer) < MIN_PART_BYTES:
            buffer += objects.get(bucket, record.objects[end]).read()
            end += 1
        etag = objects.put_part(bucket, target, upload_id, len(etags) + 1, bytes(buffer))
        if not files.advance_join(settings, record.id, upload_id, position, end, etag):
            return None  # another call moved it meanwhile: it goes on
        etags.append(etag)
        position = end
    try:
        objects.complete_multipart(bucket, target, upload_id, etags)
    except ClientError:
        # S3 no longer knows the upload: it was completed, by another call that reached the end too,
        # or by a call that died before it could point the file at the joined object (which would
        # otherwise leave every later download a 409). The object's presence says which.
        if not objects.exists(bucket, target):
            return None
    if files.set_objects(settings, record.id, [target], record.objects):
        objects.delete_keys(bucket, record.objects)
    elif files.get_file(settings, record.account_id, record.id) is None:
        objects.delete_keys(bucket, [target])  # deleted meanwhile: its parts went with it, this goes too
        return None
    files.end_join(settings, record.id)
    return target
