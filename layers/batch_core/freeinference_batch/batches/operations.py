"""Create, read, list, cancel and delete batches: what the API's endpoints do."""

from __future__ import annotations

import re
import zlib
from collections import Counter
from dataclasses import dataclass

from botocore.exceptions import ClientError

from freeinference_batch import accounts
from freeinference_batch.accounts import Principal
from freeinference_batch.batches import dispatch, idempotency, jobs, lifecycle, validation, views
from freeinference_batch.core import clock, pages
from freeinference_batch.core.catalog import Catalog
from freeinference_batch.core.errors import (
    BadRequest,
    Conflict,
    NotFound,
    PayloadTooLarge,
    TooManyRequests,
    busy,
)
from freeinference_batch.core.ids import time_ordered_id
from freeinference_batch.core.observability import log_status_change, logger
from freeinference_batch.core.schemas import (
    BatchJob,
    BatchStatus,
    CheckedRequest,
    CreateFileBatchBody,
    DeletedBatch,
    Page,
)
from freeinference_batch.core.settings import Settings
from freeinference_batch.ops import schedules
from freeinference_batch.store import batch_files, batch_status, files, input_chunks
from freeinference_batch.store.batch_record import BatchRecord
from freeinference_batch.store.batch_table import BatchTable
from freeinference_batch.store.dynamo import TransactionConflict, TransactionFailed, transact
from freeinference_batch.store.runs import RunWrites

# Matched whole (fullmatch): `$` alone would also take a trailing newline.
BATCH_ID = re.compile(r"batch_[0-9a-f]{32}")
# A limit as the spec writes it: ASCII digits only. int() would also read "1_0", " +5 " and other
# scripts' digits, which no documented client sends and openapi.yaml does not allow.
LIMIT = re.compile(r"[0-9]+")


# ---- create -----------------------------------------------------------------------------


def new_batch_id(now: float) -> str:
    """`batch_` + the creation time in microseconds (14 hex digits) + 72 random bits (18 hex).

    Time-ordered, so an id alone says where its batch stands in its owner's list (a list cursor
    keeps working after that batch is deleted); the random part keeps ids unguessable."""
    return time_ordered_id("batch_", now)


def decode_body(body: bytes, content_encoding: str | None, limit: int) -> bytes:
    """The raw create body, decompressed if sent gzipped; the size limit applies decompressed."""
    encoding = (content_encoding or "identity").strip().lower()
    if encoding in ("gzip", "x-gzip", "deflate"):
        return _inflate(body, encoding, limit)
    if encoding != "identity":
        raise BadRequest(f"Content-Encoding {content_encoding!r} is not supported; send gzip or no encoding")
    if len(body) > limit:
        raise _too_large(limit, len(body))
    return body


# The compressed body is fed in pieces of this size: at the end of a gzip member zlib hands back
# the input it did not use as a copy, so a piece bounds that copy (a body of 200,000 empty members
# stays linear).
_INFLATE_PIECE = 8192


def _inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """A gzip body to its end, every member of it (RFC 1952: `gzip` tools and some clients write
    several, one after another), or one deflate (zlib) stream; never inflated past `limit` bytes
    in all (zip bombs)."""
    gzip_members = encoding != "deflate"
    wbits = zlib.MAX_WBITS | (16 if gzip_members else 0)
    inflater = zlib.decompressobj(wbits)
    view = memoryview(body)
    out = bytearray()
    pending: bytes | memoryview = b""
    position = 0
    while True:
        if not pending:
            if position >= len(body):
                break
            pending = view[position:position + _INFLATE_PIECE]
            position += len(pending)
        if inflater.eof:
            if not gzip_members:
                raise BadRequest(f"The body is not valid {encoding} data: it goes on after the end of its stream")
            inflater = zlib.decompressobj(wbits)  # the next member
        try:
            out += inflater.decompress(pending, limit + 1 - len(out))
        except zlib.error:
            raise BadRequest(f"The body is not valid {encoding} data") from None
        if len(out) > limit or inflater.unconsumed_tail:
            raise _too_large(limit)
        pending = inflater.unused_data
    if not inflater.eof:
        # A stream cut short (no end of stream, or a gzip trailer missing or incomplete): its
        # CRC and length were never checked, and what did arrive may be part of a batch.
        raise BadRequest(f"The body is not complete {encoding} data: it ends before the end of its stream")
    return bytes(out)


