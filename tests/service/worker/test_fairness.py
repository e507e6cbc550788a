"""How the model's slots are shared while batches wait, and which chains of a batch give theirs up."""

from __future__ import annotations

from freeinference_batch.batches.operations import new_batch_id
from freeinference_batch.core.settings import Settings
from freeinference_batch.store.dynamo import values
from freeinference_batch.worker.fairness import AGING_SECONDS, fair_shares, keeps_slot, live_waiters, waited_its_turn
from freeinference_batch.worker.slot_blocks import SlotBlock, new_block_holder, new_run
from freeinference_batch_local.moto.limits import item_bytes

NOW = 1_000.0


def slots_item(blocks: dict[str, int], waiters: list[tuple[str, int]], since: dict[str, float] | None = None,
               aged: dict[str, int] | None = None) -> dict:
    """A slots item: the blocks (`<batch>.<name>` -> slots held, `aged[name]` of them by chains
    that waited their turn), and (batch id, requests left) per waiting chain, each waiting since
    `since[batch]` (default: just now)."""
    return {
        "leases": {holder: {"n": n, "u": NOW + 60, "a": (aged or {}).get(holder, 0)} for holder, n in blocks.items()},
        "held": sum(blocks.values()),
        "waiters": {f"{batch}#{n}": {"b": batch, "m": "m", "r": left, "h": "handle", "u": NOW + 10,
                                     "s": (since or {}).get(batch, NOW - 1)}
                    for n, (batch, left) in enumerate(waiters)},
    }


def block_of(holder: str, runs: list[str]) -> SlotBlock:
    block = SlotBlock(holder, None, 60.0)
    for run in runs:
        block.join(run)
    return block


def runs(batch: str, lanes: range) -> list[str]:
    return [new_run(batch, lane) for lane in lanes]


def keeps(item: dict, block: SlotBlock, share: int) -> list[bool]:
    """For each of the block's runs in lane order: does it keep its slot?"""
    ordered = sorted(block.runs, key=lambda run: int(run.split(".")[1]))
    return [keeps_slot(item, block.holder, block.rank(run), share) for run in ordered]


def test_a_small_batch_waiting_takes_every_slot_it_can_use_from_a_big_one():
    item = slots_item({"big.b1": 4}, [("small", 20)] * 4)
    assert fair_shares(item, 4, "big", 1900, NOW) == {"small": 4, "big": 0}
    # All four of the big batch's chains read the same item and all give their slots up
    assert keeps(item, block_of("big.b1", runs("big", range(4))), 0) == [False] * 4


def test_a_big_batch_that_waited_its_turn_keeps_it_while_small_batches_stream_in():
    # Three small batches holding a slot each and waiting for more; the big one holds one through
    # a chain that had waited its turn (its block counts it aged)
    big = new_run("big", 2, aged=waited_its_turn(AGING_SECONDS))
    item = slots_item({"big.b1": 1, "s1.b1": 1, "s2.b1": 1, "s3.b1": 1},
                      [("s1", 90), ("s2", 80), ("s3", 100), ("s3", 100)], aged={"big.b1": 1})
    assert fair_shares(item, 4, "big", 2500, NOW)["big"] == 1  # a quarter of the model
    assert keeps(item, block_of("big.b1", [big]), 1) == [True]
    for batch, left in (("s1", 90), ("s2", 80), ("s3", 100)):
        # a small batch's chain leaves the big one's slot alone: the small ones share the others
        shares = fair_shares(item, 4, batch, left, NOW)
        assert "big" not in shares and sum(shares.values()) == 3
    # Had it not waited, it would give its slot to the small batches, as above
    item["leases"]["big.b1"]["a"] = 0
    assert fair_shares(item, 4, "big", 2500, NOW)["big"] == 0
    assert not waited_its_turn(AGING_SECONDS - 1)


def test_an_aged_chain_keeps_its_batchs_slot_before_lower_lanes():
    aged = new_run("big", 3, aged=True)
    item = slots_item({"big.b1": 4}, [("bigger", 5000)], aged={"big.b1": 1})
    assert keeps(item, block_of("big.b1", [*runs("big", range(3)), aged]), 1) == [False, False, False, True]


def test_blocks_keep_their_slots_in_order_aged_chains_first_then_by_name():
    # Three invocations hold the batch's 7 slots; its share is 4
    item = slots_item({"big.a": 3, "big.b": 2, "big.c": 2}, [("bigger", 5000)], aged={"big.c": 1})
    blocks = {"a": block_of("big.a", runs("big", range(3))), "b": block_of("big.b", runs("big", range(3, 5))),
              "c": block_of("big.c", [new_run("big", 5, aged=True), new_run("big", 6)])}
    # c's aged chain keeps first, whatever the block's name; then the others, a's before b's
    assert keeps(item, blocks["c"], 4) == [True, False]
    assert keeps(item, blocks["a"], 4) == [True, True, True]
    assert keeps(item, blocks["b"], 4) == [False, False]
    # each slot kept once: as many kept as the share, whichever chain asks
    for share in range(8):
        assert sum(sum(keeps(item, block, share)) for block in blocks.values()) == share


