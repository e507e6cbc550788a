"""Paging through a batch's results, in submission order."""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator

from freeinference_batch.accounts import Principal
from freeinference_batch.batches import views
from freeinference_batch.batches.operations import owned_meta
from freeinference_batch.core import pages
from freeinference_batch.core.errors import BadRequest
from freeinference_batch.core.schemas import Page, RequestStatus, ResultResponse
from freeinference_batch.core.settings import Settings
from freeinference_batch.store.batch_record import BatchRecord
from freeinference_batch.store.batch_table import BatchTable

# Matched whole, in ASCII digits: `\d` would take other scripts' digits, `$` a trailing newline.
RESULT_ID = re.compile(r"batch_req_([0-9]{1,18})")


def result_id(meta: BatchRecord, position: int) -> str:
    return f"batch_req_{meta.id_base + position}"


def position_after(meta: BatchRecord, after: str | None) -> int:
    """The position to start from: 0 without `after`, or the one after the result it names (an
    empty `after` is refused: it names nothing)."""
    if after is None:
        return 0
    match = RESULT_ID.fullmatch(after)
    if not match:
        raise BadRequest(f"after must be a result ID such as 'batch_req_42' (got {after[:100]!r})", param="after")
    position = int(match.group(1)) - meta.id_base
    if not 0 <= position < meta.total:
        raise BadRequest(f"after {after!r} is not a result of batch {meta.id}", param="after")
    return position + 1


def result_lines(table: BatchTable, meta: BatchRecord, first: int, last: int,
                 responses_from: int | None = None) -> Iterator[tuple[int, dict | None, dict]]:
    """(position, item or None, result line) of the requests from `first` to `last`, in order, as
    `meta` shows them; read as far as the caller goes. The responses of completed requests are
    read from position `responses_from` on (`first` when not given; before it, none is read)."""
    if first > last:
        return
    responses_from = first if responses_from is None else responses_from
    states = table.iter_requests(meta.id, first, last)
    stated, state_of_stated = next(states, (None, None))
    starts = meta.chunk_starts
    number = bisect.bisect_right(starts, first) - 1
    custom_ids = table.get_custom_ids(meta.id, number)
    for position in range(first, last + 1):
        if number + 1 < len(starts) and position >= starts[number + 1]:
            number += 1
            custom_ids = table.get_custom_ids(meta.id, number)
        while stated is not None and stated < position:
            stated, state_of_stated = next(states, (None, None))
        state = state_of_stated if stated == position else None
        response = None
        if state and state.get("status") == RequestStatus.COMPLETED and position >= responses_from:
            response = table.load_response(state)
        custom_id = custom_ids[position - starts[number]]
        yield position, state, views.result_line(meta, result_id(meta, position), custom_id, state, response)


def list_results(settings: Settings, principal: Principal, batch_id: str, limit: int, after: str | None) -> dict:
    meta = owned_meta(settings, principal, batch_id)
    table = BatchTable(settings)
    first = position_after(meta, after)
    last = min(meta.total, first + limit) - 1
    data: list[dict] = []
    budget = pages.Budget(settings.batch_page_budget_bytes)
    end = first  # the first position not on this page
    for position, state, line in result_lines(table, meta, first, last):
        cost = pages.invoke_bytes(line)
        if not budget.fits(cost):
            if data:
                break  # the next page starts with this line
            line = _linked(table, state, line)  # too big for any page: its body by a link
            cost = pages.invoke_bytes(line)
        budget.take(cost)
        data.append(line)
        end = position + 1
    return Page(
        data=data,
        has_more=end < meta.total,
        first_id=data[0]["id"] if data else None,
        last_id=data[-1]["id"] if data else None,
    ).model_dump(mode="json")


def _linked(table: BatchTable, state: dict | None, line: dict) -> dict:
    """A result line whose body is given by a presigned URL of the stored response instead.

    Only responses stored in S3 can be this big (inline ones are at most ~300 KB of JSON), so
    there is always an object to link to; a line that is somehow neither is left as it is."""
    if not state or "response_s3_key" not in state or not line.get("response"):
        return line
    linked = ResultResponse.model_validate({**line["response"], "body": None, "body_url": table.response_url(state)})
    return {**line, "response": linked.model_dump(mode="json")}