def _too_large(limit: int, size: int | None = None) -> PayloadTooLarge:
    got = f"is {size} bytes" if size is not None else "is larger than that"
    mib = limit / (1024 * 1024)
    return PayloadTooLarge(f"The request body {got}; the limit is {limit} bytes ({mib:g} MiB). "
                           "Split the job into several batches")


@dataclass(frozen=True)
class Created:
    """What create answers: the batch object, and whether it is a replay of an earlier create
    with the same Idempotency-Key (then it is that create's answer, unchanged)."""

    batch: dict
    replayed: bool = False


def create_batch(settings: Settings, principal: Principal, body: bytes, content_encoding: str | None,
                 idempotency_key: str | None = None) -> Created:
    catalog = accounts.batch_catalog(settings, principal)
    raw = decode_body(body, content_encoding, settings.batch_max_body_bytes)
    key = idempotency.parse(principal.account_id, idempotency_key, raw)
    if key is not None:
        # One read answers a retry before any work: no validation, nothing stored.
        original = idempotency.replay(settings, key, clock.now(settings.clock_offset_file))
        if original is not None:
            return Created(original, replayed=True)
    file_form = validation.parse_file_form(raw)
    if file_form is not None:
        return create_from_file(settings, principal, file_form, key)
    requests, metadata = validation.parse_create_body(raw, catalog, principal.tier, settings.batch_max_requests)
    return store_batch(settings, principal, catalog, requests, metadata, key)


def create_from_file(settings: Settings, principal: Principal, body: CreateFileBatchBody,
                     key: idempotency.IdempotencyKey | None) -> Created:
    """A batch of the lines of an input file (OpenAI's form): its META alone, `validating` and
    unchecked, with the account's unfinished count; its `validate` job then checks and stores the
    lines in the background (batches/file_batches.py), as 200 MB cannot be read in an API call."""
    record = files.get_file(settings, principal.account_id, body.input_file_id)
    if record is None:
        # Unknown, deleted, expired and another account's read the same: an id cannot probe.
        raise BadRequest(f"No file {validation.quote(body.input_file_id)} found; upload the input with purpose "
                         "'batch' (POST /v1/files) and name its id", code="file_not_found", param="input_file_id")
    if record.purpose != "batch":
        raise BadRequest(f"File {record.id} has purpose {record.purpose!r}; a batch's input file must have "
                         "purpose 'batch'", param="input_file_id")
    now = clock.now(settings.clock_offset_file)
    created_at = int(now)
    batch_id = new_batch_id(now)
    window = settings.batch_completion_window_seconds  # from create, as an inline batch's
    meta = batch_status.new_meta(
        batch_id, account_id=principal.account_id, key_hash=principal.key_hash, created_at=created_at,
        window_seconds=window, total=0, metadata=body.metadata, id_base=0, chunk_starts=[], lane_widths={},
        ttl=batch_status.created_ttl(settings, created_at), input_file_id=record.id,
        unchecked=True)
    elements = batch_status.create(settings, meta)
    answer = views.batch_object(BatchRecord.model_validate(meta))
    if key is not None:
        elements.append(idempotency.record_element(settings, key, batch_id, answer, now))
    try:
        transact(elements)
    except TransactionFailed as failure:
        # META exists: an earlier try of this transaction committed (see store_batch); carry on.
        if not (failure.failed(0) and BatchTable(settings).get_meta(batch_id) is not None):
            return _refused(settings, key, failure)
    try:
        jobs.send(settings, BatchJob(kind="validate", batch_id=batch_id))
    except Exception:
        # The batch is stored: answered 200 all the same (a 5xx would make a client create it
        # twice). Without its check it stays validating until its window closes (expired).
        logger.exception("could not queue a file batch's check", extra={"batch_id": batch_id})
    return Created(answer)


