"""A batch's lanes and their chains (batches/dispatch.py says what they are):

| sk | written | holds |
|---|---|---|
| `LANE#<model>` | create (immutable) | the lane's model, size (requests) and width (chains) |
| `LANEPOS#<model>` | create (immutable) | the lane's request positions, delta-encoded and compressed |
| `LANE#<model>#00003` | create, chain 3's runs | chain 3's `head` (first request not counted), `lease`, `runner` |

Each chain moves its own item rather than an entry of a lane-wide list: a lane has up to
hundreds of chains, and DynamoDB bills an update by the size of the whole item.
"""

from __future__ import annotations

import array
import zlib
from typing import Any

from freeinference_batch.store import caches
from freeinference_batch.store.batch_keys import batch_pk, chain_key, chain_sk, lane_positions_sk, lane_sk
from freeinference_batch.store.dynamo import (
    apply_update,
    get_written_once,
    key,
    query_all,
    to_item,
    update_element,
    values,
)


def encode_positions(positions: list[int]) -> bytes:
    """Positions ascend, so their gaps are small numbers that compress to almost nothing."""
    gaps = array.array("I", (b - a for a, b in zip([-1, *positions[:-1]], positions, strict=True)))
    return zlib.compress(gaps.tobytes(), 6)


def decode_positions(blob: bytes) -> list[int]:
    gaps = array.array("I")
    gaps.frombytes(zlib.decompress(blob))
    out, last = [], -1
    for gap in gaps:
        last += gap
        out.append(last)
    return out


class Lanes:
    """The batch table's `LANE#` and `LANEPOS#` items (a part of `BatchTable`)."""

    name: str

    def lane_items(self, batch_id: str, model: str, positions: list[int], width: int, lease_until: float,
                   ttl: int) -> list[dict]:
        """The lane's items: its positions, itself, and one item per chain, chain k at head k."""
        pk = batch_pk(batch_id)
        return [
            to_item({"pk": pk, "sk": lane_positions_sk(model), "positions": encode_positions(positions), "ttl": ttl}),
            to_item({"pk": pk, "sk": lane_sk(model), "model": model, "size": len(positions), "width": width,
                     "ttl": ttl}),
            *(to_item({"pk": pk, "sk": chain_sk(model, chain), "head": chain, "lease": lease_until, "ttl": ttl})
              for chain in range(min(width, len(positions)))),
        ]

    def get_lane_positions(self, batch_id: str, model: str) -> list[int]:
        cached = caches.lane_positions.get((batch_id, model))
        if cached is not None:
            return cached
        item = get_written_once(self.name, key(batch_pk(batch_id), lane_positions_sk(model)))
        if item is None:
            raise LookupError(f"lane {model} of {batch_id} is missing")
        positions = decode_positions(item["positions"])
        caches.lane_positions.put((batch_id, model), positions)
        return positions

    def get_lanes(self, batch_id: str) -> list[dict]:
        """Each lane (`model`, `size`, `width`) with its chains' `heads` and dispatch `leases`,
        chain k's at k: the lanes' items and their chains' items, read with one Query."""
        lanes: dict[str, dict] = {}
        chains: dict[str, dict[int, dict]] = {}
        for item in query_all(
            TableName=self.name,
            KeyConditionExpression="pk = :pk AND begins_with(sk, :lane)",
            ExpressionAttributeValues=values(pk=batch_pk(batch_id), lane="LANE#"),
            ConsistentRead=True,
        ):
            model, _, chain = item["sk"].removeprefix("LANE#").partition("#")
            if chain:
                chains.setdefault(model, {})[int(chain)] = item
            else:
                lanes[model] = {"model": item["model"], "size": item["size"], "width": item["width"]}
        for model, lane in lanes.items():
            ordered = [chain for _, chain in sorted(chains.get(model, {}).items())]
            lane["heads"] = [chain["head"] for chain in ordered]
            lane["leases"] = [chain["lease"] for chain in ordered]
            lane["runners"] = [chain.get("runner") for chain in ordered]
        return list(lanes.values())

    # ---- a chain's writes: the elements of a run's transactions (store/runs.py), and its lease

    def chain_start_element(self, batch_id: str, model: str, chain: int, head: int, holder: str,
                            lease_until: float) -> dict:
        """A run takes chain `chain`, with a fresh dispatch lease: only at the chain's head, and only
        while no other run has it. The chain's `runner` is what the batch's `running` counts (see
        store/runs.py)."""
        return update_element(self.name, chain_key(batch_id, model, chain), "SET runner = :holder, lease = :lease",
                              "head = :head AND attribute_not_exists(runner)",
                              head=head, holder=holder, lease=lease_until)

    def chain_move_element(self, batch_id: str, model: str, chain: int, old_head: int, new_head: int,
                           lease_until: float, *, runner: str | None = None, stop: bool = False) -> dict:
        """Move chain `chain`'s head (its watermark: every request before it is settled and counted)
        from `old_head` to `new_head`, with a fresh dispatch lease. `runner`: only while that run
        has the chain (None: only while no run has it); `stop`: the run gives the chain up."""
        condition = "head = :old AND " + ("runner = :runner" if runner else "attribute_not_exists(runner)")
        named: dict[str, Any] = {"old": old_head, "new": new_head, "lease": lease_until}
        if runner:
            named["runner"] = runner
        return update_element(self.name, chain_key(batch_id, model, chain),
                              "SET head = :new, lease = :lease" + (" REMOVE runner" if stop else ""), condition,
                              **named)

    def chain_stop_element(self, batch_id: str, model: str, chain: int, runner: str) -> dict:
        """The sweep gives up the chain of a run that died (its head stays)."""
        return update_element(self.name, chain_key(batch_id, model, chain), "REMOVE runner", "runner = :runner",
                              runner=runner)

    def set_lane_lease(self, batch_id: str, model: str, slot: int, head: int, lease_until: float) -> bool:
        """Renew one chain's dispatch lease, only if the chain still stands at `head` and no run has
        it (a run keeps its own lease; a chain that does not exist fails the condition too: nothing
        is created)."""
        return apply_update(update_element(self.name, chain_key(batch_id, model, slot), "SET lease = :lease",
                                           "head = :head AND attribute_not_exists(runner)",
                                           head=head, lease=lease_until))
