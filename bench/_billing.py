"""Billing units of the AWS calls `_instrument.AwsCalls` counts, for the cost model:
- DynamoDB: read request units (4 KB steps, 0.5 for eventually consistent reads, at least one
  step per key read even when nothing is found) and write request units: 1 KB steps of the
  larger of the item before and after the write (DynamoDB bills an update by the bigger image,
  and a delete by the deleted item), 2x inside TransactWriteItems (a ConditionCheck too). A
  global secondary index is written only when the write changes what it holds: an item entering
  or leaving a sparse index is one index write, a changed index key two (delete + put), and
  with a KEYS_ONLY projection (the template's) an update that leaves the index's keys alone
  writes nothing to it; an ALL/INCLUDE index is written on any change while the item is in it.
  Index writes are counted once, not doubled by a transaction (an assumption). Item images
  come from moto's own store, read under moto's lock just before the call and right after it
  (another thread's write can fall in between: rare, and it only moves a size). The
  before-2026-12-03 rule (after-image only, every GSI the item is in written, as if all
  projected ALL) is kept as `old_wru`, for comparison.
  Every write is also counted by item (table, pk, sk): writes, transactional weight, units,
  and the item's size with the sizes of its collections that grow with the requests in flight
  (the slots items' `leases` maps), for the hot-item projection in aws_calls.py.
- SQS: one request per 64 KB of payload (send: message bodies; receive: the answer).
- S3: one request each.

Nothing here changes the service: it reads moto's store of this process only.
"""

from __future__ import annotations

import json
import math
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

# Item attributes that grow with the requests in flight: the slots items' `leases` maps (an entry
# per block of slots, `held` slots in all). A lane's chains have an item each (`head`, `lease`),
# whatever its width.
GROWING = ("leases",)
# The slots an item's growing collection holds in all (the slots items' counter): with it, the
# entries at N in flight are N divided by the slots per entry measured over the run's writes.
HELD = "held"


def item_kind(pk: str, sk: str) -> str:
    """("BATCH#x", "REQ#000000042") -> "BATCH/REQ". A lane's chain (`LANE#<model>#00003`) is
    "BATCH/CHAIN", told apart from its lane (`LANE#<model>`, "BATCH/LANE"): model ids hold no `#`."""
    parts = [part.split("#")[0] for part in (pk, sk) if part]
    if parts[-1] == "LANE" and sk.count("#") == 2:
        parts[-1] = "CHAIN"
    return "/".join(parts)


@dataclass(frozen=True)
class Index:
    name: str
    keys: list[str]
    projection: str  # KEYS_ONLY | INCLUDE | ALL


@dataclass(frozen=True)
class Image:
    size: int
    index_keys: dict[str, str]  # attribute -> value (repr), for the GSI key attributes it has
    collections: dict[str, tuple[int, int]]  # GROWING attribute -> (entries, bytes)
    held: int = 0  # the item's HELD counter, if it has one


@dataclass
class ItemWrites:
    """Every write to one item over the run."""

    kind: str
    writes: int = 0
    weight: int = 0  # writes x 2 inside transactions: the multiplier of the item's size in WRU
    wru: float = 0.0  # table writes only
    gsi_wru: float = 0.0
    size: int = 0  # the size of the image with the fullest growing collections (the latest of those)
    max_size: int = 0
    collections: dict[str, tuple[int, int]] = field(default_factory=dict)  # in that image
    # Over every write's image that held slots: the entries and the slots they held, summed.
    entries_seen: int = 0
    held_seen: int = 0

    def slots_per_entry(self) -> float:
        """Slots an entry held, on average over the run's writes (1 for an item without a counter:
        one entry per request in flight)."""
        return self.held_seen / self.entries_seen if self.entries_seen else 1.0

    def projected_entries(self, in_flight: int) -> int:
        return max(1, math.ceil(in_flight / self.slots_per_entry()))

    def projected_size(self, in_flight: int) -> int:
        """The item's size with each growing collection holding `in_flight` requests, from its bytes
        per entry and the slots per entry measured in the run."""
        size = self.size
        entries = self.projected_entries(in_flight)
        for count, nbytes in self.collections.values():
            if count:
                size += round(nbytes / count * entries) - nbytes
        return size


