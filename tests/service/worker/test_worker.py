"""The worker on moto, driven message by message: duplicates, lost claims and slot leases.

`Worker.process` is called directly with a request message, as the handler would after parsing
one SQS record, so each test decides exactly which delivery happens when. The messages that
create put on the queue stay there unless a test pumps them (then they are late duplicates).
"""

from __future__ import annotations

import time

import pytest
from freeinference_batch.batches import dispatch
from freeinference_batch.core import aws, clock
from freeinference_batch.core.catalog import load_catalog
from freeinference_batch.core.schemas import RequestMessage
from freeinference_batch.ops import schedules
from freeinference_batch.store import accounts_table
from freeinference_batch.store.batch_record import BatchRecord
from freeinference_batch.store.batch_table import BatchTable
from freeinference_batch.store.leases import Leases, Waiter, account_slots_key, entry_expiry, model_slots_key
from freeinference_batch.worker import FRESH_COPY_AFTER_RECEIVES, Done, InvocationState, Parked, Worker, gates
from freeinference_batch.worker import upstream as upstream_client
from freeinference_batch.worker.slot_blocks import BlockLeases, SlotBlock
from freeinference_batch_local.upstream_sim import prompt_tokens, reply_for

from tests.conftest import sample_request

MODEL = "glm-5.3-flash"
ACCOUNT = "acct-1"  # the harness's account (internal tier, 16 concurrent requests)
NO_RECORD: dict = {"messageId": "direct", "attributes": {}}


def message_for(harness, batch_id: str, position: int, model: str = MODEL) -> RequestMessage:
    table = BatchTable(harness.settings)
    meta = table.get_meta(batch_id)
    lane = table.get_lane_positions(batch_id, model)
    return RequestMessage(
        batch_id=batch_id,
        model=model,
        index=lane.index(position),
        position=position,
        account_id=meta.account_id,
        key_hash=meta.key_hash,
    )


def now(harness) -> float:
    return clock.now(harness.clock_file)


def meta_of(harness, batch_id: str) -> BatchRecord | None:
    return BatchTable(harness.settings).get_meta(batch_id)


def state_of(harness, batch_id: str, position: int) -> dict | None:
    return BatchTable(harness.settings).get_request(batch_id, position)


def usage_today(harness) -> int:
    _, usage = accounts_table.get_account_and_usage(harness.settings, ACCOUNT, clock.utc_day(now(harness)))
    return usage


def one_cost(content: str) -> int:
    messages = [{"role": "user", "content": content}]
    text, _ = reply_for(MODEL, messages, None)
    return load_catalog().models[MODEL].cost_nano(prompt_tokens(messages), len(text.split()))


def attempts(sim, batch_id: str, position: int) -> int:
    return sim.attempts_by_request.get(f"{batch_id}:{position}", 0)


def fill_slots(harness, slots_key: dict, holders: dict[str, float]) -> None:
    """Slots held by others, one each (the account's interactive requests, as the gateway takes
    them, or dead workers'), whatever the capacity."""
    leases = Leases(harness.settings)
    leases.ensure_item(slots_key, None)  # creates the slots item
    for holder, until in holders.items():
        assert leases.take_one(slots_key, holder, 10**6, until)


def hold_all_model_slots(harness, prefix: str, seconds: float = 3600) -> dict[str, float]:
    """Every one of the model's batch slots held by others for `seconds`: the holders."""
    capacity = load_catalog().models[MODEL].batch_concurrency
    holders = {f"{prefix}-{n}": now(harness) + seconds for n in range(capacity)}
    fill_slots(harness, model_slots_key(MODEL), holders)
    return holders


@pytest.fixture
def worker(harness) -> Worker:
    return Worker(harness.settings)


# ---------------------------------------------------------------- duplicates


