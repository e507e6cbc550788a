"""The batch table's keys: how an item of a batch is found (the items themselves: batch_table.py)."""

from __future__ import annotations

from typing import Any

from freeinference_batch.store.batch_record import BatchRecord
from freeinference_batch.store.dynamo import key

META = "META"
# The sparse indexes' one partition each: unfinished batches by expiry, finished ones by purge time.
OPEN_SHARD = "OPEN"
PURGE_SHARD = "PURGE"
COUNTER_KEY = key("COUNTER", "RESULT_IDS")


def batch_pk(batch_id: str) -> str:
    return f"BATCH#{batch_id}"


def created_key(batch_id: str) -> str:
    """The owner index's sort key, derived from the id alone: ids begin with the creation time
    in microseconds (14 hex digits), so a list cursor needs no stored item."""
    micros = int(batch_id[6:20], 16)
    return f"{micros:017d}#{batch_id}"


def batch_id_of(item: dict) -> str:
    """The batch id of any item of a batch (index queries answer keys only)."""
    return item["pk"].removeprefix("BATCH#")


def meta_key(batch_id: str) -> dict:
    return key(batch_pk(batch_id), META)


def record_of(item: dict[str, Any] | None) -> BatchRecord | None:
    """The batch record of a META item as `from_item` gives it (None for no item)."""
    return None if item is None else BatchRecord.model_validate(item)


def chunk_sk(number: int) -> str:
    return f"IN#{number:05d}"


def request_key(batch_id: str, position: int) -> dict:
    return key(batch_pk(batch_id), f"REQ#{position:09d}")


def lane_sk(model: str) -> str:
    return f"LANE#{model}"


def lane_positions_sk(model: str) -> str:
    return f"LANEPOS#{model}"


def chain_sk(model: str, chain: int) -> str:
    return f"{lane_sk(model)}#{chain:05d}"


def chain_key(batch_id: str, model: str, chain: int) -> dict:
    return key(batch_pk(batch_id), chain_sk(model, chain))
