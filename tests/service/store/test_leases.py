"""Slots items written through `store/leases.py` on AWS's bad days, on moto: a block's take or
give-back whose answer was lost (so botocore sent it again), a give-back that fails, and one
applied whose answer failed each leave the item counting what the block holds.
"""

from __future__ import annotations

import time

from botocore.exceptions import ClientError
from freeinference_batch.core import aws
from freeinference_batch.store.leases import Leases, Waiter, model_slots_key
from freeinference_batch.worker.slot_blocks import BlockLeases, SlotBlock, SlotBlocks

from tests.service.worker.helpers import MODEL


def resend_after_applying(monkeypatch, operation: str = "UpdateItem"):
    """Every `operation` is applied, then its answer is lost and botocore sends it again: the
    caller sees the second attempt's answer (a conditional write's refusal)."""
    client = aws.dynamodb()
    real = client.update_item

    def twice(**kwargs):
        real(**kwargs)
        return real(**kwargs)

    monkeypatch.setattr(client, "update_item", twice)


def test_taking_a_slot_again_whose_first_answer_was_lost_succeeds_even_when_it_filled_the_slots(harness,
                                                                                              monkeypatch):
    # Given a model's slots one short of full: one gateway request and a block of two
    leases = BlockLeases(harness.settings)
    key = model_slots_key(MODEL)
    now = time.time()
    assert leases.take_one(key, "interactive-0", 4, now + 3600)
    other = SlotBlock("other.b", None, 3600)
    assert leases.take(key, other, 4, now) and leases.take(key, other, 4, now)
    # When a block takes the last slot and each write arrives twice (botocore sends a write again
    # when its answer is lost), and gives one back the same way
    mine = SlotBlock("mine.b", None, 3600)
    resend_after_applying(monkeypatch)
    assert leases.take(key, mine, 4, now)
    # Then it holds its one slot, counted once, and the slots are full to anyone else
    assert leases.read(key)["held"] == 4 and leases.holders(key)["mine.b"]["n"] == 1 and mine.holds(key) == 1
    assert not leases.take(key, SlotBlock("another.b", None, 3600), 4, now)
    assert not leases.take_one(key, "interactive-1", 4, now + 3600)
    leases.give(key, mine)
    leases.give(key, other)
    assert leases.read(key)["held"] == 2 and "mine.b" not in leases.holders(key) and mine.holds(key) == 0
    assert leases.holders(key)["other.b"]["n"] == 1 and other.holds(key) == 1
    leases.release_one(key, "interactive-0")
    assert leases.read(key)["held"] == 1


def test_a_give_back_that_fails_leaves_the_slot_with_its_block_without_raising(harness, monkeypatch):
    leases = BlockLeases(harness.settings)
    key = model_slots_key(MODEL)
    blocks = SlotBlocks(harness.settings)
    block = blocks.for_batch("mine")
    assert leases.take(key, block, 4, time.time())
    client = aws.dynamodb()
    real = client.update_item

    def throttled(**kwargs):
        raise ClientError({"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "slow down"}},
                          "UpdateItem")

    monkeypatch.setattr(client, "update_item", throttled)
    leases.give_all([key], block, "mine.0.run")  # what follows a give-back (count, wake, next message) must run
    assert block.holds(key) == 1 and leases.read(key)["held"] == 1
    # At the invocation's end its leftovers go back
    monkeypatch.setattr(client, "update_item", real)
    leases.give_back_leftovers(blocks)
    assert block.holds(key) == 0 and leases.read(key)["held"] == 0 and leases.holders(key) == {}


def test_a_give_back_applied_whose_answer_failed_is_read_before_the_next_write(harness, monkeypatch):
    # Given a block holding three slots of the model's item
    leases = BlockLeases(harness.settings)
    key = model_slots_key(MODEL)
    block = SlotBlock("mine.b", None, 3600)
    for _ in range(3):
        assert leases.take(key, block, 8, time.time())
    client = aws.dynamodb()
    real = client.update_item

    def applied_then_failed(**kwargs):
        real(**kwargs)  # applied, and then every re-send of it failed: its outcome is unknown
        raise ClientError({"Error": {"Code": "InternalServerError", "Message": "try again"}}, "UpdateItem")

    # When a give-back is applied but answers an error, and the next is plain
    monkeypatch.setattr(client, "update_item", applied_then_failed)
    leases.give(key, block)
    monkeypatch.setattr(client, "update_item", real)
    leases.give(key, block)
    # Then each gave back one slot: the item counts one, as the block does, and a take adds one
    assert leases.read(key)["held"] == 1 and leases.holders(key)["mine.b"]["n"] == 1 and block.holds(key) == 1
    assert leases.take(key, block, 8, time.time())
    assert leases.read(key)["held"] == 2 and block.holds(key) == 2


def test_taking_a_waiter_again_whose_first_answer_was_lost_finds_its_own_take(harness, monkeypatch):
    # Given a chain waiting on the model's slots
    leases = Leases(harness.settings)
    key = model_slots_key(MODEL)
    now = time.time()
    leases.ensure_item(key, leases.read(key))
    waiter = Waiter(id="batch_x#0", batch_id="batch_x", model=MODEL, remaining=1, handle="handle-1",
                    until=now + 60, since=now)
    assert leases.add_waiter(key, leases.read(key), waiter, now) is not None
    # When a worker takes it to wake it, and the take's answer is lost (botocore sends it again)
    resend_after_applying(monkeypatch)
    # Then the take reads as its own (so the worker makes the waiter's message visible), once
    assert leases.take_waiter(key, waiter)
    assert "batch_x#0" not in leases.read(key).get("waiters", {})
    # And another worker's take of it, later, is refused
    assert not leases.take_waiter(key, waiter)