def store_batch(settings: Settings, principal: Principal, catalog: Catalog, requests: list[CheckedRequest],
                metadata: dict[str, str] | None, key: idempotency.IdempotencyKey | None, *,
                retry_of: str | None = None, input_file_id: str | None = None) -> Created:
    """Store a new batch of checked requests and start it: the one writer of a batch, for a create
    and for a retry's child alike. Every item but META first, then META with the account's
    unfinished count (and the Idempotency-Key's record) in one transaction: the batch is visible
    whole or not at all, however large."""
    table = BatchTable(settings)
    now = clock.now(settings.clock_offset_file)
    created_at = int(now)
    batch_id = new_batch_id(now)
    window = settings.batch_completion_window_seconds
    ttl = batch_status.created_ttl(settings, created_at)
    id_base = table.reserve_result_ids(len(requests))

    # 1. Everything but META: invisible without it (a crash here leaves items TTL removes).
    items = []
    chunk_starts = []
    for number, run in enumerate(input_chunks.pack(requests)):
        chunk_starts.append(run.start)
        if run.oversized:
            items.append(table.chunk_item_in_s3(batch_id, number, run.data, ttl))
        else:
            items.append(table.chunk_item(batch_id, number, run.data, ttl))
    lanes = dispatch.plan_lanes(table, catalog, batch_id, [request.model for request in requests],
                                account_id=principal.account_id, key_hash=principal.key_hash,
                                lease_until=now + settings.batch_dispatch_lease_seconds, ttl=ttl)
    items.extend(lanes.items)
    table.put_items(items)

    # 2. META and the unfinished count together: the batch becomes visible whole, and two
    #    concurrent creates cannot both pass the limit.
    meta = batch_status.new_meta(batch_id, account_id=principal.account_id, key_hash=principal.key_hash,
                                 created_at=created_at, window_seconds=window, total=len(requests), metadata=metadata,
                                 id_base=id_base, chunk_starts=chunk_starts, lane_widths=lanes.widths, ttl=ttl,
                                 retry_of=retry_of, input_file_id=input_file_id)
    elements = batch_status.create(settings, meta)
    # The answer from the item as written, read the way every later read reads it.
    answer = views.batch_object(BatchRecord.model_validate(meta))
    if key is not None:
        # In the same transaction: the batch and its key's record commit together, or neither.
        elements.append(idempotency.record_element(settings, key, batch_id, answer, now))
    try:
        transact(elements)
    except TransactionFailed as failure:
        if failure.failed(0) and table.get_meta(batch_id) is not None:
            # META exists: only this call can have written it (the id is new), so an earlier try
            # of this same transaction committed and its answer was lost (botocore re-sends after
            # a 5xx or a reset connection). The batch is stored: carry on, never purge it.
            dispatch.start_chains(settings, table, batch_id, lanes)
            return Created(answer)
        # Nothing of it is visible: remove what step 1 stored (its S3 objects by name, so the API
        # needs no right to list the bucket).
        table.purge(batch_id, s3_keys=[item["s3_key"]["S"] for item in items if "s3_key" in item])
        return _refused(settings, key, failure)

    # 3. Start the chains. The batch is stored: whatever happens now, the answer is 200 (a 5xx
    #    would make a client retry and create it twice), and the sweep starts what this misses.
    dispatch.start_chains(settings, table, batch_id, lanes)
    return Created(answer)


def _refused(settings: Settings, key: idempotency.IdempotencyKey | None, failure: TransactionFailed) -> Created:
    """A create's transaction refused (META, the unfinished count, the key's record): the
    concurrent create with this key's answer, else a 503 to retry or the limit's 429."""
    if key is not None and failure.failed(2):
        # A concurrent create with this key won: its batch is the answer (or 422).
        original = idempotency.replay(settings, key, clock.now(settings.clock_offset_file))
        if original is not None:
            return Created(original, replayed=True)
    # Only the counter's condition is the limit. Conflicts with other writes (the counter is
    # shared with every create, cancel and finish of the account) are a reason to retry.
    if isinstance(failure, TransactionConflict) or not failure.failed(1):
        raise busy("creating the batch") from None
    raise TooManyRequests(
        f"You already have {settings.batch_max_unfinished} unfinished batches, the most allowed; "
        "wait for one to finish (or cancel one) before creating another",
        code="too_many_unfinished_batches",
    ) from None


