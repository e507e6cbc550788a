"""Runs that die, fail or stall, on moto: a request whose every run dies fails after the attempt
limit; a run that dies, or meets an AWS error, between taking its slots and its claim holds them
only until they expire, or gives them back; a block reaped under its chains is lost; a run that
fails after its claim gives its slots back; a poisoned record fails alone in its invocation; a
superseded run never overwrites the winner's stored response."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError
from freeinference_batch import accounts
from freeinference_batch.core import clock
from freeinference_batch.ops import schedules
from freeinference_batch.store.leases import Leases, account_slots_key, model_slots_key
from freeinference_batch.worker import Done, InvocationState, Parked, Worker, claims
from freeinference_batch.worker import upstream as upstream_client
from freeinference_batch.worker.slot_blocks import BlockLeases

from tests.conftest import sample_request
from tests.service.worker.helpers import (
    ACCOUNT,
    MODEL,
    NO_RECORD,
    WorkerDied,
    expire_leases,
    message_for,
    meta_of,
    results_by_id,
    state_of,
)


def test_a_request_whose_every_run_dies_fails_after_the_attempt_limit(harness, monkeypatch):
    # Given a request that kills its worker every time it runs, beside a healthy one
    harness.configure(BATCH_MAX_ATTEMPTS="3")
    batch = harness.create([sample_request("poison", "Poisonous"), sample_request("fine", "Healthy")])
    real_call = upstream_client.call

    def dying_call(settings, body, **kwargs):
        if b"Poisonous" in body:
            raise WorkerDied
        return real_call(settings, body, **kwargs)

    monkeypatch.setattr(upstream_client, "call", dying_call)
    poison = message_for(harness, batch["id"], 0)
    assert isinstance(Worker(harness.settings).process(message_for(harness, batch["id"], 1), NO_RECORD), Done)
    # When each run dies and the sweep takes the request back and sends it again
    for attempt in range(1, 4):
        with pytest.raises(WorkerDied):
            Worker(harness.settings).process(poison, NO_RECORD)
        assert state_of(harness, batch["id"], 0)["attempts"] == attempt
        expire_leases(harness)
        swept = schedules.sweep(harness.settings)
        if attempt < 3:
            assert swept["recovered"] == 1 and swept["resent"] == 1 and swept["interrupted"] == 0
    # Then after the third death it is not run again: it fails, its slots are free, the batch ends
    assert swept["interrupted"] == 1 and swept["recovered"] == 0 and swept["finalized"] == 1
    lines = results_by_id(harness, batch["id"])
    # with a code of the spec's closed list (a server error after every retry), saying what happened
    assert lines["poison"]["status"] == "failed"
    assert lines["poison"]["error"] == {
        "code": "upstream_error",
        "message": "Each of the request's 3 runs stopped before it finished (the worker running it failed); "
                   "it is not tried again"}
    assert lines["fine"]["status"] == "completed"
    final = harness.batch(batch["id"])
    assert final["status"] == "completed"
    assert final["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
    assert meta_of(harness, batch["id"]).running == 0
    # The dead run's slots are its invocation's block's: the sweep leaves them, and they are free
    # once the block expires (whoever next finds the slots full reaps it)
    leases = BlockLeases(harness.settings)
    harness.advance_clock(harness.settings.slot_lease_seconds)
    later = clock.now(harness.clock_file)
    assert leases.reap(model_slots_key(MODEL), later) == leases.reap(account_slots_key(ACCOUNT), later) == 0
    assert leases.holders(model_slots_key(MODEL)) == leases.holders(account_slots_key(ACCOUNT)) == {}


def test_a_run_that_dies_between_taking_its_slots_and_its_claim_holds_them_only_until_they_expire(
        harness, monkeypatch):
    # Given an account of one concurrent request, and a batch of one request
    accounts.set_account(harness.settings, ACCOUNT, concurrency=1)
    batch = harness.create([sample_request("q-0", "Hello")])
    message = message_for(harness, batch["id"], 0)
    real_transact = claims.transact

    def dying_transact(elements):
        raise WorkerDied

    # When its first run dies after taking both slots (plain writes) and before its claim
    monkeypatch.setattr(claims, "transact", dying_transact)
    with pytest.raises(WorkerDied):
        Worker(harness.settings).process(message, NO_RECORD)
    monkeypatch.setattr(claims, "transact", real_transact)
    # Then nothing was claimed or counted, and the dead run's leases hold both slots
    assert (state_of(harness, batch["id"], 0) or {}).get("attempts", 0) == 0
    assert meta_of(harness, batch["id"]).running == 0
    leaked = Leases(harness.settings).holders(account_slots_key(ACCOUNT))
    assert len(leaked) == 1
    assert leaked.keys() == Leases(harness.settings).holders(model_slots_key(MODEL)).keys()
    # So the next delivery waits for the account's one slot...
    assert isinstance(Worker(harness.settings).process(message, NO_RECORD), Parked)
    assert (state_of(harness, batch["id"], 0) or {}).get("attempts", 0) == 0
    # ...until the leases expire: then it reaps them and runs, once
    harness.advance_clock(harness.settings.slot_lease_seconds + 1)
    assert isinstance(Worker(harness.settings).process(message, NO_RECORD), Done)
    assert state_of(harness, batch["id"], 0)["attempts"] == 1
    assert harness.batch(batch["id"])["request_counts"] == {"total": 1, "completed": 1, "failed": 0}
    assert Leases(harness.settings).holders(account_slots_key(ACCOUNT)) == {}


def test_an_aws_error_between_taking_the_slots_and_the_claim_gives_them_back(harness, monkeypatch):
    # Given a batch of one request, and DynamoDB failing the claim's transaction with a server error
    batch = harness.create([sample_request("q-0", "Hello")])
    message = message_for(harness, batch["id"], 0)
    real_transact = claims.transact

    def failing_transact(elements):
        raise ClientError({"Error": {"Code": "InternalServerError", "Message": "try again"}}, "TransactWriteItems")

    monkeypatch.setattr(claims, "transact", failing_transact)
    # When a run takes both slots and then meets the error
    with pytest.raises(ClientError):
        Worker(harness.settings).process(message, NO_RECORD)
    monkeypatch.setattr(claims, "transact", real_transact)
    # Then it gave both slots back (they do not wait to expire), and nothing was claimed
    assert Leases(harness.settings).holders(model_slots_key(MODEL)) == {}
    assert Leases(harness.settings).holders(account_slots_key(ACCOUNT)) == {}
    assert (state_of(harness, batch["id"], 0) or {}).get("attempts", 0) == 0
    # And the next delivery runs it, once
    assert isinstance(Worker(harness.settings).process(message, NO_RECORD), Done)
    assert harness.batch(batch["id"])["request_counts"] == {"total": 1, "completed": 1, "failed": 0}


def test_a_block_reaped_under_its_chains_is_lost_and_they_give_up(harness, upstream):
    # Given an invocation's block of a batch's slots, whose entries expired and were reaped while
    # its chain ran (held past its expiry)
    batch = harness.create([sample_request(f"q-{n}", f"Reaped {n}") for n in range(8)])
    invocation = InvocationState.new(harness.settings)
    worker = Worker(harness.settings, invocation=invocation)
    claimed = worker.claims.claim(message_for(harness, batch["id"], 0), {}, clock.now(harness.clock_file))
    leases = BlockLeases(harness.settings)
    harness.advance_clock(harness.settings.slot_lease_seconds + 1)
    later = clock.now(harness.clock_file)
    assert leases.reap(model_slots_key(MODEL), later) == leases.reap(account_slots_key(ACCOUNT), later) == 0
    # When another chain of the invocation takes a slot of the same batch
    assert not leases.take(model_slots_key(MODEL), claimed.block, 4, later)
    # Then the old block is lost (its chains hold nothing and leave at their next hand-over),
    # and the batch's next claims take a new block, counted from nothing
    assert claimed.block.lost
    fresh = invocation.blocks.for_batch(batch["id"])
    assert fresh is not claimed.block and fresh.holder != claimed.block.holder
    assert leases.take(model_slots_key(MODEL), fresh, 4, later)
    assert leases.read(model_slots_key(MODEL))["held"] == 1


def test_a_run_that_fails_after_its_claim_gives_its_slots_back(harness, monkeypatch):
    # Given a request whose run blows up between its claim and its settle
    batch = harness.create([sample_request("poison", "Poisonous")])

    def failing_call(settings, body, **kwargs):
        raise MemoryError("the run of this request ran out of memory")

    monkeypatch.setattr(upstream_client, "call", failing_call)
    # When the worker runs it
    with pytest.raises(MemoryError):
        Worker(harness.settings).process(message_for(harness, batch["id"], 0), NO_RECORD)
    # Then its request waits for the sweep, by its lease, but both its slots are free at once
    assert state_of(harness, batch["id"], 0)["status"] == "running"
    leases = BlockLeases(harness.settings)
    assert leases.read(model_slots_key(MODEL))["held"] == leases.read(account_slots_key(ACCOUNT))["held"] == 0


def test_a_poisoned_record_fails_alone_in_its_invocation(harness, monkeypatch):
    # Given an invocation of two records, one of which blows up in the worker
    batch = harness.create([sample_request("poison", "Poisonous"), sample_request("fine", "Healthy")])
    real_call = upstream_client.call

    def failing_call(settings, body, **kwargs):
        if b"Poisonous" in body:
            raise MemoryError("the run of this request ran out of memory")
        return real_call(settings, body, **kwargs)

    monkeypatch.setattr(upstream_client, "call", failing_call)
    url = harness.queues[MODEL]
    # When the worker handler runs them
    assert harness.pump_once(url) == 2
    # Then the healthy request completed and only the poisoned one waits to be run again
    lines = results_by_id(harness, batch["id"])
    assert lines["fine"]["status"] == "completed"
    assert lines["poison"]["status"] == "running"  # its claim is recovered by the sweep, by lease


def big_completion(letter: str) -> upstream_client.Outcome:
    body = {"object": "chat.completion", "choices": [{"message": {"content": letter * 400_000}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
    return upstream_client.Outcome("completed", response={"status_code": 200, "request_id": f"req-{letter}",
                                                          "body": body})


def test_a_superseded_run_never_overwrites_the_winners_stored_response(harness, monkeypatch):
    # Given a run that stalls past its lease while the request is taken back and run again (the
    # winner), both with responses too big for an item (stored in S3)
    batch = harness.create([sample_request("q-0", "Contested")])
    message = message_for(harness, batch["id"], 0)
    calls: list[str] = []

    def contested_call(*args, **kwargs):
        calls.append("call")
        if len(calls) == 1:
            expire_leases(harness)
            schedules.sweep(harness.settings)
            assert isinstance(Worker(harness.settings).process(message, NO_RECORD), Done)  # the winner
            return big_completion("A")  # the loser's late answer
        return big_completion("B")

    monkeypatch.setattr(upstream_client, "call", contested_call)
    # When the stalled run finally settles
    assert isinstance(Worker(harness.settings).process(message, NO_RECORD), Done)
    # Then the winner's response is the one stored and read
    line = harness.results(batch["id"])[0]
    assert line["status"] == "completed" and line["response"]["request_id"] == "req-B"
    assert set(line["response"]["body"]["choices"][0]["message"]["content"]) == {"B"}
    assert harness.batch(batch["id"])["request_counts"]["completed"] == 1
