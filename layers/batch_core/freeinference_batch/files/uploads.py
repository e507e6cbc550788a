"""What the /v1/uploads routes do: create, add a part, complete, cancel (OpenAI's Uploads API).

An upload's parts stay the objects they were sent as, and `complete` makes them a file whose
`objects` are those parts in the order `part_ids` gives: no byte is copied within the call, so
it answers in a few reads and one transaction whatever the size (up to `upload_max_parts`
parts, `file_max_bytes` in all). `bytes` must equal the parts' sum. An `md5` is checked by
reading the parts back within the call's time (S3 streams a 200 MB file in seconds); a file
too slow to read in time is refused (503, nothing completed) rather than completed unchecked.
"""

from __future__ import annotations

import hashlib
import json
import time

from pydantic import ValidationError

from freeinference_batch import accounts
from freeinference_batch.core import clock
from freeinference_batch.core.errors import BadRequest, Conflict, NotFound, ServiceUnavailable, busy
from freeinference_batch.core.settings import Settings
from freeinference_batch.files import multipart
from freeinference_batch.files.models import CompleteUploadBody, CreateUploadBody, UploadObject, UploadPartObject
from freeinference_batch.files.operations import cap_refused, check_purpose, file_object
from freeinference_batch.store import files, objects, uploads
from freeinference_batch.store.dynamo import TransactionConflict

MD5_READ_CHUNK_BYTES = 1024 * 1024


def _body(raw: bytes, model: type) -> object:
    try:
        return model.model_validate(json.loads(raw or b"{}"))
    except ValueError as error:
        reason = (error.errors(include_url=False)[0]["msg"] if isinstance(error, ValidationError) else str(error))
        raise BadRequest(f"Invalid body: {reason}") from error


def upload_object(settings: Settings, record: uploads.UploadRecord, now: float) -> dict:
    file = None
    if record.file_id is not None:
        found = files.get_file(settings, record.account_id, record.file_id)
        file = file_object(found) if found is not None else None
    status = "expired" if record.status == "pending" and now >= record.expires_at else record.status
    return UploadObject(id=record.id, bytes=record.bytes, created_at=record.created_at, expires_at=record.expires_at,
                        filename=record.filename, purpose=record.purpose, status=status, file=file).model_dump()


def create_upload(settings: Settings, principal: accounts.Principal, raw: bytes) -> dict:
    accounts.batch_catalog(settings, principal)
    body = _body(raw, CreateUploadBody)
    check_purpose(body.purpose)
    if body.bytes > settings.file_max_bytes:
        raise BadRequest(f"A file holds at most {settings.file_max_bytes} bytes; this upload declares "
                              f"{body.bytes}", param="bytes")
    now = clock.now(settings.clock_offset_file)
    lifetime = settings.upload_lifetime_seconds
    if body.expires_after is not None:
        lifetime = min(lifetime, max(60, body.expires_after.seconds))
    record = uploads.UploadRecord(
        id=uploads.new_upload_id(now), account_id=principal.account_id, filename=body.filename, purpose="batch",
        bytes=body.bytes, mime_type=body.mime_type, created_at=int(now), expires_at=int(now) + lifetime,
        status="pending",
    )
    try:
        record = uploads.create_upload(settings, record, max_files=settings.file_max_stored,
                                       max_bytes=settings.file_max_stored_bytes)
    except files.FileCapReached as refused:
        raise cap_refused(settings) from refused
    except TransactionConflict as conflict:
        raise busy("creating the upload") from conflict
    return upload_object(settings, record, now)


def _pending_upload(settings: Settings, principal: accounts.Principal, upload_id: str,
                    now: float) -> uploads.UploadRecord:
    record = uploads.get_upload(settings, upload_id)
    if record is None or record.account_id != principal.account_id:
        raise NotFound(f"No upload with id '{upload_id[:64]}'", param="upload_id")
    status = "expired" if record.status == "pending" and now >= record.expires_at else record.status
    if status != "pending":
        raise Conflict(f"Upload '{upload_id}' is {status}: only a pending upload takes parts, completes or "
                       "cancels", code="upload_not_pending")
    return record