# ---- read -------------------------------------------------------------------------------


def visible_meta(meta: BatchRecord | None, account_id: str, now: float) -> bool:
    if meta is None or meta.account_id != account_id:
        return False
    if meta.status in (BatchStatus.CREATING, BatchStatus.DELETED):
        return False
    # Past retention the batch is gone, whether or not the purge has reached it yet.
    return not (lifecycle.is_final(meta.status) and meta.purge_at is not None and now >= meta.purge_at)


def owned_meta(settings: Settings, principal: Principal, batch_id: str) -> BatchRecord:
    if BATCH_ID.fullmatch(batch_id or ""):
        meta = BatchTable(settings).get_meta(batch_id)
        if meta is not None and visible_meta(meta, principal.account_id, clock.now(settings.clock_offset_file)):
            return meta
    raise NotFound(f"Batch {batch_id[:100]!r} not found", code="batch_not_found")


def get_batch(settings: Settings, principal: Principal, batch_id: str) -> dict:
    return views.batch_object(owned_meta(settings, principal, batch_id))


def parse_limit(value: str | None, default: int, maximum: int) -> int:
    """`limit` from the query: absent is the default; anything but ASCII digits (an empty value
    included) is refused, naming the parameter."""
    if value is None:
        return default
    if not LIMIT.fullmatch(value):
        raise BadRequest(f"limit must be an integer from 1 to {maximum} in ASCII digits (got {value[:40]!r})",
                         param="limit")
    digits = value.lstrip("0")
    # More digits than the maximum has is out of range (and int() refuses over 4300 digits).
    limit = int(digits or "0") if len(digits) <= len(str(maximum)) else maximum + 1
    if not 1 <= limit <= maximum:
        raise BadRequest(f"limit must be from 1 to {maximum} (got {value[:40]})", param="limit")
    return limit


def list_batches(settings: Settings, principal: Principal, limit: int, after: str | None) -> dict:
    table = BatchTable(settings)
    now = clock.now(settings.clock_offset_file)
    start_key = None
    if after is not None:  # present, even empty: a cursor the caller meant to send
        if not BATCH_ID.fullmatch(after):
            raise BadRequest(f"after must be a batch id such as a page's last_id (got {after[:100]!r})",
                             param="after")
        # From the id alone, in the caller's own list: the batch may have been deleted or purged
        # since the previous page, and another account's id gives only a time, never its items.
        start_key = table.owner_index_start(principal.account_id, after)
    found: list[BatchRecord] = []
    while len(found) <= limit:
        page, start_key = table.list_owner(principal.account_id, limit + 1 - len(found), start_key)
        found.extend(m for m in page if visible_meta(m, principal.account_id, now))
        if not start_key:
            break
    # At most `limit` batches, and no more than the page's byte budget (a batch object stays far
    # under it, so a page always carries at least one).
    data: list[dict] = []
    budget = pages.Budget(settings.batch_page_budget_bytes)
    for meta in found[:limit]:
        batch = views.batch_object(meta)
        cost = pages.invoke_bytes(batch)
        if data and not budget.fits(cost):
            break
        budget.take(cost)
        data.append(batch)
    has_more = len(found) > len(data)
    return Page(data=data, has_more=has_more, first_id=data[0]["id"] if data else None,
                last_id=data[-1]["id"] if data else None).model_dump(mode="json")


# ---- cancel and delete ------------------------------------------------------------------


