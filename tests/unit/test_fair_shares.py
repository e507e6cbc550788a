"""How the model's slots are shared while batches wait, and which chains of a batch give theirs up."""

from __future__ import annotations

from freeinference_batch.batches import new_batch_id
from freeinference_batch.fairness import AGING_SECONDS, fair_shares, keeps_slot, live_waiters, waited_its_turn
from freeinference_batch.store.dynamo import values
from freeinference_batch.store.leases import lease_expiry, new_holder
from freeinference_batch_local.aws_limits import item_bytes

NOW = 1_000.0


def slots_item(leases: list[str], waiters: list[tuple[str, int]], since: dict[str, float] | None = None) -> dict:
    """A slots item: the holders' tokens, and (batch id, requests left) per waiting chain, each
    waiting since `since[batch]` (default: just now)."""
    return {
        "leases": {holder: NOW + 60 for holder in leases},
        "waiters": {f"{batch}#{n}": {"b": batch, "m": "m", "r": left, "h": "handle", "u": NOW + 10,
                                     "s": (since or {}).get(batch, NOW - 1)}
                    for n, (batch, left) in enumerate(waiters)},
    }


def tokens(batch: str, lanes: range) -> list[str]:
    return [f"{batch}.{lane}.t{lane}" for lane in lanes]


def test_a_small_batch_waiting_takes_every_slot_it_can_use_from_a_big_one():
    item = slots_item(tokens("big", range(4)), [("small", 20)] * 4)
    assert fair_shares(item, 4, "big", 1900, NOW) == {"small": 4, "big": 0}
    # All four of the big batch's chains read the same item and all give their slots up
    assert not any(keeps_slot(item, token, 0) for token in tokens("big", range(4)))


def test_a_big_batch_that_waited_its_turn_keeps_it_while_small_batches_stream_in():
    # Three small batches holding a slot each and waiting for more; the big one holds one through
    # a chain that had waited its turn (its token is marked aged)
    big = new_holder("big", 2, aged=waited_its_turn(AGING_SECONDS))
    item = slots_item([big, *tokens("s1", range(1)), *tokens("s2", range(1)), *tokens("s3", range(1))],
                      [("s1", 90), ("s2", 80), ("s3", 100), ("s3", 100)])
    assert fair_shares(item, 4, "big", 2500, NOW)["big"] == 1  # a quarter of the model
    assert keeps_slot(item, big, 1)
    for batch, left in (("s1", 90), ("s2", 80), ("s3", 100)):
        # a small batch's chain leaves the big one's slot alone: the small ones share the others
        shares = fair_shares(item, 4, batch, left, NOW)
        assert "big" not in shares and sum(shares.values()) == 3
    # Had it not waited, it would give its slot to the small batches, as above
    fresh = new_holder("big", 2)
    item["leases"][fresh] = item["leases"].pop(big)
    assert fair_shares(item, 4, "big", 2500, NOW)["big"] == 0
    assert not waited_its_turn(AGING_SECONDS - 1)


def test_an_aged_chain_keeps_its_batchs_slot_before_lower_lanes():
    aged = new_holder("big", 3, aged=True)
    item = slots_item([*tokens("big", range(3)), aged], [("bigger", 5000)])
    assert [keeps_slot(item, token, 1) for token in [*tokens("big", range(3)), aged]] == [False, False, False, True]


def test_among_batches_holding_none_the_longest_waiting_goes_first():
    item = slots_item(tokens("other", range(2)), [("early", 2000), ("late", 1500)],
                      since={"early": NOW - 30, "late": NOW - 1})
    item["waiters"]["other#9"] = {"b": "other", "m": "m", "r": 700, "h": "handle", "u": NOW + 10, "s": NOW}
    # the one waiting longer gets the slot the holder gives up, though the other has fewer left
    assert fair_shares(item, 2, "other", 700, NOW) == {"late": 0, "other": 1, "early": 1}
    assert [w.batch_id for w in live_waiters(item, NOW)] == ["early", "late", "other"]


def test_a_small_batch_needing_fewer_slots_leaves_the_rest_to_the_big_one():
    item = slots_item(tokens("big", range(4)), [("small", 2)] * 2)
    assert fair_shares(item, 4, "big", 1900, NOW) == {"small": 2, "big": 2}
    # The big batch's lowest lanes keep theirs
    assert [keeps_slot(item, token, 2) for token in tokens("big", range(4))] == [True, True, False, False]


def test_between_big_batches_every_holder_keeps_one_and_a_waiting_one_holding_none_gets_one():
    item = slots_item(tokens("big", range(4)), [("bigger", 5000)] * 4)
    assert fair_shares(item, 4, "big", 1900, NOW) == {"big": 3, "bigger": 1}
    assert [keeps_slot(item, token, 3) for token in tokens("big", range(4))] == [True, True, True, False]
    # and the bigger one, once it holds its one, gives nothing back to a bigger still
    item = slots_item([*tokens("big", range(3)), *tokens("bigger", range(1))], [("big", 1800)])
    assert fair_shares(item, 4, "bigger", 5000, NOW) == {"big": 3, "bigger": 1}


def test_slots_of_batches_without_waiters_stay_with_them():
    item = slots_item([*tokens("other", range(3)), *tokens("big", range(1))], [("small", 2)])
    assert fair_shares(item, 4, "big", 700, NOW) == {"small": 1, "big": 0}
    item = slots_item([*tokens("other", range(3)), *tokens("big", range(1))], [("bigger", 2000)])
    assert fair_shares(item, 4, "big", 700, NOW) == {"big": 1, "bigger": 0}


def test_expired_waiters_do_not_count():
    item = slots_item(tokens("big", range(4)), [("small", 20)])
    item["waiters"]["small#0"]["u"] = NOW - 1
    assert fair_shares(item, 4, "big", 1900, NOW) == {"big": 4}


def test_a_slots_item_with_500_holders_stays_under_32_kb():
    # The slots items are the table's hottest: every take, renewal and release writes them whole,
    # so at 500 holders their size is the write rate's multiplier. bench/aws_calls.py measures
    # about 10 such writes a second at 500 requests in flight (0.10 per request at 100 requests/s),
    # so 32 KB is what keeps them under a third of a partition's 1,000 WCU/s.
    now = 1_764_800_000.123456
    leases = {new_holder(new_batch_id(now + lane), lane, aged=True): lease_expiry(now + 1800.0004)
              for lane in range(500)}
    size = item_bytes({"leases": values(leases=leases)[":leases"]})
    assert size <= 32 * 1024, f"{size} bytes, {size / 500:.0f} per holder"
