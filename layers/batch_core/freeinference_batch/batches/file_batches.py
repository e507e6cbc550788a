"""A batch created from a file (OpenAI's form): the `validate` job that checks its lines and
stores them, in the background (the API only writes its META, `validating` and `unchecked`:
reading and checking 200 MB does not fit in an API call).

Each line is OpenAI's batch input line (`custom_id`, `method`, `url`, `body`), checked by the
rules of an inline request (batches/validation.py): the same messages, naming a line by its
custom_id (its number is the error's `line`). The step reads the file twice, never holding it:

1. check every line, keeping only each custom_id (uniqueness) and the count. Any bad line: the
   batch is `failed` with `errors.data[]` naming the first ERRORS_MAX bad lines, nothing of it
   stored or run, and the account's unfinished batch given back (one conditional write).
2. read it again and store the requests exactly as a create does (operations.store_batch: input
   chunks, lanes, result ids), a block at a time; then the one write that makes META whole
   (`batch_status.checked`: only while it is still validating and unchecked), then its chains.

Resumable and idempotent: every item step 2 writes is the same whichever run writes it (the
file does not change), lanes are written only where none is (a late second run cannot reset a
chain that already moved), and only the run whose `checked` write lands starts the chains. A
run that dies starts again from the beginning; a run that finds the batch checked, failed,
cancelled, expired or deleted does nothing. Measured (bench/file_batch_create.py, moto): 50,000
lines and 200 MB checked and stored in 15 s with ~70 MB of working memory; on AWS the chunk writes
(one partition key, ~1,000 WCU/s) bound it near 2 minutes for incompressible text, inside 840 s.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from freeinference_batch import accounts
from freeinference_batch.batches import dispatch, lifecycle, validation
from freeinference_batch.core import clock
from freeinference_batch.core.catalog import Catalog, load_catalog
from freeinference_batch.core.errors import BadRequest
from freeinference_batch.core.observability import log_status_change, logger
from freeinference_batch.core.schemas import BatchErrors, BatchStatus, CheckedRequest, LineError
from freeinference_batch.core.settings import Settings
from freeinference_batch.store import batch_status, files, input_chunks
from freeinference_batch.store.batch_record import BatchRecord
from freeinference_batch.store.batch_table import BatchTable
from freeinference_batch.store.dynamo import TransactionConflict, TransactionFailed, transact

# `errors.data` names at most this many bad lines (the first ones), and cuts each message to
# MESSAGE_MAX characters: 1,000 entries stay near 250 KB, inside META's 400 KB item.
ERRORS_MAX = 1000
MESSAGE_MAX = 200
# Step 2 packs and writes this much request JSON at a time: its memory, whatever the file's size.
BLOCK_BYTES = 8 * 1024 * 1024
# The share of a step's time its check may take (the rest is for storing what it checked).
CHECK_SHARE = 1 / 3


class FileCheckFailed(Exception):
    """The file's lines broke the rules: why, as `errors.data`."""

    def __init__(self, errors: list[LineError]) -> None:
        super().__init__(f"{len(errors)} bad line(s)")
        self.errors = errors


def validate(settings: Settings, batch_id: str, deadline: float) -> bool:
    """The `validate` job's step (batches/jobs.py): check the batch's file and store or fail it.
    Always done in one step (measured far inside an invocation); answers True."""
    started = time.monotonic()
    # The check has a third of the step's time: storing reads the file again and writes it (about
    # the check's time again, bench/file_batch_create.py) and must end inside the step too.
    check_until = started + (deadline - started) * CHECK_SHARE
    table = BatchTable(settings)
    meta = table.get_meta(batch_id)
    if meta is None or not meta.unchecked or meta.status != BatchStatus.VALIDATING:
        return True  # checked by an earlier run, or cancelled, expired, failed or deleted meanwhile
    now = clock.now(settings.clock_offset_file)
    owner = accounts.owner_check(settings, meta.key_hash, meta.account_id, at=now)
    if owner.status is accounts.OwnerStatus.UNAUTHORIZED:
        lifecycle.fail_batch(settings, meta, now, "owner_unauthorized", owner.reason)  # as the worker does
        return True
    assert meta.input_file_id is not None  # unchecked only on a file batch
    record = files.get_file(settings, meta.account_id, meta.input_file_id)
    if record is None:
        _fail(settings, meta, [LineError(code="file_not_found", param="input_file_id", message=(
            f"The input file {meta.input_file_id} was deleted (or expired) before its lines were checked"))])
        return True
    catalog = load_catalog(settings.model_catalog_path)
    try:
        total = check_lines(files.iter_lines(settings, record), catalog, owner.tier, settings.batch_max_requests,
                            check_until)
        store_requests(settings, table, meta, files.iter_lines(settings, record), catalog, owner.tier, total)
    except FileCheckFailed as failed:
        _fail(settings, meta, failed.errors)
    return True


def numbered_lines(lines: Iterator[bytes]) -> Iterator[tuple[int, bytes]]:
    """Each line that holds something, with its 1-based number in the file. Blank lines (a
    trailing one, or whitespace between requests) are skipped, as JSONL readers do."""
    for number, line in enumerate(lines, 1):
        if line.strip():
            yield number, line