def _ceil_units(size: int, step: int) -> int:
    return max(1, math.ceil(size / step))


class BillingUnits:
    """The billing units of each call, and every write and single-item read counted per item
    (table, pk, sk); the item images come from moto's own store."""

    def __init__(self, stack: Any) -> None:
        self.lock = threading.Lock()
        self._moto_lock = stack.moto.app.lock
        self._tables = self._table_indexes()
        # WRU by item kind ("BATCH/META", "MODEL/SLOTS"...) and how much of it is GSI writes.
        self.wru_by_kind: dict[str, float] = defaultdict(float)
        self.gsi_wru_by_kind: dict[str, float] = defaultdict(float)
        self.old_wru = 0.0  # the same writes under the old rule (see the module docstring)
        self.old_wru_by_kind: dict[str, float] = defaultdict(float)
        self.items: dict[tuple[str, str, str], ItemWrites] = {}  # (table, pk, sk) -> its writes
        # (table, pk, sk) -> [RRU weight of its single-item reads (1 consistent, 0.5 not, 2 in a
        # transaction), its size at the last read]; Query and Scan are left out.
        self.item_reads: dict[tuple[str, str, str], list[float]] = {}

    def _clear_units(self) -> None:
        """Forget the units counted so far (the caller holds `self.lock`)."""
        self.wru_by_kind.clear()
        self.gsi_wru_by_kind.clear()
        self.old_wru = 0.0
        self.old_wru_by_kind.clear()
        self.items.clear()
        self.item_reads.clear()

    def _table_indexes(self) -> dict[str, list[Index]]:
        """Table name -> its GSIs: key attributes and projection, from moto's table (the template's)."""
        out = {}
        for table in self._dynamo_backend().tables.values():
            out[table.name] = [
                Index(gsi.name, [k["AttributeName"] for k in gsi.schema],
                      (gsi.projection or {}).get("ProjectionType", "ALL"))
                for gsi in table.global_indexes]
        return out

    @staticmethod
    def _dynamo_backend() -> Any:
        from freeinference_batch_local.handlers import LOCAL_ACCOUNT_ID, LOCAL_REGION
        from moto.dynamodb.models import dynamodb_backends

        return dynamodb_backends[LOCAL_ACCOUNT_ID][LOCAL_REGION]

    def _item(self, table_name: str, key: dict) -> Any:
        backend = self._dynamo_backend()
        with self._moto_lock:
            try:
                return backend.get_item(table_name, key)
            except Exception:
                return None

    @staticmethod
    def _size(item: Any) -> int:
        try:
            return int(item.size())
        except Exception:
            return len(json.dumps(item.to_json(), default=str))

    def _image(self, table_name: str, pk: str, sk: str) -> Image | None:
        """What billing needs of an item as it is now: size, index key values, growing collections."""
        key = self._key_dict(table_name, pk, sk)
        backend = self._dynamo_backend()
        with self._moto_lock:
            try:
                item = backend.get_item(table_name, key)
            except Exception:
                item = None
            if item is None:
                return None
            index_keys = {name: repr(item.attrs[name].value) for index in self._tables.get(table_name, [])
                          for name in index.keys if name in item.attrs}
            collections = {name: (len(item.attrs[name].value), item.attrs[name].size()) for name in GROWING
                           if name in item.attrs and isinstance(item.attrs[name].value, dict | list)}
            held = int(float(item.attrs[HELD].value)) if HELD in item.attrs else 0
            return Image(self._size(item), index_keys, collections, held)

    def _key_dict(self, table_name: str, pk: str, sk: str) -> dict:
        table = self._dynamo_backend().get_table(table_name)
        key = {table.hash_key_attr: {"S": pk}}
        if table.range_key_attr:
            key[table.range_key_attr] = {"S": sk}
        return key

    def _target(self, table_name: str, key: dict) -> tuple[str, str, str]:
        """(table, pk, sk) of a key in the low-level form ({"pk": {"S": ...}, ...})."""
        table = self._dynamo_backend().get_table(table_name)
        pk = str(next(iter(key[table.hash_key_attr].values())))
        sk = str(next(iter(key[table.range_key_attr].values()))) if table.range_key_attr else ""
        return table_name, pk, sk

    def _write_targets(self, op: str, params: dict) -> list[tuple[str, str, str]]:
        """The items a write call writes (with a transaction's ConditionChecks)."""
        if op == "PutItem":
            return [self._target(params["TableName"], self._key_of(params["TableName"], params["Item"]))]
        if op in ("UpdateItem", "DeleteItem"):
            return [self._target(params["TableName"], params["Key"])]
        if op == "BatchWriteItem":
            out = []
            for table_name, writes in params.get("RequestItems", {}).items():
                for write in writes:
                    key = (self._key_of(table_name, write["PutRequest"]["Item"]) if "PutRequest" in write
                           else write["DeleteRequest"]["Key"])
                    out.append(self._target(table_name, key))
            return out
        if op == "TransactWriteItems":
            out = []
            for element in params.get("TransactItems", []):
                (kind, body), = element.items()
                key = self._key_of(body["TableName"], body["Item"]) if kind == "Put" else body["Key"]
                out.append(self._target(body["TableName"], key))
            return out
        return []

    def _write_units(self, target: tuple[str, str, str], before: Image | None, factor: int = 1,
                     changes: bool = True) -> tuple[float, float]:
        """WRU of one item write: the larger image in 1 KB steps (x `factor`), plus the index writes
        the change causes. `changes` is False for a ConditionCheck (billed, but it writes nothing)."""
        table_name = target[0]
        after = self._image(*target)
        size = max(before.size if before else 0, after.size if after else 0)
        units = factor * _ceil_units(size, 1024)
        gsi = 0
        for index in self._tables.get(table_name, []) if changes else ():
            was = before is not None and all(k in before.index_keys for k in index.keys)
            now = after is not None and all(k in after.index_keys for k in index.keys)
            if not was and not now:
                continue
            if was != now:
                gsi += 1  # entered or left a sparse index
            elif any(before.index_keys[k] != after.index_keys[k] for k in index.keys):  # type: ignore[union-attr]
                gsi += 2  # the index key moved: delete + put
            elif index.projection != "KEYS_ONLY":
                gsi += _ceil_units(after.size, 1024)  # type: ignore[union-attr]
        # The old rule: the after-image only, and every index the item is in, as if written.
        old_size = after.size if after else 0
        in_indexes = sum(1 for index in self._tables.get(table_name, [])
                         if after is not None and all(k in after.index_keys for k in index.keys))
        old = factor * _ceil_units(old_size, 1024) * (1 + in_indexes)
        kind = item_kind(target[1], target[2])
        with self.lock:
            self.wru_by_kind[kind] += units + gsi
            self.gsi_wru_by_kind[kind] += gsi
            self.old_wru += old
            self.old_wru_by_kind[kind] += old
            record = self.items.get(target)
            if record is None:
                record = self.items[target] = ItemWrites(kind)
            record.writes += 1
            record.weight += factor
            record.wru += units
            record.gsi_wru += gsi
            latest = after or before
            if latest is not None:
                # Keep the image with the fullest collections: per-entry sizes need entries.
                entries = sum(n for n, _ in latest.collections.values())
                if latest.held and entries:
                    record.entries_seen += entries
                    record.held_seen += latest.held
                if entries >= sum(n for n, _ in record.collections.values()):
                    record.size, record.collections = latest.size, latest.collections
                record.max_size = max(record.max_size, size)
        return float(units + gsi), float(old)

    def _read_units(self, table_name: str, key: dict, consistent: bool, source: str, factor: float = 1.0) -> float:
        item = self._item(table_name, key)
        size = self._size(item) if item is not None else 0
        target = self._target(table_name, key)
        weight = factor * (1.0 if consistent else 0.5)
        if source == "api:GET /v1/batches/{batch_id}" or source.startswith("schedule:"):
            return _ceil_units(size, 4096) * weight  # status polls and schedules: not per request
        with self.lock:  # per item too: the slots items are read on every gate, whole
            reads = self.item_reads.setdefault(target, [0.0, 0])
            reads[0] += weight
            reads[1] = size
        return _ceil_units(size, 4096) * weight

    def _key_of(self, table_name: str, item: dict) -> dict:
        table = self._dynamo_backend().get_table(table_name)
        names = [table.hash_key_attr] + ([table.range_key_attr] if table.range_key_attr else [])
        return {name: item[name] for name in names if name in item}

    def _units(self, service: str, op: str, params: dict, parsed: dict, http_response: Any,
               before: dict | None = None, *, source: str) -> dict[str, float]:
        """The billing units of one call; `source` is who made it (see `_instrument.labelled`)."""
        if service == "dynamodb":
            return self._dynamodb_units(op, params, parsed, before or {}, source)
        if service == "sqs":
            if op == "ReceiveMessage":
                messages = parsed.get("Messages") or []
                size = len(getattr(http_response, "content", b"") or b"") if http_response is not None else 0
                return {"sqs_requests": _ceil_units(size, 65536), "empty": int(not messages),
                        "messages": len(messages)}
            if op in ("SendMessage", "SendMessageBatch"):
                bodies = [params.get("MessageBody", "")] if op == "SendMessage" else [
                    e.get("MessageBody", "") for e in params.get("Entries", [])]
                size = sum(len(b.encode()) for b in bodies)
                return {"sqs_requests": _ceil_units(size, 65536), "messages": len(bodies)}
            return {"sqs_requests": 1}
        if service == "s3":
            return {"s3_puts": 1} if op in ("PutObject", "DeleteObject", "ListObjectsV2", "CopyObject") else {
                "s3_gets": 1}
        return {}

    def _dynamodb_units(self, op: str, params: dict, parsed: dict, before: dict, source: str) -> dict[str, float]:
        if op == "GetItem":
            return {"rru": self._read_units(params["TableName"], params["Key"], bool(params.get("ConsistentRead")),
                                            source)}
        if op == "BatchGetItem":
            rru = 0.0
            for table_name, request in params.get("RequestItems", {}).items():
                consistent = bool(request.get("ConsistentRead"))
                rru += sum(self._read_units(table_name, key, consistent, source) for key in request.get("Keys", []))
            return {"rru": rru}
        if op in ("Query", "Scan"):
            table_name = params["TableName"]
            consistent = bool(params.get("ConsistentRead"))
            total = 0
            for item in parsed.get("Items") or []:
                found = self._item(table_name, self._key_of(table_name, item))
                total += self._size(found) if found is not None else 0
            return {"rru": _ceil_units(total, 4096) * (1.0 if consistent else 0.5)}
        if op in ("PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem"):
            pairs = [self._write_units(t, before.get(t)) for t in self._write_targets(op, params)]
            return {"wru": sum(new for new, _ in pairs), "old_wru": sum(old for _, old in pairs)}
        if op == "TransactWriteItems":
            wru = old_wru = 0.0
            targets = self._write_targets(op, params)
            for element, target in zip(params.get("TransactItems", []), targets, strict=True):
                # Every element, ConditionCheck included, is billed as a transactional write (2x).
                new, old = self._write_units(target, before.get(target), factor=2,
                                             changes="ConditionCheck" not in element)
                wru, old_wru = wru + new, old_wru + old
            return {"wru": wru, "old_wru": old_wru}
        if op == "TransactGetItems":
            rru = 0.0
            for element in params.get("TransactItems", []):
                body = element["Get"]
                rru += self._read_units(body["TableName"], body["Key"], True, source, factor=2)
            return {"rru": rru}
        return {}
