"""What the /v1/files routes do: upload, list, retrieve, delete, and the content's link.

Uploading needs batch access, as creating a batch does; listing, reading, downloading and
deleting need only a key that may read batches. Another account's file is a 404, as its
batches are."""

from __future__ import annotations

import re

from freeinference_batch import accounts
from freeinference_batch.core import clock
from freeinference_batch.core.errors import BadRequest, Conflict, NotFound, PayloadTooLarge, busy
from freeinference_batch.core.settings import Settings
from freeinference_batch.files import content, multipart
from freeinference_batch.files.models import FileDeleted, FileList, FileObject
from freeinference_batch.store import files, objects
from freeinference_batch.store.dynamo import TransactionConflict

# What files.create refuses past its limit: the call that takes any size up to the file limit.
CHUNKED_UPLOAD = ('client.uploads.upload_file_chunked(file=..., mime_type="application/jsonl", '
                  'purpose="batch", part_size=4 * 1024 * 1024)')
FILE_ID = re.compile(r"file-[0-9a-f]{32}")
LIMIT = re.compile(r"[0-9]{1,5}")


def file_object(record: files.FileRecord) -> dict:
    return FileObject(id=record.id, bytes=record.bytes, created_at=record.created_at, expires_at=record.expires_at,
                      filename=record.filename, purpose=record.purpose, status=record.status).model_dump()


def check_purpose(purpose: str | None) -> None:
    if purpose != "batch":
        raise BadRequest(f"purpose must be 'batch', the only purpose this service stores files for (got {purpose!r})",
                         param="purpose")


def caps_message(settings: Settings) -> str:
    return (f"This account already stores the most input files it may ({settings.file_max_stored} files, "
            f"{settings.file_max_stored_bytes} bytes in all, pending uploads counted as files of their bytes) or "
            "this file would pass them; delete files (client.files.delete), cancel uploads, or wait for them to "
            "expire")


def cap_refused(settings: Settings) -> Conflict:
    return Conflict(caps_message(settings), code="file_limit_reached")


def upload_file(settings: Settings, principal: accounts.Principal, body: bytes, content_type: str | None) -> dict:
    """files.create: the whole file in one multipart body."""
    accounts.batch_catalog(settings, principal)
    form = multipart.parse(body, content_type)
    purpose = form.get("purpose")
    check_purpose(purpose.value.decode("utf-8", "replace") if purpose else None)
    upload = form.get("file")
    if upload is None or upload.filename is None:
        raise BadRequest("The form must have a 'file' field holding the file", param="file")
    if len(upload.value) > settings.file_create_max_bytes:
        raise PayloadTooLarge(
            f"files.create takes files of at most {settings.file_create_max_bytes} bytes (this one has "
            f"{len(upload.value)}): one API call carries at most ~4.5 MB. Upload bigger files in parts: "
            f"{CHUNKED_UPLOAD}", param="file")
    now = clock.now(settings.clock_offset_file)
    file_id = files.new_file_id(now)
    key = files.input_object_key(file_id)
    objects.put(settings.payload_bucket_name, key, upload.value, ContentType="application/jsonl")
    record = files.FileRecord(
        id=file_id, account_id=principal.account_id, purpose="batch", filename=upload.filename[:255] or "file.jsonl",
        bytes=len(upload.value), created_at=int(now), expires_at=int(now) + settings.file_lifetime_seconds,
        status="processed", objects=[key],
    )
    try:
        files.create_input_file(settings, record, max_files=settings.file_max_stored,
                                max_bytes=settings.file_max_stored_bytes)
    except files.FileCapReached as refused:
        objects.delete_keys(settings.payload_bucket_name, [key])
        raise cap_refused(settings) from refused
    except TransactionConflict as conflict:
        objects.delete_keys(settings.payload_bucket_name, [key])
        raise busy("storing the file") from conflict
    return file_object(record)


def owned_file(settings: Settings, principal: accounts.Principal, file_id: str) -> files.FileRecord:
    record = files.get_file(settings, principal.account_id, file_id) if FILE_ID.fullmatch(file_id) else None
    if record is None:
        raise NotFound(f"No file with id '{file_id[:64]}'", param="file_id")
    return record


def get_file(settings: Settings, principal: accounts.Principal, file_id: str) -> dict:
    return file_object(owned_file(settings, principal, file_id))


def list_files(settings: Settings, principal: accounts.Principal, *, purpose: str | None, limit: str | None,
               after: str | None, order: str | None) -> dict:
    """files.list: OpenAI's parameters (limit 1 to 10,000, default 10,000; order desc by default)."""
    if limit is not None and not (LIMIT.fullmatch(limit) and 1 <= int(limit) <= 10_000):
        raise BadRequest(f"limit must be an integer from 1 to 10000 in ASCII digits (got {limit[:40]!r})",
                         param="limit")
    if order not in (None, "asc", "desc"):
        raise BadRequest(f"order must be 'asc' or 'desc' (got {order[:40]!r})", param="order")
    if after is not None and not FILE_ID.fullmatch(after):
        raise BadRequest(f"after must be a file id (got {after[:64]!r})", param="after")
    page, has_more = files.list_files(settings, principal.account_id, purpose=purpose,
                                      limit=int(limit) if limit else 10_000, after=after,
                                      newest_first=order != "asc")
    data = [file_object(record) for record in page]
    return FileList(data=data, first_id=data[0]["id"] if data else None, last_id=data[-1]["id"] if data else None,
                    has_more=has_more).model_dump()


def delete_file(settings: Settings, principal: accounts.Principal, file_id: str) -> dict:
    """A user's delete: its content is a 404 at once. An input file's count and bytes go back to
    the account; a batch's output or error file stays deleted, and the batch keeps its id."""
    record = owned_file(settings, principal, file_id)
    if record.batch_id is None:
        try:
            files.delete_input_file(settings, record, clock.now(settings.clock_offset_file))
        except TransactionConflict as conflict:
            raise busy("deleting the file") from conflict
    else:
        files.delete_batch_file(settings, record, clock.now(settings.clock_offset_file))
    return FileDeleted(id=record.id).model_dump()


def content_url(settings: Settings, principal: accounts.Principal, file_id: str, seconds: float) -> str:
    """The content's short-lived link (the answer redirects to it: never through Lambda's 6 MB
    answer). A file of several objects (an upload's parts) is joined into one first, within
    `seconds` (content.py); while that goes on, a 409 with Retry-After."""
    record = owned_file(settings, principal, file_id)
    key = content.single_object(settings, record, seconds)
    if key is None:
        raise Conflict("The file's parts are still being joined into one object for download; retry in a few "
                       "seconds", code="file_not_ready", retry_after=2)
    return objects.presigned_get_url(settings.payload_bucket_name, key, settings.file_url_seconds,
                                     ResponseContentType="application/jsonl",
                                     ResponseContentDisposition=f'attachment; filename="{record.filename}"')
