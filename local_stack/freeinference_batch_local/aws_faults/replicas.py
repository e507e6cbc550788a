"""The lagging replicas behind `dynamodb.stale_ms`: each table's eventually consistent replica
inside moto's backend (same keys and indexes, named `<table>.lagging-replica`, hidden from
ListTables), which every write's resulting item images reach up to the lag later, and the
eventually consistent reads they answer while they lag."""

from __future__ import annotations

import copy
import heapq
import json
import random
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from moto.dynamodb.models.table import Table

from freeinference_batch_local.aws_faults.wsgi import Answer, Request

REPLICA_SUFFIX = ".lagging-replica"


class LaggingReplicas:
    """Each table's eventually consistent replica, `lag` seconds behind at most.

    A write's resulting item images reach the replica at now + uniform(0, lag), never before an
    earlier image of the same item: so a replica answers an item as it was at most `lag` ago,
    and images of one item arrive in their order."""

    def __init__(self, lag: float, draw: random.Random, clock: Callable[[], float]) -> None:
        self.lag = lag
        self.draw = draw
        self.clock = clock
        self._due: list[tuple[float, int, Any, Any, Any, Any]] = []  # (when, n, replica, hash, range, image)
        self._sequence = 0
        self._latest: dict[tuple[int, str, Any, Any], float] = {}  # an item's last image's time
        self._pending: Counter[tuple[int, str]] = Counter()  # images on their way, per table

    def replica_of(self, backend: Any, table_name: str) -> str | None:
        """The replica's name, created (as a copy of the table) when first needed; None if the
        table does not exist (the table's own answer says so)."""
        name = table_name + REPLICA_SUFFIX
        if name in backend.tables:
            return name
        table = backend.tables.get(table_name)
        if table is None:
            return None
        replica = Table(
            name, account_id=table.account_id, region=table.region_name, schema=table.schema, attr=table.attr,
            billing_mode=table.billing_mode,
            indexes=[{"IndexName": i.name, "KeySchema": i.schema, "Projection": i.projection} for i in table.indexes],
            global_indexes=[{"IndexName": i.name, "KeySchema": i.schema, "Projection": i.projection}
                            for i in table.global_indexes],
        )
        for hash_key, held in table.items.items():
            replica.items[hash_key] = (
                {range_key: copy.deepcopy(item) for range_key, item in held.items()} if table.range_key_attr
                else copy.deepcopy(held)
            )
        backend.tables[name] = replica
        return name

    def lagging(self, backend: Any, table_name: str) -> bool:
        return self._pending[(id(backend), table_name)] > 0

    @staticmethod
    def is_global_index(backend: Any, table_name: str, index_name: str) -> bool:
        table = backend.tables.get(table_name)
        return table is not None and any(index.name == index_name for index in table.global_indexes)

    def drop(self, backend: Any, table_name: str) -> None:
        backend.tables.pop(table_name + REPLICA_SUFFIX, None)

    def before_write(self, backend: Any, operation: str, document: Mapping[str, Any]) -> list[tuple[str, dict]]:
        """Before moto applies a write: the replicas of the tables it writes exist (a replica made
        later would copy the write at once), and the keys it writes, for `after_write`."""
        written = []
        for table_name, key in _written_keys(operation, document, backend):
            if self.replica_of(backend, table_name) is not None:
                written.append((table_name, key))
        return written

    def after_write(self, backend: Any, written: list[tuple[str, dict]]) -> None:
        """After moto applied a write: the images of the items it wrote on their way."""
        for table_name, key in written:
            self._record(backend, table_name, key)

    def _record(self, backend: Any, table_name: str, key: Mapping[str, Any]) -> None:
        replica_name = table_name + REPLICA_SUFFIX
        table = backend.tables.get(table_name)
        if table is None or replica_name not in backend.tables:
            return
        hash_key, range_key = backend.get_keys_value(table, key)
        image = copy.deepcopy(table.get_item(hash_key, range_key))
        identity = (id(backend), table_name, hash_key, range_key)
        when = max(self.clock() + self.draw.uniform(0.0, self.lag), self._latest.get(identity, 0.0))
        self._latest[identity] = when
        self._pending[(id(backend), table_name)] += 1
        self._sequence += 1
        heapq.heappush(self._due, (when, self._sequence, (backend, table_name), backend.tables[replica_name],
                                   (hash_key, range_key), image))

    def apply_due(self) -> None:
        now = self.clock()
        while self._due and self._due[0][0] <= now:
            when, _, (backend, table_name), replica, (hash_key, range_key), image = heapq.heappop(self._due)
            identity = (id(backend), table_name, hash_key, range_key)
            if self._latest.get(identity) == when:
                del self._latest[identity]
            self._pending[(id(backend), table_name)] -= 1
            if range_key is None:
                if image is None:
                    replica.items.pop(hash_key, None)
                else:
                    replica.items[hash_key] = image
            elif image is None:
                replica.items.get(hash_key, {}).pop(range_key, None)
            else:
                replica.items[hash_key][range_key] = image

    def read(self, backend: Any, operation: str, request: Request,
             forward: Callable[[dict[str, Any]], Answer]) -> tuple[Answer, bool]:
        """An eventually consistent read, from the lagging replicas of the tables it reads, when
        they have writes pending (else they equal the tables: the tables answer); and whether
        the answer is stale (differs from what the consistent read answers at this moment)."""
        document = request.document
        renamed: dict[str, str] = {}
        if operation == "BatchGetItem":
            items = dict(document.get("RequestItems") or {})
            for table, spec in list(items.items()):
                if not spec.get("ConsistentRead") and self.lagging(backend, table):
                    replica = self.replica_of(backend, table)
                    if replica is not None:
                        items[replica] = items.pop(table)
                        renamed[replica] = table
            stale_request = {**document, "RequestItems": items}
        else:
            table = document.get("TableName", "")
            index = document.get("IndexName")
            consistent = bool(document.get("ConsistentRead")) and not (
                index and self.is_global_index(backend, table, index)
            )
            if not consistent and self.lagging(backend, table):
                replica = self.replica_of(backend, table)
                if replica is not None:
                    renamed[replica] = table
            stale_request = {**document, "TableName": next(iter(renamed), table)}
        consistent_answer = forward(request.current())
        if not renamed:
            return consistent_answer, False
        stale_answer = forward(request.replaced(stale_request))
        if not stale_answer.ok or not consistent_answer.ok:
            return consistent_answer, False  # a refusal is not about staleness: answer the table's own
        stale = _renamed_back(stale_answer.json(), renamed)
        if _normalized(stale) != _normalized(consistent_answer.json()):
            return stale_answer.with_json(stale), True
        return consistent_answer, False


