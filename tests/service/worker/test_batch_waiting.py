"""A batch's `waiting` on moto (worker/waiting.py, store/batch_status.py `wait`, issue 33): a chain
that parks for something outside its batch while none of the batch runs sets it, once per change
of reason, and the claim that starts a request again clears it in the write it makes anyway. A
batch filling its own slots is running, never waiting.
"""

from __future__ import annotations

import pytest
from freeinference_batch import accounts
from freeinference_batch.core import clock
from freeinference_batch.core.schemas import WaitingReason
from freeinference_batch.store import accounts_table, batch_status
from freeinference_batch.store.leases import Leases, account_slots_key, model_slots_key
from freeinference_batch.worker import Done, Parked

from tests.conftest import sample_request
from tests.service.worker.helpers import (
    ACCOUNT,
    MODEL,
    NO_RECORD,
    fill_slots,
    hold_all_model_slots,
    message_for,
    meta_of,
    now,
)


@pytest.fixture
def waiting_writes(monkeypatch) -> list[dict]:
    """Every write of a batch's `waiting` sent to DynamoDB (applied or refused: both cost write units)."""
    sent: list[dict] = []
    real = batch_status.apply_update

    def counting(element: dict) -> bool:
        if "waiting = :waiting" in element["Update"]["UpdateExpression"]:
            sent.append(element)
        return real(element)

    monkeypatch.setattr(batch_status, "apply_update", counting)
    return sent


def park_each(harness, worker, batch_id: str, positions: range) -> None:
    """Each position's message delivered once: every one of them parks."""
    for position in positions:
        outcome = worker.process(message_for(harness, batch_id, position), NO_RECORD)
        assert isinstance(outcome, Parked), outcome


def shown(harness, batch_id: str) -> dict | None:
    return harness.batch(batch_id)["waiting"]


def test_a_batch_whose_model_is_busy_waits_model_busy_then_concurrency_each_written_once(
        harness, worker, waiting_writes):
    # Given a batch of two chains whose model's batch slots are all held by others
    holders = hold_all_model_slots(harness, "others")
    batch = harness.create([sample_request(f"q-{i}") for i in range(2)])
    assert shown(harness, batch["id"]) is None
    # When both chains find the slots full, twice each
    before = int(now(harness))
    park_each(harness, worker, batch["id"], range(2))
    park_each(harness, worker, batch["id"], range(2))
    # Then the batch waits for its model, written once
    waiting = shown(harness, batch["id"])
    assert waiting["reason"] == "model_busy" and f"'{MODEL}'" in waiting["message"], waiting
    assert before <= waiting["since"] <= int(now(harness)) + 1
    assert harness.batch(batch["id"])["status"] == "validating"
    assert len(waiting_writes) == 1
    # When the model frees and the account's slots are all held by its interactive requests instead
    leases = Leases(harness.settings)
    for holder in holders:
        leases.release_one(model_slots_key(MODEL), holder)
    concurrency = 16  # the harness's account's
    fill_slots(harness, account_slots_key(ACCOUNT), {f"chat-{n}": now(harness) + 3600 for n in range(concurrency)})
    park_each(harness, worker, batch["id"], range(2))
    park_each(harness, worker, batch["id"], range(2))
    # Then it waits for the account's concurrency instead: one more write
    waiting = shown(harness, batch["id"])
    assert waiting["reason"] == "concurrency" and "All 16 of the account's" in waiting["message"], waiting
    assert len(waiting_writes) == 2
    # When a slot frees and a request starts
    leases.release_one(account_slots_key(ACCOUNT), "chat-0")
    assert isinstance(worker.process(message_for(harness, batch["id"], 0), NO_RECORD), Done)
    # Then the start cleared it, with no write of its own
    started = harness.batch(batch["id"])
    assert started["waiting"] is None and started["request_counts"]["completed"] == 1, started
    assert meta_of(harness, batch["id"]).waiting is None
    assert len(waiting_writes) == 2
    # And the batch finishes with no waiting
    for n in range(1, concurrency):
        leases.release_one(account_slots_key(ACCOUNT), f"chat-{n}")
    final = harness.run_to_final(batch["id"])
    assert final["status"] == "completed" and final["waiting"] is None


def test_a_model_held_back_by_interactive_load_is_model_busy(harness, worker, waiting_writes):
    # Given a model whose interactive traffic fills it (batch capacity 0)
    batch = harness.create([sample_request("q-0")])
    accounts_table.put_model_load(harness.settings, MODEL, 10**6, at=int(now(harness)))
    # When its chain is delivered
    park_each(harness, worker, batch["id"], range(1))
    # Then the batch waits for its model
    assert shown(harness, batch["id"])["reason"] == "model_busy"
    assert len(waiting_writes) == 1