def test_duplicate_of_a_settled_request_is_dropped_without_counting_twice(harness, upstream, worker):
    sim, _ = upstream
    # Given a two-request batch whose first request has run and settled
    batch = harness.create([sample_request("q-0", "First one"), sample_request("q-1", "Second one")])
    first = message_for(harness, batch["id"], 0)
    assert isinstance(worker.process(first, NO_RECORD), Done)
    meta = meta_of(harness, batch["id"])
    assert meta.status == "in_progress" and meta.completed == 1
    usage = usage_today(harness)
    assert usage == meta.cost_nano == one_cost("First one")
    # When a duplicate of its message arrives (the batch still runs)
    outcome = worker.process(first, NO_RECORD)
    # Then it is dropped: no upstream call, no count, no cost, no usage
    assert isinstance(outcome, Done)
    assert attempts(sim, batch["id"], 0) == 1
    again = meta_of(harness, batch["id"])
    assert (again.completed, again.failed, again.running, again.cost_nano) == (
        1,
        0,
        0,
        meta.cost_nano,
    )
    assert usage_today(harness) == usage
    assert state_of(harness, batch["id"], 0)["attempts"] == 1
    # And when every queued message (including the create-time copy of the first) is delivered,
    # the batch ends with each request counted once
    final = harness.run_to_final(batch["id"])
    assert final["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
    assert attempts(sim, batch["id"], 0) == 1 and attempts(sim, batch["id"], 1) == 1
    assert meta_of(harness, batch["id"]).cost_nano == one_cost("First one") + one_cost("Second one")
    assert usage_today(harness) == one_cost("First one") + one_cost("Second one")


def test_duplicate_arriving_while_the_request_runs_is_kept_until_it_settles(harness, upstream, worker, monkeypatch):
    sim, _ = upstream
    batch = harness.create([sample_request("q-0", "Running now")])
    message = message_for(harness, batch["id"], 0)
    real_call = upstream_client.call
    seen: list = []
    holders: list[int] = []

    def call_with_a_duplicate(*args, **kwargs):
        # While the first delivery waits on the model, a second delivery of the same message
        seen.append(Worker(harness.settings).process(message, NO_RECORD))
        holders.append(len(Leases(harness.settings).holders(model_slots_key(MODEL))))
        return real_call(*args, **kwargs)

    monkeypatch.setattr(upstream_client, "call", call_with_a_duplicate)
    assert isinstance(worker.process(message, NO_RECORD), Done)
    monkeypatch.setattr(upstream_client, "call", real_call)
    # Then the duplicate did not call the model and was kept until the run's lease ends (it may be
    # the very message the run holds, made visible again through an older receipt handle: deleting
    # it could lose the chain's token); once the request has settled, a delivery drops it
    assert len(seen) == 1 and isinstance(seen[0], Parked) and seen[0].seconds >= 1
    # (it gave back the slot it took before its claim failed: only the run's is held)
    assert holders == [1]
    assert Leases(harness.settings).holders(model_slots_key(MODEL)) == {}
    assert isinstance(Worker(harness.settings).process(message, NO_RECORD), Done)
    assert attempts(sim, batch["id"], 0) == 1
    final = harness.batch(batch["id"])
    assert final["status"] == "completed"
    assert final["request_counts"] == {"total": 1, "completed": 1, "failed": 0}
    assert meta_of(harness, batch["id"]).cost_nano == usage_today(harness) == one_cost("Running now")


# ---------------------------------------------------------------- lost claims


def test_settle_after_the_claim_was_taken_back_changes_nothing(harness, upstream, worker, monkeypatch):
    sim, _ = upstream
    # Given a request whose worker stalls in the upstream call past its lease, so that the sweep
    # takes the request back and re-sends it
    batch = harness.create([sample_request("q-0", "Slow worker")])
    message = message_for(harness, batch["id"], 0)
    real_call = upstream_client.call
    swept: list[dict] = []

    def stalled_call(*args, **kwargs):
        harness.advance_clock(harness.settings.lease_seconds + harness.settings.batch_dispatch_lease_seconds + 60)
        swept.append(schedules.sweep(harness.settings))
        return real_call(*args, **kwargs)

    monkeypatch.setattr(upstream_client, "call", stalled_call)
    # When the stalled worker gets its (successful) answer and tries to settle
    outcome = worker.process(message, NO_RECORD)
    monkeypatch.setattr(upstream_client, "call", real_call)
    # Then the settle does nothing: not completed, not charged; the request is queued again
    assert isinstance(outcome, Done)
    assert swept and swept[0]["recovered"] == 1 and swept[0]["resent"] == 1
    meta = meta_of(harness, batch["id"])
    assert meta.completed == 0 and meta.running == 0 and meta.cost_nano == 0
    assert usage_today(harness) == 0
    state = state_of(harness, batch["id"], 0)
    assert state["status"] == "queued" and "claim" not in state and "response" not in state
    assert Leases(harness.settings).holders(model_slots_key(MODEL)) == {}
    assert Leases(harness.settings).holders(account_slots_key(ACCOUNT)) == {}
    # And the re-sent message runs it again, and that run alone counts
    final = harness.run_to_final(batch["id"])
    assert final["status"] == "completed"
    assert final["request_counts"] == {"total": 1, "completed": 1, "failed": 0}
    assert attempts(sim, batch["id"], 0) == 2
    assert meta_of(harness, batch["id"]).cost_nano == usage_today(harness) == one_cost("Slow worker")
    assert state_of(harness, batch["id"], 0)["attempts"] == 2


# ---------------------------------------------------------------- slots


def test_claim_is_refused_while_model_slots_are_full_and_succeeds_after_expired_leases_are_reaped(
    harness, upstream, worker
):
    sim, _ = upstream
    # Given the model's 4 batch slots held by workers that died, their leases running 30 s more
    dead = hold_all_model_slots(harness, "dead-worker", seconds=30)
    batch = harness.create([sample_request("q-0", "Waiting for a slot")])
    message = message_for(harness, batch["id"], 0)
    # When its message is delivered
    outcome = worker.process(message, NO_RECORD)
    # Then the claim is refused: the message waits a little, the request did not start, and a
    # wait is not an attempt
    assert isinstance(outcome, Parked) and 0 < outcome.seconds <= 5
    assert attempts(sim, batch["id"], 0) == 0
    state = state_of(harness, batch["id"], 0)
    assert state is None or (state["status"] == "queued" and not state.get("attempts"))
    assert meta_of(harness, batch["id"]).running == 0
    assert set(Leases(harness.settings).holders(model_slots_key(MODEL))) == set(dead)
    # When the dead workers' leases have expired
    harness.advance_clock(31)
    outcome = worker.process(message, NO_RECORD)
    # Then the worker reaps them, claims a slot and runs the request; its own lease is released
    assert isinstance(outcome, Done)
    assert attempts(sim, batch["id"], 0) == 1
    assert harness.batch(batch["id"])["status"] == "completed"
    assert state_of(harness, batch["id"], 0)["attempts"] == 1
    assert Leases(harness.settings).holders(model_slots_key(MODEL)) == {}


def test_claim_waits_while_the_account_slots_are_used_by_interactive_requests(harness, upstream, worker):
    sim, _ = upstream
    # Given an account whose 16 concurrent-request slots its interactive requests all hold
    limit = 16
    interactive = {f"interactive-{n}": now(harness) + 3600 for n in range(limit)}
    fill_slots(harness, account_slots_key(ACCOUNT), interactive)
    batch = harness.create([sample_request("q-0", "Behind interactive traffic")])
    message = message_for(harness, batch["id"], 0)
    # Then its batch request waits without starting
    assert isinstance(worker.process(message, NO_RECORD), Parked)
    assert attempts(sim, batch["id"], 0) == 0
    assert Leases(harness.settings).holders(model_slots_key(MODEL)) == {}
    # When one interactive request finishes, Then the batch request takes its slot and runs
    Leases(harness.settings).release_one(account_slots_key(ACCOUNT), "interactive-0")
    assert isinstance(worker.process(message, NO_RECORD), Done)
    assert attempts(sim, batch["id"], 0) == 1
    assert harness.batch(batch["id"])["status"] == "completed"
    assert set(Leases(harness.settings).holders(account_slots_key(ACCOUNT))) == set(interactive) - {"interactive-0"}


@pytest.mark.parametrize("delivered", ["directly", "as an SQS record"])
def test_slots_freed_after_the_gates_were_read_are_taken_at_once(harness, upstream, worker, monkeypatch, delivered):
    sim, _ = upstream
    # Given the model's slots all held as the worker reads its gates, and given back just after
    # (their requests finished, or the item was being created by another worker)
    holders = hold_all_model_slots(harness, "finishing")
    batch = harness.create([sample_request("q-0", "A slot just freed")])
    read_gates = worker.gates.read

    def read_then_release(*args, **kwargs):
        gates = read_gates(*args, **kwargs)
        for holder in holders:
            Leases(harness.settings).release_one(model_slots_key(MODEL), holder)
        return gates

    monkeypatch.setattr(worker.gates, "read", read_then_release)
    if delivered == "directly":
        # Then the worker sees the freed slots on its second look and runs the request, not waits
        assert isinstance(worker.process(message_for(harness, batch["id"], 0), NO_RECORD), Done)
    else:
        # Then registering to wait shows the freed slots: the message comes back at once
        outcome = worker.handle_record(received_record(harness, batch["id"], 0))
        assert isinstance(outcome, Parked) and outcome.seconds == 0
        assert received_record_now(harness, batch["id"], 0)
        monkeypatch.setattr(worker.gates, "read", read_gates)
        assert harness.run_to_final(batch["id"])["request_counts"] == {"total": 1, "completed": 1, "failed": 0}
    assert attempts(sim, batch["id"], 0) == 1


def test_a_slot_freed_while_a_chain_registers_to_wait_sends_it_back_at_once(harness, upstream, worker, monkeypatch):
    sim, _ = upstream
    hold_all_model_slots(harness, "running")
    batch = harness.create([sample_request("q-0", "Freed while registering")])
    record = received_record(harness, batch["id"], 0)
    add_waiter = worker.leases.add_waiter

    def release_then_register(*args, **kwargs):
        # The releasing worker looks for waiters before this one is on the list: it wakes no one
        Leases(harness.settings).release_one(model_slots_key(MODEL), "running-0")
        return add_waiter(*args, **kwargs)

    monkeypatch.setattr(worker.leases, "add_waiter", release_then_register)
    # When the chain finds the slots full and registers as a waiter
    outcome = worker.handle_record(record)
    # Then it looks again and comes back at once instead of sleeping through its park
    assert isinstance(outcome, Parked) and outcome.seconds == 0
    assert received_record_now(harness, batch["id"], 0)
    assert attempts(sim, batch["id"], 0) == 0
    final = harness.run_to_final(batch["id"])
    assert final["request_counts"] == {"total": 1, "completed": 1, "failed": 0}
    assert attempts(sim, batch["id"], 0) == 1


def test_no_claim_while_interactive_load_fills_the_model(harness, upstream, worker):
    sim, _ = upstream
    # Given a model whose interactive load leaves no room for batch requests
    accounts_table.put_model_load(
        harness.settings, MODEL, load_catalog().models[MODEL].interactive_capacity, at=int(time.time())
    )
    batch = harness.create([sample_request("q-0", "Model busy")])
    message = message_for(harness, batch["id"], 0)
    assert isinstance(worker.process(message, NO_RECORD), Parked)
    assert attempts(sim, batch["id"], 0) == 0
    # When the load drops, Then it runs
    accounts_table.put_model_load(harness.settings, MODEL, 0, at=int(time.time()))
    assert isinstance(worker.process(message, NO_RECORD), Done)
    assert harness.batch(batch["id"])["request_counts"] == {"total": 1, "completed": 1, "failed": 0}


# ---------------------------------------------------------------- chains in one invocation

TIME_LEFT = 600.0  # seconds left in the invocation: plenty for a chain to run on


def queued_messages(harness, model: str = MODEL) -> int:
    attributes = aws.sqs().get_queue_attributes(
        QueueUrl=harness.queues[model],
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesDelayed"],
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesDelayed"])


def received_record(harness, batch_id: str, position: int, model: str = MODEL) -> dict:
    """Receive the queued message for one request (hiding it, as a delivery does): its record."""
    sqs = aws.sqs()
    for _ in range(20):
        found = None
        for received in sqs.receive_message(QueueUrl=harness.queues[model], MaxNumberOfMessages=10,
                                            VisibilityTimeout=3600, AttributeNames=["All"]).get("Messages", []):
            body = RequestMessage.model_validate_json(received["Body"])
            if (body.batch_id, body.position) == (batch_id, position):
                found = {"messageId": received["MessageId"], "receiptHandle": received["ReceiptHandle"],
                         "body": received["Body"], "attributes": received["Attributes"]}
            else:  # every other message received alongside goes back on the queue
                sqs.change_message_visibility(QueueUrl=harness.queues[model],
                                              ReceiptHandle=received["ReceiptHandle"], VisibilityTimeout=0)
        if found:
            return found
    raise AssertionError(f"no queued message for {batch_id} request {position}")


def test_a_chain_runs_on_in_one_invocation_and_each_request_counts_once(harness, upstream, worker):
    sim, _ = upstream
    # Given an 8-request batch: 4 chains (the model's batch concurrency) of 2 requests each
    contents = [f"Chain request {n}" for n in range(8)]
    batch = harness.create([sample_request(f"q-{n}", text) for n, text in enumerate(contents)])
    first = message_for(harness, batch["id"], 0)
    second = message_for(harness, batch["id"], 4)
    assert second.index == first.index + 4
    queued = queued_messages(harness)
    # When chain 0's first message is processed with time left in the invocation
    assert isinstance(worker.process(first, NO_RECORD, deadline=time.monotonic() + TIME_LEFT), Done)
    # Then both of its requests ran, each once, handing the slots over without a new message
    assert attempts(sim, batch["id"], 0) == attempts(sim, batch["id"], 4) == 1
    assert queued_messages(harness) == queued
    assert state_of(harness, batch["id"], 0)["status"] == state_of(harness, batch["id"], 4)["status"] == "completed"
    meta = meta_of(harness, batch["id"])
    assert (meta.completed, meta.failed, meta.running) == (2, 0, 0)
    assert meta.cost_nano == usage_today(harness) == one_cost(contents[0]) + one_cost(contents[4])
    assert Leases(harness.settings).holders(model_slots_key(MODEL)) == {}
    assert Leases(harness.settings).holders(account_slots_key(ACCOUNT)) == {}
    # And when every queued message (chain 0's among them, now a duplicate) is delivered, each
    # request ends counted and charged once
    final = harness.run_to_final(batch["id"])
    assert final["request_counts"] == {"total": 8, "completed": 8, "failed": 0}
    assert all(attempts(sim, batch["id"], n) == 1 for n in range(8))
    assert meta_of(harness, batch["id"]).cost_nano == usage_today(harness) == sum(map(one_cost, contents))


def test_the_chains_of_one_invocation_share_one_block_and_one_read_of_their_owner(harness, upstream, monkeypatch):
    # Given two chains of one batch in one worker invocation
    batch = harness.create([sample_request(f"q-{n}", f"Shared {n}") for n in range(8)])
    invocation = InvocationState.new(harness.settings)
    real_call = upstream_client.call
    seen: list[dict] = []

    def call_and_look(*args, **kwargs):
        seen.append(Leases(harness.settings).holders(model_slots_key(MODEL)))
        return real_call(*args, **kwargs)

    monkeypatch.setattr(upstream_client, "call", call_and_look)
    # When both run on to their chain's end
    for chain in (0, 1):
        assert isinstance(Worker(harness.settings, invocation=invocation).process(
            message_for(harness, batch["id"], chain), NO_RECORD, deadline=time.monotonic() + TIME_LEFT), Done)
    # Then their slots were one entry of the model's item, held by the invocation's block
    assert len(seen) == 4 and all(len(holders) == 1 for holders in seen)
    assert len({next(iter(holders)) for holders in seen}) == 1
    assert harness.batch(batch["id"])["request_counts"]["completed"] == 4
    # And a chain running on reuses the owner's items another chain of the invocation read
    read: list[set[str]] = []
    real_batch_get = gates.batch_get

    def recording_batch_get(request: dict) -> dict:
        read.append({f"{k['pk']['S']}/{k['sk']['S']}" for keys in request.values() for k in keys["Keys"]})
        return real_batch_get(request)

    monkeypatch.setattr(gates, "batch_get", recording_batch_get)
    second = InvocationState.new(harness.settings)
    for chain in (2, 3):
        Worker(harness.settings, invocation=second).gates.read(message_for(harness, batch["id"], chain), now(harness),
                                                                reuse_owner=True)
    owner = {f"ACCOUNT#{ACCOUNT}/ACCOUNT", f"MODEL#{MODEL}/BACKOFF"}
    assert owner <= read[0] and not owner & read[1], read


def test_a_chain_keeps_its_slots_across_hand_overs_and_renews_them_only_when_they_run_low(
        harness, upstream, worker, monkeypatch):
    # Given a 16-request batch: chain 0 runs requests 0, 4, 8 and 12
    batch = harness.create([sample_request(f"q-{n}", f"Held {n}") for n in range(16)])
    lease = harness.settings.lease_seconds
    real_call = upstream_client.call
    seen: list[tuple[dict, dict, str]] = []

    def call_and_look(*args, **kwargs):
        request = int(kwargs["request_ref"].rsplit(":", 1)[1])
        seen.append((Leases(harness.settings).holders(model_slots_key(MODEL)),
                     Leases(harness.settings).holders(account_slots_key(ACCOUNT)),
                     state_of(harness, batch["id"], request)["claim"]))
        if len(seen) == 2:  # the chain runs on for longer than a request's lease
            harness.advance_clock(1.1 * lease)
        return real_call(*args, **kwargs)

    monkeypatch.setattr(upstream_client, "call", call_and_look)
    # When chain 0 runs on in one invocation
    assert isinstance(worker.process(message_for(harness, batch["id"], 0), NO_RECORD,
                                     deadline=time.monotonic() + TIME_LEFT), Done)
    # Then each request had a claim of its own, but the chain held the same one slot of the model
    # and of the account throughout
    assert len(seen) == 4 and len({claim for _, _, claim in seen}) == 4
    for model_slots, account_slots, _ in seen:
        assert len(model_slots) == len(account_slots) == 1 and model_slots.keys() == account_slots.keys()
        assert model_slots.keys() == seen[0][0].keys()
    expiries = [entry_expiry(model_slots[next(iter(model_slots))]) for model_slots, _, _ in seen]
    # and its hand-overs wrote the slots only once less than a request's lease of them was left
    assert expiries[1] == expiries[0]
    assert expiries[2] > expiries[1] + lease
    assert expiries[3] == expiries[2]
    # And at the chain's end both slots are free, every request counted once
    assert Leases(harness.settings).holders(model_slots_key(MODEL)) == {}
    assert Leases(harness.settings).holders(account_slots_key(ACCOUNT)) == {}
    assert meta_of(harness, batch["id"]).completed == 4


def test_a_chain_without_time_for_another_request_sends_its_next_message(harness, upstream, worker):
    sim, _ = upstream
    batch = harness.create([sample_request(f"q-{n}", f"Short of time {n}") for n in range(8)])
    queued = queued_messages(harness)
    # When a 900 s invocation has time for the message's request (a quick answer) but less left than
    # a hand-over needs: a call that would get the whole timeout (10 s) after the settle time
    harness.configure(BATCH_UPSTREAM_TIMEOUT_SECONDS=10)
    worker = Worker(harness.settings)
    too_little = harness.settings.batch_settle_seconds + 5
    outcome = worker.process(message_for(harness, batch["id"], 0), NO_RECORD, deadline=time.monotonic() + too_little,
                             invocation_seconds=900)
    # Then only the message's own request ran, and the chain goes on by a new message
    assert isinstance(outcome, Done)
    assert attempts(sim, batch["id"], 0) == 1 and attempts(sim, batch["id"], 4) == 0
    assert queued_messages(harness) == queued + 1
    assert Leases(harness.settings).holders(model_slots_key(MODEL)) == {}
    final = harness.run_to_final(batch["id"])
    assert final["request_counts"] == {"total": 8, "completed": 8, "failed": 0}
    assert all(attempts(sim, batch["id"], n) == 1 for n in range(8))


def test_a_failed_wake_does_not_stop_the_chain(harness, upstream, worker, monkeypatch):
    sim, _ = upstream
    batch = harness.create([sample_request(f"q-{n}", f"Wake fails {n}") for n in range(8)])
    queued = queued_messages(harness)

    def throttled(*args, **kwargs):
        raise RuntimeError("DynamoDB throttled the read")

    read_slots = worker.waiting.read_slots
    monkeypatch.setattr(worker.waiting, "read_slots", throttled)
    # When waking waiters fails after a request settled
    outcome = worker.process(message_for(harness, batch["id"], 0), NO_RECORD)
    # Then the request still counts once and the chain's next message is still sent
    assert isinstance(outcome, Done)
    assert queued_messages(harness) == queued + 1
    assert meta_of(harness, batch["id"]).completed == 1
    monkeypatch.setattr(worker.waiting, "read_slots", read_slots)
    final = harness.run_to_final(batch["id"])
    assert final["request_counts"] == {"total": 8, "completed": 8, "failed": 0}
    assert all(attempts(sim, batch["id"], n) == 1 for n in range(8))

def test_a_chain_stops_handing_over_when_interactive_load_takes_the_model(harness, upstream, worker, monkeypatch):
    sim, _ = upstream
    batch = harness.create([sample_request(f"q-{n}", f"Load rises {n}") for n in range(8)])
    real_call = upstream_client.call

    def call_while_load_rises(*args, **kwargs):
        # The interactive gateway reports the model full while the batch request runs
        accounts_table.put_model_load(
            harness.settings, MODEL, load_catalog().models[MODEL].interactive_capacity, at=int(time.time()))
        return real_call(*args, **kwargs)

    monkeypatch.setattr(upstream_client, "call", call_while_load_rises)
    outcome = worker.process(message_for(harness, batch["id"], 0), NO_RECORD, deadline=time.monotonic() + TIME_LEFT)
    monkeypatch.setattr(upstream_client, "call", real_call)
    # Then the running request finished and gave its slot back; the next one did not start
    assert isinstance(outcome, Done)
    assert attempts(sim, batch["id"], 0) == 1 and attempts(sim, batch["id"], 4) == 0
    assert meta_of(harness, batch["id"]).completed == 1
    assert Leases(harness.settings).holders(model_slots_key(MODEL)) == {}
    # And the chain's next request waits for the load to drop, then runs
    assert isinstance(worker.process(message_for(harness, batch["id"], 4), NO_RECORD), Parked)
    accounts_table.put_model_load(harness.settings, MODEL, 0, at=int(time.time()))
    final = harness.run_to_final(batch["id"])
    assert final["request_counts"] == {"total": 8, "completed": 8, "failed": 0}
    assert all(attempts(sim, batch["id"], n) == 1 for n in range(8))


@pytest.mark.parametrize("other_holders_are", ["the big batch's other chains", "another batch"])
def test_a_big_batch_yields_its_slot_to_a_small_waiting_batch(harness, upstream, worker, monkeypatch,
                                                                     other_holders_are):
    sim, _ = upstream
    # Given a big batch and a small one on the same model, the small one's first message delivered
    big = harness.create([sample_request(f"big-{n}", f"Big {n}") for n in range(8)])
    small = harness.create([sample_request(f"small-{n}", f"Small {n}") for n in range(2)])
    small_record = received_record(harness, small["id"], 0)
    # and the model's other 3 slots held (for an hour) by another invocation's block of the big
    # batch's chains 0-2 (named to come first in the batch's order of blocks: fairness.keeps_slot),
    # or of a third batch's
    owner = big["id"] if other_holders_are == "the big batch's other chains" else "batch_other"
    others = SlotBlock(f"{owner}.0", None, 3600)
    leases = BlockLeases(harness.settings)
    for _ in range(3):
        assert leases.take(model_slots_key(MODEL), others, 4, now(harness))
    real_call = upstream_client.call
    small_outcomes: list = []

    def call_while_the_small_batch_arrives(*args, **kwargs):
        if not small_outcomes:  # all 4 slots are taken now: the small batch's chain must wait
            small_outcomes.append(Worker(harness.settings).handle_record(small_record))
        return real_call(*args, **kwargs)

    monkeypatch.setattr(upstream_client, "call", call_while_the_small_batch_arrives)
    # When the big batch's chain 3 finishes its request with time left to run on
    outcome = worker.process(message_for(harness, big["id"], 3), NO_RECORD, deadline=time.monotonic() + TIME_LEFT)
    monkeypatch.setattr(upstream_client, "call", real_call)
    assert isinstance(outcome, Done) and isinstance(small_outcomes[0], Parked)
    assert attempts(sim, big["id"], 3) == 1 and attempts(sim, small["id"], 0) == 0
    slots = Leases(harness.settings).holders(model_slots_key(MODEL))
    woken = received_record_now(harness, small["id"], 0)
    # Then it yields its slot to the small batch (a batch with few requests left goes first, even
    # when this is the big batch's last slot): its next request waits for a message of its own,
    # and the small batch's parked message is made visible at once
    assert attempts(sim, big["id"], 7) == 0
    assert set(slots) == {others.holder}
    assert woken
    # And when the other holders finish, everything ends counted once
    for _ in range(3):
        leases.give(model_slots_key(MODEL), others)
    for batch in (big, small):
        assert harness.run_to_final(batch["id"])["status"] == "completed"
    assert all(attempts(sim, big["id"], n) == 1 for n in range(8))
    assert all(attempts(sim, small["id"], n) == 1 for n in range(2))


def received_record_now(harness, batch_id: str, position: int, model: str = MODEL) -> bool:
    """Whether the request's message is visible on the queue right now."""
    for received in aws.sqs().receive_message(QueueUrl=harness.queues[model], MaxNumberOfMessages=10,
                                              VisibilityTimeout=0).get("Messages", []):
        body = RequestMessage.model_validate_json(received["Body"])
        if (body.batch_id, body.position) == (batch_id, position):
            return True
    return False


def register_waiter(harness, slots_key: dict, record: dict, remaining: int = 1) -> Waiter:
    """The record's chain registered as waiting on the slots item (as a parked delivery does)."""
    message = RequestMessage.model_validate_json(record["body"])
    waiter = Waiter(id=f"{message.batch_id}#0", batch_id=message.batch_id, model=message.model,
                    remaining=remaining, handle=record["receiptHandle"], until=now(harness) + 60, since=now(harness))
    leases = Leases(harness.settings)
    assert leases.add_waiter(slots_key, slots_item(harness, slots_key), waiter, now(harness)) is not None
    return waiter


def slots_item(harness, slots_key: dict) -> dict | None:
    return Worker(harness.settings).waiting.read_slots([slots_key])[0]


def test_a_yielding_chain_wakes_from_what_it_read_and_looks_again_where_that_is_stale(harness, upstream, worker):
    # Given a yielding chain's read of the slots: one batch waiting on the model's slots, none on
    # the account's
    fill_slots(harness, model_slots_key(MODEL), {})
    fill_slots(harness, account_slots_key(ACCOUNT), {})
    batches = [harness.create([sample_request("q-0", f"Waiting {n}")]) for n in range(3)]
    first, second, third = (received_record(harness, batch["id"], 0) for batch in batches)
    taken = register_waiter(harness, model_slots_key(MODEL), first)
    read = [slots_item(harness, model_slots_key(MODEL)), slots_item(harness, account_slots_key(ACCOUNT))]
    # and, since that read, the model's waiter woken by another worker, a second batch waiting
    # on the model and a third on the account
    assert Leases(harness.settings).take_waiter(model_slots_key(MODEL), taken)
    register_waiter(harness, model_slots_key(MODEL), second)
    register_waiter(harness, account_slots_key(ACCOUNT), third)
    # When the chain, having released its slots, wakes waiters from what it read
    worker.waiting.wake_waiters(message_for(harness, batches[0]["id"], 0), ACCOUNT, now(harness), known=read)
    # Then the waiters it could not know of are woken from a fresh read, and none is left listed
    assert received_record_now(harness, batches[1]["id"], 0)
    assert received_record_now(harness, batches[2]["id"], 0)
    assert not received_record_now(harness, batches[0]["id"], 0)  # taken by the other worker, not made visible here
    for slots_key in (model_slots_key(MODEL), account_slots_key(ACCOUNT)):
        assert not (slots_item(harness, slots_key) or {}).get("waiters")


def test_a_fresh_copy_of_a_long_waiting_message_keeps_its_place_among_the_waiters(harness, worker, monkeypatch):
    # Given a chain whose message has waited for a slot so often that it is replaced by a copy
    sent: list[RequestMessage] = []
    real_send = dispatch.send
    monkeypatch.setattr(dispatch, "send", lambda settings, messages, **kw: (sent.extend(messages),
                                                                             real_send(settings, messages, **kw)))
    batch = harness.create([sample_request("q-0")])
    sent.clear()
    hold_all_model_slots(harness, "others")
    record = received_record(harness, batch["id"], 0)
    began = float(record["attributes"]["SentTimestamp"]) / 1000 - 3600  # it waits for an hour
    record["attributes"] = {**record["attributes"], "SentTimestamp": str(int(began * 1000)),
                            "ApproximateReceiveCount": str(FRESH_COPY_AFTER_RECEIVES)}
    # When it is delivered again and still finds the slots full
    assert isinstance(worker.handle_record(record), Done)  # the copy replaces it
    # Then the copy carries when the wait began, so it stays ahead of chains that waited less
    (copy,) = sent
    assert (copy.batch_id, copy.position) == (batch["id"], 0)
    assert copy.waiting_since == pytest.approx(began, abs=1)