def _written_keys(operation: str, document: Mapping[str, Any], backend: Any) -> list[tuple[str, dict[str, Any]]]:
    """(table, key) of every item a successful write wrote."""
    def key_of(table_name: str, item: Mapping[str, Any]) -> dict[str, Any]:
        table = backend.tables.get(table_name)  # none: moto refuses the write, nothing to follow
        return {name: item[name] for name in table.table_key_attrs if name in item} if table else {}

    if operation == "PutItem":
        return [(document["TableName"], key_of(document["TableName"], document["Item"]))]
    if operation in ("UpdateItem", "DeleteItem"):
        return [(document["TableName"], dict(document["Key"]))]
    written: list[tuple[str, dict[str, Any]]] = []
    if operation == "BatchWriteItem":
        for table_name, requests in (document.get("RequestItems") or {}).items():
            for request in requests:
                if "PutRequest" in request:
                    written.append((table_name, key_of(table_name, request["PutRequest"]["Item"])))
                elif "DeleteRequest" in request:
                    written.append((table_name, dict(request["DeleteRequest"]["Key"])))
    elif operation == "TransactWriteItems":
        for element in document.get("TransactItems") or []:
            for kind, request in element.items():
                if kind == "Put":
                    written.append((request["TableName"], key_of(request["TableName"], request["Item"])))
                elif kind in ("Update", "Delete"):
                    written.append((request["TableName"], dict(request["Key"])))
    return written


def _renamed_back(document: dict[str, Any], renamed: Mapping[str, str]) -> dict[str, Any]:
    """A replica's answer with the replicas' names made their tables' again."""
    for key in ("Responses", "UnprocessedKeys"):
        if isinstance(document.get(key), dict):
            document[key] = {renamed.get(table, table): value for table, value in document[key].items()}
    consumed = document.get("ConsumedCapacity")
    for entry in consumed if isinstance(consumed, list) else [consumed] if isinstance(consumed, dict) else []:
        if entry.get("TableName") in renamed:
            entry["TableName"] = renamed[entry["TableName"]]
    return document


def _normalized(document: dict[str, Any]) -> Any:
    """An answer compared as DynamoDB means it: BatchGetItem's items per table in no order."""
    if isinstance(document.get("Responses"), dict):
        document = {**document, "Responses": {
            table: sorted(json.dumps(item, sort_keys=True) for item in items)
            for table, items in document["Responses"].items()
        }}
    return json.dumps(document, sort_keys=True)
