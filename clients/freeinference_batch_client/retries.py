"""A batch's retries, followed back through `retry_of` to the batch first submitted, and their
results merged: for each custom_id, its latest outcome (a child's over its parent's).

    chain = lineage(client, "batch_...")          # the batch and the batches it retries, newest first
    for line in merged_results(client, chain):    # the first batch's order, each line the newest
        ...
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from freeinference_batch_client.client import BatchClient
from freeinference_batch_client.errors import BatchApiError
from freeinference_batch_client.models import Batch, ResultLine


@dataclass(frozen=True)
class Lineage:
    """A batch and the batches it retries, newest first (`batches[0]` is the one asked for), as far
    back as they can be read. `deleted` is the id of the first one that could not be (deleted, or
    past its retention: the API answers 404), else None: the oldest read retries nothing."""

    batches: list[Batch]
    deleted: str | None = None


def lineage(client: BatchClient, batch_id: str) -> Lineage:
    batches = [client.retrieve(batch_id)]
    while (parent := batches[-1].retry_of) is not None:
        if any(batch.id == parent for batch in batches):
            break  # a parent is older than its child, so this never happens; never loop if it did
        try:
            batches.append(client.retrieve(parent))
        except BatchApiError as error:
            if error.status != 404:
                raise
            return Lineage(batches, deleted=parent)
    return Lineage(batches)


def merged_results(client: BatchClient, chain: Lineage) -> Iterator[ResultLine]:
    """Every custom_id of the chain once, in the oldest batch's order, with the result of the newest
    batch that holds it.

    A child holds some of its parent's requests, in the parent's order (the server keeps it), so
    one pass over each batch's results, side by side, merges them: a page of each at a time in
    memory, whatever the batches hold."""
    merged = client.iter_results(chain.batches[0].id)
    for older in chain.batches[1:]:
        merged = _overlay(client.iter_results(older.id), merged)
    return merged


def _overlay(older: Iterator[ResultLine], newer: Iterator[ResultLine]) -> Iterator[ResultLine]:
    """`older`'s lines, each replaced by `newer`'s line of the same custom_id (`newer` holds some
    of them, in the same order)."""
    pending = next(newer, None)
    for line in older:
        if pending is not None and pending.custom_id == line.custom_id:
            yield pending
            pending = next(newer, None)
        else:
            yield line
    # Had a newer line no place in order among the older ones, it still is not lost.
    if pending is not None:
        yield pending
        yield from newer