def test_losing_batch_access_waits_batch_access_until_it_returns(harness, worker, waiting_writes):
    # Given a batch whose account moves to a tier without batch access
    batch = harness.create([sample_request(f"q-{i}") for i in range(2)])
    accounts.set_account(harness.settings, ACCOUNT, tier="standard")
    # When its chains look, twice
    park_each(harness, worker, batch["id"], range(2))
    park_each(harness, worker, batch["id"], range(2))
    # Then the batch waits for batch access, written once
    waiting = shown(harness, batch["id"])
    assert waiting["reason"] == "batch_access" and "every minute" in waiting["message"], waiting
    assert len(waiting_writes) == 1
    # When access returns, the next look starts a request and clears it
    accounts.set_account(harness.settings, ACCOUNT, tier="internal")
    assert isinstance(worker.process(message_for(harness, batch["id"], 0), NO_RECORD), Done)
    assert shown(harness, batch["id"]) is None
    assert harness.run_to_final(batch["id"])["status"] == "completed"
    assert len(waiting_writes) == 1


def test_a_used_up_daily_quota_waits_daily_quota_until_midnight(harness, worker, waiting_writes):
    # Given a batch whose account's daily quota is used up (the API answers 429 then: read the item)
    batch = harness.create([sample_request("q-0")])
    accounts.set_account(harness.settings, ACCOUNT, daily_quota_usd=0)
    # When its chain looks
    outcome = worker.process(message_for(harness, batch["id"], 0), NO_RECORD)
    # Then it parks until 00:00 UTC, and the batch says so
    assert isinstance(outcome, Parked) and outcome.seconds > 60
    waiting = meta_of(harness, batch["id"]).waiting
    assert waiting is not None and waiting.reason == WaitingReason.DAILY_QUOTA
    midnight = clock.next_utc_midnight(now(harness))
    assert "00:00 UTC" in waiting.message and clock.utc_day(midnight) in waiting.message
    assert len(waiting_writes) == 1


def test_a_batch_running_a_request_is_not_waiting_whatever_its_other_chains_meet(harness, worker, waiting_writes):
    # Given a batch whose first chain has taken a slot of the account (its claim not yet counted
    # running), the account's other slots held by interactive requests
    batch = harness.create([sample_request(f"q-{i}") for i in range(2)])
    accounts.set_account(harness.settings, ACCOUNT, concurrency=2)
    fill_slots(harness, account_slots_key(ACCOUNT), {"chat-0": now(harness) + 3600})
    meta = meta_of(harness, batch["id"])
    block = {"n": 1, "u": now(harness) + 3600, "a": 0}
    assert Leases(harness.settings).add_to_block(account_slots_key(ACCOUNT), f"{batch['id']}.block", block, 0, 2)
    # When its second chain finds the account's slots full
    park_each(harness, worker, batch["id"], range(1, 2))
    # Then the batch is running, not waiting: nothing written
    assert meta.running == 0 and shown(harness, batch["id"]) is None
    assert waiting_writes == []


def test_a_healthy_batch_filling_its_own_slots_never_waits(harness, waiting_writes):
    # Given an account of 2 concurrent requests and a batch of 4 chains on it (2 wait for the
    # batch's own slots at every turn)
    accounts.set_account(harness.settings, ACCOUNT, concurrency=2)
    batch = harness.create([sample_request(f"q-{i}", f"Own share {i}") for i in range(12)])
    # When it runs to the end
    final = harness.run_to_final(batch["id"], timeout=60)
    # Then it completed and was never waiting
    assert final["status"] == "completed" and final["waiting"] is None
    assert waiting_writes == []


def test_a_waiting_batch_that_ends_keeps_no_waiting(harness, worker, waiting_writes):
    # Given a batch waiting for batch access
    batch = harness.create([sample_request("q-0")])
    accounts.set_account(harness.settings, ACCOUNT, tier="standard")
    park_each(harness, worker, batch["id"], range(1))
    assert meta_of(harness, batch["id"]).waiting is not None
    # When it is cancelled (nothing runs: it is final at once)
    status, cancelled = harness.call("POST", f"/v1/batches/{batch['id']}/cancel")
    # Then the final transition removed its waiting from the item
    assert status == 200 and cancelled["status"] == "cancelled" and cancelled["waiting"] is None, cancelled
    assert meta_of(harness, batch["id"]).waiting is None