def add_part(settings: Settings, principal: accounts.Principal, upload_id: str, raw: bytes,
             content_type: str | None) -> dict:
    accounts.batch_catalog(settings, principal)
    now = clock.now(settings.clock_offset_file)
    record = _pending_upload(settings, principal, upload_id, now)
    data = multipart.parse(raw, content_type).get("data")
    if data is None:
        raise BadRequest("The form must have a 'data' field holding the part's bytes", param="data")
    if not data.value:
        raise BadRequest("A part must not be empty", param="data")
    try:
        part = uploads.add_part(settings, record, data.value, now, settings.upload_max_parts)
    except uploads.PartRefused as refused:
        raise BadRequest(f"This part would take upload '{upload_id}' past the {record.bytes} bytes it was created "
                         f"for, or past {settings.upload_max_parts} parts (or it is no longer pending)",
                         param="data") from refused
    return UploadPartObject(id=part.id, created_at=part.created_at, upload_id=upload_id).model_dump()


def complete_upload(settings: Settings, principal: accounts.Principal, upload_id: str, raw: bytes,
                    seconds: float) -> dict:
    accounts.batch_catalog(settings, principal)
    now = clock.now(settings.clock_offset_file)
    existing = uploads.get_upload(settings, upload_id)
    if existing is not None and existing.account_id == principal.account_id and existing.status == "completed":
        return upload_object(settings, existing, now)  # a completion retried after its answer was lost
    record = _pending_upload(settings, principal, upload_id, now)
    body = _body(raw, CompleteUploadBody)
    ids = body.part_ids
    if len(ids) > settings.upload_max_parts:
        raise BadRequest(f"An upload holds at most {settings.upload_max_parts} parts; part_ids names {len(ids)}",
                         param="part_ids")
    if len(set(ids)) != len(ids):
        raise BadRequest("part_ids names a part more than once", param="part_ids")
    found = uploads.get_parts(settings, upload_id, ids)
    missing = [part_id for part_id in ids if part_id not in found]
    if missing:
        raise BadRequest(f"part_ids names parts this upload does not have: {', '.join(missing[:5])[:300]}",
                         param="part_ids")
    parts = [found[part_id] for part_id in ids]
    size = sum(part.size for part in parts)
    if size != record.bytes:
        raise BadRequest(f"The parts hold {size} bytes; the upload was created for {record.bytes}", param="bytes")
    file = files.FileRecord(
        id=files.new_file_id(now), account_id=principal.account_id, purpose="batch", filename=record.filename,
        bytes=size, created_at=int(now), expires_at=int(now) + settings.file_lifetime_seconds, status="processed",
        objects=[part.object_key for part in parts],
    )
    if body.md5 is not None:
        _check_md5(settings, file, body.md5.strip().lower(), seconds)
    try:
        uploads.complete(settings, record, file, max_files=settings.file_max_stored,
                         max_bytes=settings.file_max_stored_bytes)
    except files.FileCapReached as refused:
        raise cap_refused(settings) from refused
    except uploads.UploadNotPending as late:
        raise Conflict(f"Upload '{upload_id}' is no longer pending: only a pending upload takes parts, completes "
                       "or cancels", code="upload_not_pending") from late
    except TransactionConflict as conflict:
        raise busy("completing the upload") from conflict
    uploads.delete_parts(settings, upload_id, keep=set(ids))
    return upload_object(settings, record.model_copy(update={"status": "completed", "file_id": file.id}), now)


def _check_md5(settings: Settings, file: files.FileRecord, expected: str, seconds: float) -> None:
    until = time.monotonic() + seconds
    digest = hashlib.md5(usedforsecurity=False)
    for key in file.objects:
        stream = objects.get(settings.payload_bucket_name, key).stream
        try:
            for chunk in stream.iter_chunks(MD5_READ_CHUNK_BYTES):
                digest.update(chunk)
                if time.monotonic() > until:
                    raise ServiceUnavailable("The parts could not be read back in time to check md5; nothing was "
                                             "completed. Retry, or complete without md5", retry_after=1)
        finally:
            stream.close()
    if digest.hexdigest() != expected:
        raise BadRequest(f"md5 does not match the parts' content (theirs is {digest.hexdigest()})", param="md5")


def cancel_upload(settings: Settings, principal: accounts.Principal, upload_id: str) -> dict:
    now = clock.now(settings.clock_offset_file)
    record = _pending_upload(settings, principal, upload_id, now)
    if not uploads.end(settings, record, "cancelled"):
        raise Conflict(f"Upload '{upload_id}' is no longer pending: only a pending upload takes parts, completes "
                       "or cancels", code="upload_not_pending")
    return upload_object(settings, record.model_copy(update={"status": "cancelled"}), now)