def test_every_aged_chain_of_a_batch_keeps_before_any_other_across_blocks():
    item = slots_item({"big.a": 5, "big.b": 3}, [("bigger", 5000)], aged={"big.a": 1, "big.b": 3})
    a = block_of("big.a", [new_run("big", 0, aged=True), *runs("big", range(1, 5))])
    b = block_of("big.b", [new_run("big", lane, aged=True) for lane in range(5, 8)])
    assert keeps(item, a, 4) == [True, False, False, False, False]
    assert keeps(item, b, 4) == [True, True, True]


def test_among_batches_holding_none_the_longest_waiting_goes_first():
    item = slots_item({"other.b1": 2}, [("early", 2000), ("late", 1500)],
                      since={"early": NOW - 30, "late": NOW - 1})
    item["waiters"]["other#9"] = {"b": "other", "m": "m", "r": 700, "h": "handle", "u": NOW + 10, "s": NOW}
    # the one waiting longer gets the slot the holder gives up, though the other has fewer left
    assert fair_shares(item, 2, "other", 700, NOW) == {"late": 0, "other": 1, "early": 1}
    assert [w.batch_id for w in live_waiters(item, NOW)] == ["early", "late", "other"]


def test_a_small_batch_needing_fewer_slots_leaves_the_rest_to_the_big_one():
    item = slots_item({"big.b1": 4}, [("small", 2)] * 2)
    assert fair_shares(item, 4, "big", 1900, NOW) == {"small": 2, "big": 2}
    # The big batch's lowest lanes keep theirs
    assert keeps(item, block_of("big.b1", runs("big", range(4))), 2) == [True, True, False, False]


def test_between_big_batches_every_holder_keeps_one_and_a_waiting_one_holding_none_gets_one():
    item = slots_item({"big.b1": 4}, [("bigger", 5000)] * 4)
    assert fair_shares(item, 4, "big", 1900, NOW) == {"big": 3, "bigger": 1}
    assert keeps(item, block_of("big.b1", runs("big", range(4))), 3) == [True, True, True, False]
    # and the bigger one, once it holds its one, gives nothing back to a bigger still
    item = slots_item({"big.b1": 3, "bigger.b1": 1}, [("big", 1800)])
    assert fair_shares(item, 4, "bigger", 5000, NOW) == {"big": 3, "bigger": 1}


def test_slots_of_batches_without_waiters_stay_with_them():
    item = slots_item({"other.b1": 3, "big.b1": 1}, [("small", 2)])
    assert fair_shares(item, 4, "big", 700, NOW) == {"small": 1, "big": 0}
    item = slots_item({"other.b1": 3, "big.b1": 1}, [("bigger", 2000)])
    assert fair_shares(item, 4, "big", 700, NOW) == {"big": 1, "bigger": 0}


def test_the_gateways_single_slots_count_as_one_each():
    item = slots_item({"big.b1": 2}, [("small", 20)])
    item["leases"].update({"interactive-1": NOW + 30, "interactive-2": NOW + 30})
    item["held"] += 2
    # the gateway's two are nobody's to share: the small batch gets what the big one gives up
    assert fair_shares(item, 4, "big", 1900, NOW) == {"small": 1, "big": 1}


def test_expired_waiters_do_not_count():
    item = slots_item({"big.b1": 4}, [("small", 20)])
    item["waiters"]["small#0"]["u"] = NOW - 1
    assert fair_shares(item, 4, "big", 1900, NOW) == {"big": 4}


def test_a_slots_item_at_500_in_flight_stays_near_2_kb():
    # The slots items are the table's hottest: every take and give-back writes them whole, and
    # every hand-over reads them. 500 requests in flight are held in blocks of what an invocation
    # runs at once (at most the worker's BatchSize, 24; bench/aws_calls.py measures it), so the
    # item holds a few dozen entries, each of one batch: 2 KB, 2 WCU a write, not 31.
    now = 1_764_800_000.123456
    settings = Settings()
    blocks = {}
    for invocation in range(500 // 20):
        block = SlotBlock(new_block_holder(new_batch_id(now + invocation)), now + 900, settings.slot_lease_seconds)
        blocks[block.holder] = {"n": 20, "u": block.until(now), "a": 20}
    size = item_bytes({"leases": values(leases=blocks)[":leases"], "held": values(held=500)[":held"]})
    assert size <= 2 * 1024, f"{size} bytes, {size / len(blocks):.0f} per block"