def cancel_batch(settings: Settings, principal: Principal, batch_id: str) -> dict:
    for _ in range(10):
        meta = owned_meta(settings, principal, batch_id)
        if meta.ending is not None and meta.status != BatchStatus.CANCELLING:
            raise writing_files(meta)
        if meta.status not in lifecycle.RUNNABLE:
            return views.batch_object(meta)  # finished or already cancelling: unchanged
        now = int(clock.now(settings.clock_offset_file))
        if meta.running == 0 and lifecycle.writes_files(meta, BatchStatus.CANCELLED):
            # A file batch: cancelling while its files are written, then cancelled (its job).
            if lifecycle.end_with_files(settings, meta, BatchStatus.CANCELLED, now) is None:
                continue
        elif meta.running == 0:
            # The final transition, as try_finalize writes it (cancelling and cancelled at once).
            try:
                transact(batch_status.finish(settings, meta, BatchStatus.CANCELLED, now))
            except TransactionConflict:
                raise busy("cancelling the batch") from None
            except TransactionFailed:
                continue  # a request started meanwhile: look again
            log_status_change("batch cancelled", batch_id, BatchStatus.CANCELLED, meta.status)
        else:
            updated = batch_status.start_cancelling(settings, meta, now)
            if updated is None:
                continue
            log_status_change("batch cancelling", batch_id, BatchStatus.CANCELLING, meta.status)
        return views.batch_object(owned_meta(settings, principal, batch_id))
    # The batch kept changing under us (requests starting and settling): a passing condition.
    raise busy("cancelling the batch")


def writing_files(meta: BatchRecord) -> Conflict:
    """A batch's files are being written (its end is decided): no cancel, no delete until it shows it."""
    return Conflict(f"Batch {meta.id} is {meta.status}: its output and error files are being written as it "
                    f"becomes {meta.ending}; try again once it is {meta.ending}", code="batch_finalizing")


# Of the API's 29 s, what a delete spends deleting stored responses (about 10,000 a second).
DELETE_RESPONSES_SECONDS = 15.0


def delete_batch(settings: Settings, principal: Principal, batch_id: str) -> dict:
    table = BatchTable(settings)
    meta = owned_meta(settings, principal, batch_id)
    now = int(clock.now(settings.clock_offset_file))
    if meta.running:
        # Refused only while a request really runs: a run that died (its request's lease, and its
        # chain's, passed) runs nothing, but holds `running` until the sweep takes it back. Take
        # it back now as the sweep would, counting what it settled (its cost charged to the
        # account) before the batch goes, and look again.
        schedules.take_back_dead_runs(settings, table, RunWrites(settings, table), meta, now, Counter(),
                                      resend=False)
        meta = owned_meta(settings, principal, batch_id)
    if meta.ending is not None:
        raise writing_files(meta)
    running = meta.running
    if running:
        raise Conflict(f"Batch {batch_id} is {meta.status} with {running} request{'s' if running != 1 else ''} "
                       "running; cancel it and wait for them to finish, then delete it", code="batch_running")
    try:
        transact(batch_status.delete(settings, meta, now))
    except TransactionConflict:
        raise busy("deleting the batch") from None
    except TransactionFailed:
        raise Conflict(f"Batch {batch_id} changed while it was being deleted (a request may have started); "
                       "cancel it, wait for it to finish, then delete it", code="batch_running") from None
    log_status_change("batch deleted", batch_id, BatchStatus.DELETED, meta.status)
    # After the batch is deleted (no new link to a response is given from now on), its stored
    # responses go, so the links already given stop working now, not when they expire. Bounded
    # within the API's 30 s; what is left (a batch of tens of thousands of stored responses) the
    # purge, due at once, deletes with the rest of the batch.
    try:
        if not table.delete_responses(batch_id, DELETE_RESPONSES_SECONDS):
            logger.warning("deleted batch's responses left for the purge", extra={"batch_id": batch_id})
    except ClientError:  # the batch is deleted all the same: the purge deletes them
        logger.exception("could not delete a deleted batch's responses", extra={"batch_id": batch_id})
    if meta.input_file_id is not None:
        # Its output and error files go with it: their items (their content is a 404 at once), then
        # their objects. Should either fail, the batch is deleted all the same: the purge, due at
        # once, deletes them.
        try:
            files.delete_batch_files(settings, batch_id)
            batch_files.delete_objects(settings, batch_id)
        except ClientError:
            logger.exception("could not delete a deleted batch's files", extra={"batch_id": batch_id})
    return DeletedBatch(id=batch_id).model_dump(mode="json")