def check_line(line: bytes, catalog: Catalog, tier: str) -> CheckedRequest:
    """One line as an inline request is checked (all but uniqueness); BadRequest naming it by its
    custom_id (`custom_id 'q-2': Model 'no-such-model' not found`)."""
    try:
        document: Any = json.loads(line)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise BadRequest(f"The line is not valid JSON: {str(error)[:100]}") from None
    named = isinstance(document, dict) and isinstance(document.get("custom_id"), str)
    # Named by its custom_id when it has one, else as "the line" (its number is the error's own).
    label = "" if named else "The line"
    return validation.validate_requests([document], catalog, tier, 1, label=lambda _: label)[0]


def _line_error(error: BadRequest, number: int) -> LineError:
    message = error.message if len(error.message) <= MESSAGE_MAX else error.message[:MESSAGE_MAX - 3] + "..."
    return LineError(code=error.code or "invalid_request", message=message, param=error.param, line=number)


def check_lines(lines: Iterator[bytes], catalog: Catalog, tier: str, max_requests: int, deadline: float) -> int:
    """Step 1: every line checked, nothing kept but the custom_ids; answers how many requests the
    file holds, or raises FileCheckFailed naming the first ERRORS_MAX bad lines."""
    seen: dict[str, int] = {}
    errors: list[LineError] = []
    count = 0
    for number, line in numbered_lines(lines):
        count += 1
        if count > max_requests:
            errors.append(LineError(code="too_many_requests", line=number, message=(
                f"The file holds more than {max_requests:,} requests, the most a batch holds; "
                "split it into several files")))
            break
        try:
            request = check_line(line, catalog, tier)
            first = seen.setdefault(request.custom_id, number)
            if first != number:
                raise BadRequest(f"custom_id {validation.quote(request.custom_id)} repeats line {first}; "
                                 "custom_id must be unique within the batch", param="custom_id")
        except BadRequest as error:
            errors.append(_line_error(error, number))
            if len(errors) >= ERRORS_MAX:
                break
        if count % 1000 == 0 and time.monotonic() > deadline:
            # Far beyond what 200 MB takes (bench/file_batch_create.py): fail it rather than loop.
            errors.append(LineError(code="file_check_timeout", line=number, message=(
                "The file could not be checked within the time one check has; split it into smaller files")))
            break
    if not count and not errors:
        errors.append(LineError(code="empty_file", message="The input file holds no requests", param="input_file_id"))
    if errors:
        raise FileCheckFailed(errors)
    return count


def store_requests(settings: Settings, table: BatchTable, meta: BatchRecord, lines: Iterator[bytes],
                   catalog: Catalog, tier: str, total: int) -> None:
    """Step 2: the file's requests stored as create stores them, then META made whole, then the
    chains started (only by the run whose META write lands)."""
    batch_id = meta.id
    chunk_starts: list[int] = []
    models: list[str] = []  # each request's, in order
    block: list[CheckedRequest] = []
    block_start, block_bytes, position = 0, 0, 0

    def flush() -> None:
        items = []
        for run in input_chunks.pack(block):
            number = len(chunk_starts)
            chunk_starts.append(block_start + run.start)
            if run.oversized:
                items.append(table.chunk_item_in_s3(batch_id, number, run.data, meta.ttl))
            else:
                items.append(table.chunk_item(batch_id, number, run.data, meta.ttl))
        table.put_items(items)

    for _, line in numbered_lines(lines):
        request = check_line(line, catalog, tier)  # checked in step 1: the same file, the same answer
        block.append(request)
        models.append(request.model)
        position += 1
        block_bytes += len(request.body)
        if block_bytes >= BLOCK_BYTES:
            flush()
            block, block_start, block_bytes = [], position, 0
    if block:
        flush()
    if position != total:  # the file changed between the reads: cannot happen to a stored file
        raise RuntimeError(f"input file {meta.input_file_id} read {position} requests, then {total}")

    now = clock.now(settings.clock_offset_file)
    lanes = dispatch.plan_lanes(table, catalog, batch_id, models, account_id=meta.account_id,
                                key_hash=meta.key_hash, lease_until=now + settings.batch_dispatch_lease_seconds,
                                ttl=meta.ttl)
    table.put_new_items(lanes.items)
    id_base = table.reserve_result_ids(total)
    updated = batch_status.checked(settings, batch_id, total=total, chunk_starts=chunk_starts,
                                   lane_widths=lanes.widths, id_base=id_base)
    if updated is None:
        # Cancelled, expired, failing or deleted meanwhile, or another run stored it first: nothing
        # starts (what this run wrote goes with the batch's purge, or its items' TTL).
        logger.info("file batch no longer waits for its check; not started", extra={"batch_id": batch_id})
        return
    logger.info("file batch checked and stored", extra={"batch_id": batch_id, "requests": total})
    dispatch.start_chains(settings, table, batch_id, lanes)


def _fail(settings: Settings, meta: BatchRecord, errors: list[LineError]) -> None:
    """validating (unchecked) -> failed with `errors`, the account's unfinished batch given back;
    nothing when another writer (a cancel, the expiry, another run) got there first."""
    now = clock.now(settings.clock_offset_file)
    body = BatchErrors(data=errors).model_dump(mode="json")
    try:
        transact(batch_status.finish(settings, meta, BatchStatus.FAILED, now, errors=body))
    except TransactionConflict:
        raise  # nothing refused it: the job's message comes back and the check runs again
    except TransactionFailed:
        logger.info("file batch changed before its failed check was written", extra={"batch_id": meta.id})
        return
    log_status_change("batch failed", meta.id, BatchStatus.FAILED, meta.status)
