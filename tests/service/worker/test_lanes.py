"""A lane's chains on moto: each chain's head and dispatch lease is an item of its own, so a
settle writes its chain's item alone, and the sweep reads the chains back from those items."""

from __future__ import annotations

import pytest
from freeinference_batch import worker
from freeinference_batch.core import aws
from freeinference_batch.store.batch_table import BatchTable
from freeinference_batch.store.dynamo import from_item, values

from tests.conftest import sample_request
from tests.service.helpers import lose_messages, position_of, run_schedule, take_messages
from tests.service.worker.helpers import MODEL, NO_RECORD, message_for

WIDTH = 4  # glm-5.3-flash's batch_concurrency in the test catalog


def lane_items(harness, batch_id: str) -> dict[str, dict]:
    """The batch's lane and chain items as stored, by sort key."""
    answer = aws.dynamodb().query(
        TableName=harness.settings.batch_table_name,
        KeyConditionExpression="pk = :pk AND begins_with(sk, :lane)",
        ExpressionAttributeValues=values(pk=f"BATCH#{batch_id}", lane="LANE#"),
        ConsistentRead=True,
    )
    return {item["sk"]: item for item in map(from_item, answer["Items"])}


def test_a_settle_writes_its_chains_item_and_nothing_else_of_the_lane(harness):
    # Given a batch of 6 requests on a lane of 4 chains (chain k at request k)
    batch = harness.create([sample_request(f"q-{i}") for i in range(6)])
    before = lane_items(harness, batch["id"])
    lane = f"LANE#{MODEL}"
    assert set(before) == {lane, *(f"{lane}#{k:05d}" for k in range(WIDTH))}
    assert {name: before[lane][name] for name in ("model", "size", "width")} == {
        "model": MODEL, "size": 6, "width": WIDTH}
    assert "heads" not in before[lane] and "leases" not in before[lane]
    assert [before[f"{lane}#{k:05d}"]["head"] for k in range(WIDTH)] == [0, 1, 2, 3]
    # When chain 2's request settles (its message run directly, no hand-over)
    assert isinstance(worker.Worker(harness.settings).process(message_for(harness, batch["id"], 2), NO_RECORD),
                      worker.Done)
    # Then chain 2's item has moved on by the lane's width, with a fresh dispatch lease
    after = lane_items(harness, batch["id"])
    moved = after.pop(f"{lane}#00002")
    was = before.pop(f"{lane}#00002")
    assert moved["head"] == 2 + WIDTH and moved["lease"] > was["lease"]
    # And the lane's item and the other chains' items are exactly as they were
    assert after == before
    # And the sweep's view of the lane is assembled from those items
    lanes = BatchTable(harness.settings).get_lanes(batch["id"])
    assert lanes == [{"model": MODEL, "size": 6, "width": WIDTH, "heads": [0, 1, 6, 3],
                      "leases": [before[f"{lane}#{k:05d}"]["lease"] if k != 2 else moved["lease"]
                                 for k in range(WIDTH)],
                      "runners": [None] * WIDTH}]


def test_the_sweep_resends_a_moved_chain_from_its_own_item(harness, monkeypatch):
    # Given a batch whose first messages were all lost
    batch = harness.create([sample_request(f"q-{i}") for i in range(6)])
    assert lose_messages(harness) == WIDTH
    # And chain 0's first request settled, but its worker died before sending the next one's message
    def crash_after_settle(self, step: str) -> None:
        if step == "after settle":
            raise worker.SimulatedCrash(step)

    monkeypatch.setattr(worker.Worker, "_maybe_crash", crash_after_settle)
    with pytest.raises(worker.SimulatedCrash):
        worker.Worker(harness.settings).process(message_for(harness, batch["id"], 0), NO_RECORD)
    assert lane_items(harness, batch["id"])[f"LANE#{MODEL}#00000"]["head"] == WIDTH
    # When the dispatch leases have run out and the sweep runs
    harness.advance_clock(harness.settings.batch_dispatch_lease_seconds + 5)
    assert run_schedule("sweep") == {"finalized": 0, "resent": WIDTH, "recovered": 0, "interrupted": 0, "counted": 0,
                                     "checks_resent": 0, "files_resent": 0}
    # Then chain 0 gets the message of where its item stands (request 4), the others their first
    assert sorted(position_of(m) for m in take_messages(harness)) == [1, 2, 3, 4]


def test_chain_items_belong_to_their_own_lane_when_one_model_id_begins_another(harness):
    # Given two lanes of one batch whose model ids share a prefix ("glm" and "glm-x"), one of
    # them narrower than its width (2 requests on 8 chains: 2 chains)
    table = BatchTable(harness.settings)
    table.put_items([*table.lane_items("batch_lanes", "glm", [0, 2, 4], 2, 100.0, 0),
                     *table.lane_items("batch_lanes", "glm-x", [1, 3], 8, 200.0, 0)])
    # When the lanes are read, then each has its own chains, in chain order
    assert sorted(table.get_lanes("batch_lanes"), key=lambda lane: lane["model"]) == [
        {"model": "glm", "size": 3, "width": 2, "heads": [0, 1], "leases": [100.0, 100.0], "runners": [None, None]},
        {"model": "glm-x", "size": 2, "width": 8, "heads": [0, 1], "leases": [200.0, 200.0], "runners": [None, None]},
    ]
    # And renewing a chain moves only that chain's lease, and only while it stands at that head
    assert table.set_lane_lease("batch_lanes", "glm", 1, 1, 150.0)
    assert not table.set_lane_lease("batch_lanes", "glm", 1, 3, 160.0)
    # And a chain the lane does not have is not created by a renewal
    assert not table.set_lane_lease("batch_lanes", "glm-x", 5, 5, 300.0)
    assert sorted(table.get_lanes("batch_lanes"), key=lambda lane: lane["model"]) == [
        {"model": "glm", "size": 3, "width": 2, "heads": [0, 1], "leases": [100.0, 150.0], "runners": [None, None]},
        {"model": "glm-x", "size": 2, "width": 8, "heads": [0, 1], "leases": [200.0, 200.0], "runners": [None, None]},
    ]
