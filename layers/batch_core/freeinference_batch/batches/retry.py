"""Retrying a finished batch (issue 33): a new batch, the child, holding exactly the parent's
requests whose results ended in the statuses asked for (`failed` and `expired` by default), with
their custom ids and bodies as stored, in the parent's order.

The child is a batch like any other: its requests are checked again as a create's are (a model
gone since refuses the retry), it is stored by create's own writer (`operations.store_batch`: the
unfinished-batch limit, the Idempotency-Key's record, nothing visible until all of it is stored),
and it runs under the account of the key that asked for it. It shares nothing with its parent but
the `retry_of` on its META: it has its own input chunks (and its own S3 copies of large bodies),
so deleting either leaves the other whole. The parent is only read.
"""

from __future__ import annotations

import bisect
import json

from freeinference_batch import accounts
from freeinference_batch.accounts import Principal
from freeinference_batch.batches import idempotency, operations, validation, views
from freeinference_batch.batches.operations import Created
from freeinference_batch.core import clock
from freeinference_batch.core.catalog import Catalog
from freeinference_batch.core.errors import BadRequest, Conflict, PayloadTooLarge
from freeinference_batch.core.schemas import (
    FINAL_STATUSES,
    RETRYABLE_STATUSES,
    CheckedRequest,
    RetryBatchBody,
    parse_body,
)
from freeinference_batch.core.settings import Settings
from freeinference_batch.store.batch_record import BatchRecord
from freeinference_batch.store.batch_table import BatchTable

# A retry's body holds two small fields: metadata is at most 16 pairs of 64 + 512 characters, under
# 256 KiB however its characters are escaped (12 bytes for a character beyond the BMP).
RETRY_MAX_BODY_BYTES = 256 * 1024


def retry_batch(settings: Settings, principal: Principal, batch_id: str, body: bytes,
                content_encoding: str | None, idempotency_key: str | None = None) -> Created:
    """`POST /v1/batches/{batch_id}/retry`: the child, answered as create answers a new batch."""
    catalog = accounts.batch_catalog(settings, principal)
    try:
        raw = operations.decode_body(body, content_encoding, RETRY_MAX_BODY_BYTES)
    except PayloadTooLarge:
        # Not create's words: there is no job to split, only a body far larger than two fields need.
        raise PayloadTooLarge(f"A retry's body holds statuses and metadata, at most {RETRY_MAX_BODY_BYTES} bytes; "
                              "this one is larger") from None
    # The key stands for this parent and this body: the same body retrying another batch, or a
    # create, is another request (422 with the same key).
    key = idempotency.parse(principal.account_id, idempotency_key, f"retry {batch_id}\n".encode() + raw)
    if key is not None:
        original = idempotency.replay(settings, key, clock.now(settings.clock_offset_file))
        if original is not None:
            return Created(original, replayed=True)
    asked = parse_body(raw, RetryBatchBody)
    statuses = checked_statuses(asked.statuses)
    validation.validate_metadata(asked.metadata)

    parent = operations.owned_meta(settings, principal, batch_id)
    if parent.status not in FINAL_STATUSES:
        raise Conflict(f"Batch {parent.id} is {parent.status}; only a finished batch (completed, failed, expired "
                       "or cancelled) can be retried. Wait for it to finish, or cancel it first",
                       code="batch_not_final")
    table = BatchTable(settings)
    positions = chosen_positions(table, parent, statuses)
    if not positions:
        raise BadRequest(f"Batch {parent.id} has no request that is {' or '.join(statuses)}; there is nothing "
                         "to retry", code="nothing_to_retry", param="statuses")
    requests = parent_requests(table, parent, positions, catalog, principal.tier)
    # Without `metadata` the child carries the parent's; an explicit null carries none.
    metadata = asked.metadata if "metadata" in asked.model_fields_set else parent.metadata
    # A file batch's child carries its parent's input file: it is a file batch too (its results
    # are also written as output and error files), its requests already checked and stored.
    return operations.store_batch(settings, principal, catalog, requests, metadata, key, retry_of=parent.id,
                                  input_file_id=parent.input_file_id)


def checked_statuses(given: list[str]) -> list[str]:
    """The statuses asked for, each once, in the order given; 400 naming any that a retry cannot take."""
    unknown = [status for status in given if status not in RETRYABLE_STATUSES]
    if unknown:
        raise BadRequest(f"Unsupported statuses: {', '.join(validation.quote(s) for s in unknown)}; a retry takes "
                         f"{', '.join(RETRYABLE_STATUSES)}", param="statuses")
    return list(dict.fromkeys(given))


def chosen_positions(table: BatchTable, parent: BatchRecord, statuses: list[str]) -> list[int]:
    """The positions of the parent's requests whose results show one of `statuses`, ascending.

    A request that never ran has no item: its status is its final batch's (cancelled, expired,
    failed), as its result line shows it."""
    stored = table.request_statuses(parent.id, parent.total)
    wanted = set(statuses)
    return [position for position in range(parent.total)
            if views.result_status(parent, {"status": stored[position]} if position in stored else None)[0]
            in wanted]


def parent_requests(table: BatchTable, parent: BatchRecord, positions: list[int], catalog: Catalog,
                    tier: str) -> list[CheckedRequest]:
    """The parent's requests at `positions`, read from its input chunks (only the chunks that hold
    one), then checked again as create checks them. A message names a request by its place in the
    parent (`requests[<i>]`, where the parent's create had it) and its custom_id. The child keeps
    each body's stored bytes, so it sends upstream exactly what the parent did."""
    starts = parent.chunk_starts
    stored: list[CheckedRequest] = []
    run, number = None, -1
    for position in positions:
        at = bisect.bisect_right(starts, position) - 1
        if at != number:
            run, number = table.get_chunk(parent.id, at), at
        assert run is not None
        index = position - starts[number]
        stored.append(CheckedRequest(run.custom_ids[index], run.models[index], run.body(index)))
    lines = [{"custom_id": r.custom_id, "body": json.loads(r.body)} for r in stored]
    validation.check_requests(lines, lines, catalog, tier, label=lambda i: validation.requests_label(positions[i]))
    return stored
