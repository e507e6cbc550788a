"""Faults a request can bring to the worker, on moto: runs that keep dying, poisoned records,
bodies that expand when parsed, answers that are not JSON, superseded runs, owners that lose
the right to run a batch while one of its workers dies."""

from __future__ import annotations

import gzip
import json
import threading
import time
import tracemalloc
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from botocore.exceptions import ClientError
from freeinference_batch import accounts
from freeinference_batch.core import aws, clock
from freeinference_batch.core.catalog import load_catalog
from freeinference_batch.ops import schedules
from freeinference_batch.store import input_chunks
from freeinference_batch.store.leases import Leases, account_slots_key, model_slots_key
from freeinference_batch.worker import Done, InvocationState, Parked, Worker, claims, runner
from freeinference_batch.worker import upstream as upstream_client
from freeinference_batch.worker.memory import LARGE_BYTES, MIB, LargeRequests
from freeinference_batch.worker.slot_blocks import BlockLeases, SlotBlock, SlotBlocks

from tests.conftest import StubUpstream, sample_request
from tests.service.worker.test_worker import ACCOUNT, MODEL, NO_RECORD, message_for, meta_of, state_of, usage_today


class WorkerDied(BaseException):
    """The Lambda running the request is killed mid-run: nothing cleans up."""


def expire_leases(harness) -> None:
    """Move the clock past a running request's lease and a sent message's dispatch lease."""
    harness.advance_clock(harness.settings.lease_seconds + harness.settings.batch_dispatch_lease_seconds + 60)


def results_by_id(harness, batch_id: str) -> dict[str, dict]:
    return {line["custom_id"]: line for line in harness.results(batch_id)}


@pytest.fixture
def stub(harness) -> Iterator[StubUpstream]:
    server = StubUpstream()
    harness.configure(UPSTREAM_BASE_URL=server.base_url)
    yield server
    server.stop()


# ---------------------------------------------------------------- runs that keep dying


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
    leases = Leases(harness.settings)
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
    leases = Leases(harness.settings)
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


# ---------------------------------------------------------------- bodies that expand when parsed


def test_a_fragmented_body_is_refused_at_create_and_stores_nothing(harness):
    # Given 27 MB of `[],` (it gzips to 26 KB, and parses into 9 million Python lists)
    body = (b'{"requests":[{"custom_id":"bomb","body":{"model":"glm-5.3-flash","messages":['
            + b"[]," * 9_000_000 + b'{"role":"user","content":"hi"}]}}]}')
    # When it is sent gzipped
    status, answer = harness.call("POST", "/v1/batches", raw=gzip.compress(body, 6),
                                  headers={"content-encoding": "gzip"})
    # Then it is refused, saying why, and nothing is stored
    assert status == 400, answer
    assert "JSON values" in answer["error"]["message"] and "5,000,000" in answer["error"]["message"]
    assert harness.call("GET", "/v1/batches")[1]["data"] == []


def test_a_worker_holds_a_request_as_bytes_in_memory_bounded_by_its_size(harness, stub):
    # Given an accepted request whose body parses into far more memory than its JSON takes
    # (2.4 million empty arrays: 7 MB of JSON, about 150 MB of Python lists)
    fragments = b"[]," * 2_400_000
    body = (b'{"requests":[{"custom_id":"big","body":{"model":"glm-5.3-flash","messages":['
            + fragments + b'{"role":"user","content":"hi"}]}}]}')
    status, answer = harness.call("POST", "/v1/batches", raw=gzip.compress(body, 6),
                                  headers={"content-encoding": "gzip"})
    assert status == 200, answer
    stub.answer = json.dumps({"object": "chat.completion", "choices": [{"message": {"content": "ok"}}],
                              "usage": {"prompt_tokens": 3, "completion_tokens": 1}}).encode()
    # When a worker runs it, measured by tracemalloc
    tracemalloc.start()
    try:
        outcome = Worker(harness.settings).process(message_for(harness, answer["id"], 0), NO_RECORD)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Then it was sent whole, and the worker's peak memory stayed a small multiple of the body's size
    assert isinstance(outcome, Done)
    sent = b'{"model":"glm-5.3-flash","messages":[' + fragments + b'{"role":"user","content":"hi"}]}'
    assert stub.received == [len(sent)]
    assert peak < 4 * len(body), f"peak {peak / 1e6:.0f} MB for a {len(body) / 1e6:.0f} MB request"
    assert harness.batch(answer["id"])["request_counts"]["completed"] == 1


class CountingPermits(LargeRequests):
    """The invocation's permits, counting how many are held at most at once."""

    def __init__(self, permits: int) -> None:
        super().__init__(permits)
        self.held = self.most_held = self.taken = 0
        self._count = threading.Lock()
        free = self._free
        counting = self

        class Counted:
            def acquire(self) -> None:
                free.acquire()
                with counting._count:
                    counting.held += 1
                    counting.taken += 1
                    counting.most_held = max(counting.most_held, counting.held)

            def release(self) -> None:
                with counting._count:
                    counting.held -= 1
                free.release()

        self._free = Counted()  # type: ignore[assignment]


def test_large_answers_take_turns_for_the_invocations_memory_and_all_complete(harness, stub, monkeypatch):
    # Given three requests whose answers are 2 MiB each (above LARGE_BYTES), and a worker with
    # one permit for large requests
    stub.answer = json.dumps({"object": "chat.completion", "choices": [{"message": {"content": "x" * 2 * MIB}}],
                              "usage": {"prompt_tokens": 3, "completion_tokens": 1}}).encode()
    permits = CountingPermits(1)
    monkeypatch.setattr(runner, "large_requests", lambda *sizing: permits)
    batch = harness.create([sample_request(f"q-{n}") for n in range(3)])
    # When one invocation runs the three side by side
    with ThreadPoolExecutor(max_workers=3) as pool:
        outcomes = list(pool.map(lambda n: Worker(harness.settings).process(message_for(harness, batch["id"], n),
                                                                             NO_RECORD), range(3)))
    # Then each took the permit in turn, and every answer was kept
    assert all(isinstance(outcome, Done) for outcome in outcomes), outcomes
    assert (permits.taken, permits.most_held, permits.held) == (3, 1, 0)
    assert harness.batch(batch["id"])["request_counts"]["completed"] == 3
    assert all(line["response"]["body"]["choices"][0]["message"]["content"] == "x" * 2 * MIB
               for line in harness.results(batch["id"]))


def test_a_large_request_takes_its_permit_before_its_input_is_decompressed(harness, stub, monkeypatch):
    # Given a request whose body is over LARGE_BYTES, beside a small one, and one permit
    stub.answer = json.dumps({"object": "chat.completion", "choices": [], "usage": {}}).encode()
    permits = CountingPermits(1)
    monkeypatch.setattr(runner, "large_requests", lambda *sizing: permits)
    batch = harness.create([sample_request("small"), sample_request("large", "x" * (LARGE_BYTES + 1))])
    held_when_unpacked: list[int] = []
    real_unpack = input_chunks.unpack

    def unpack(data: bytes):
        held_when_unpacked.append(permits.held)
        return real_unpack(data)

    monkeypatch.setattr(input_chunks, "unpack", unpack)
    # When a worker runs each
    for position in (0, 1):
        assert isinstance(Worker(harness.settings).process(message_for(harness, batch["id"], position), NO_RECORD),
                          Done)
    # Then the large one's input (a chunk of its own) was decompressed under its permit, the small
    # one's without one
    assert held_when_unpacked == [0, 1]
    assert (permits.taken, permits.held) == (1, 0)


def test_small_answers_take_no_permit(harness, stub, monkeypatch):
    stub.answer = json.dumps({"object": "chat.completion", "choices": [], "usage": {}}).encode()
    permits = CountingPermits(1)
    monkeypatch.setattr(runner, "large_requests", lambda *sizing: permits)
    batch = harness.create([sample_request("q-0")])
    assert isinstance(Worker(harness.settings).process(message_for(harness, batch["id"], 0), NO_RECORD), Done)
    assert permits.taken == 0


# ---------------------------------------------------------------- numbers JSON does not have


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
def test_non_finite_numbers_are_refused_at_create_naming_the_request(harness, constant):
    body = (b'{"requests":[{"custom_id":"fine","body":{"model":"glm-5.3-flash","messages":[{"role":"user",'
            b'"content":"hi"}]}},{"custom_id":"odd","body":{"model":"glm-5.3-flash","messages":[{"role":"user",'
            b'"content":"hi"}],"temperature":' + constant + b"}}]}")
    status, answer = harness.call("POST", "/v1/batches", raw=body)
    assert status == 400, answer
    assert answer["error"]["message"].startswith("requests[1] (custom_id 'odd'): body holds NaN or Infinity")
    assert harness.call("GET", "/v1/batches")[1]["data"] == []


@pytest.mark.parametrize(("answer", "charged"), [
    (b'{"object":"chat.completion","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7},"score":NaN}',
     True),
    (b"<html>Bad gateway</html>", False),
    (b'["not", "an", "object"]', False),
    (b"", False),
])
def test_an_answer_that_is_not_a_json_object_is_a_server_error_retried_then_upstream_error(
        harness, stub, answer, charged):
    # Given an upstream whose 200 answer is not a JSON object (not a chat completion), and 3 attempts
    harness.configure(BATCH_MAX_ATTEMPTS="3")
    stub.answer = answer
    batch = harness.create([sample_request("q-0", "Hello")])
    message = message_for(harness, batch["id"], 0)
    # When the request runs: it is retried like a 5xx, showing what went wrong meanwhile
    for attempt in (1, 2):
        assert isinstance(Worker(harness.settings).process(message, NO_RECORD), Parked)
        state = state_of(harness, batch["id"], 0)
        assert (state["status"], state["attempts"]) == ("queued", attempt)
        line = harness.results(batch["id"])[0]
        assert line["status"] == "queued" and line["error"]["code"] == "upstream_error"
    assert isinstance(Worker(harness.settings).process(message, NO_RECORD), Done)
    # Then after every attempt it fails upstream_error (502), charged once for the tokens reported
    line = harness.results(batch["id"])[0]
    assert line["status"] == "failed" and line["error"]["code"] == "upstream_error"
    assert line["error"]["status"] == 502 and "not valid JSON" in line["error"]["message"]
    assert state_of(harness, batch["id"], 0)["attempts"] == 3 and len(stub.received) == 3
    cost = load_catalog().models[MODEL].cost_nano(5, 7) if charged else 0
    assert meta_of(harness, batch["id"]).cost_nano == usage_today(harness) == cost
    assert harness.batch(batch["id"])["status"] == "completed"


def test_an_answer_too_large_to_keep_is_retried_like_a_5xx(harness, stub, monkeypatch):
    monkeypatch.setattr(upstream_client, "MAX_RESPONSE_BYTES", 1000)
    harness.configure(BATCH_MAX_ATTEMPTS="2")
    stub.answer = json.dumps({"object": "chat.completion", "choices": [], "pad": "x" * 2000}).encode()
    batch = harness.create([sample_request("q-0", "Hello")])
    message = message_for(harness, batch["id"], 0)
    assert isinstance(Worker(harness.settings).process(message, NO_RECORD), Parked)
    assert isinstance(Worker(harness.settings).process(message, NO_RECORD), Done)
    line = harness.results(batch["id"])[0]
    assert (line["status"], line["error"]["code"], line["error"]["status"]) == ("failed", "upstream_error", 502)
    assert "larger than 1000 bytes" in line["error"]["message"] and len(stub.received) == 2


def test_an_answer_with_empty_object_keys_is_stored_and_read_back(harness, stub):
    # DynamoDB refuses empty attribute names, map keys included: responses are stored as bytes.
    completion = {"object": "chat.completion", "choices": [{"message": {"content": "hi"}}],
                  "extra": {"": "an empty key", "nested": {"": []}}, "usage": {"prompt_tokens": 1}}
    stub.answer = json.dumps(completion).encode()
    batch = harness.create([sample_request("q-0", "Hello")])
    assert isinstance(Worker(harness.settings).process(message_for(harness, batch["id"], 0), NO_RECORD), Done)
    line = harness.results(batch["id"])[0]
    assert line["status"] == "completed" and line["response"]["body"] == completion


# ---------------------------------------------------------------- superseded runs


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


# ---------------------------------------------------------------- failed, expired, cancelled


def test_a_failed_batch_recovers_a_dead_run_and_its_counts_never_change(harness, monkeypatch):
    # Given a batch whose first request runs on a worker that dies mid-run
    batch = harness.create([sample_request("q-0", "Dies"), sample_request("q-1", "Waits")])

    def dying_call(*args, **kwargs):
        raise WorkerDied

    monkeypatch.setattr(upstream_client, "call", dying_call)
    with pytest.raises(WorkerDied):
        Worker(harness.settings).process(message_for(harness, batch["id"], 0), NO_RECORD)
    # When the key that created it is revoked, and the second request meets the owner check
    assert accounts.revoke_key(harness.settings, harness.key)
    assert isinstance(Worker(harness.settings).process(message_for(harness, batch["id"], 1), NO_RECORD), Done)
    # Then the batch does not take a final status while a request runs...
    assert meta_of(harness, batch["id"]).status == "in_progress"
    # ...the sweep takes the dead run back once its lease ends, and the batch fails
    expire_leases(harness)
    swept = schedules.sweep(harness.settings)
    assert swept["recovered"] == 1 and swept["resent"] == 0 and swept["finalized"] == 1
    reader = accounts.create_key(harness.settings, "acct-1")
    final = _batch(harness, batch["id"], reader)
    assert final["status"] == "failed" and final["error"]["code"] == "owner_unauthorized"
    assert final["request_counts"] == {"total": 2, "completed": 0, "failed": 2}
    lines = _results(harness, batch["id"], reader)
    assert [line["error"]["code"] for line in lines] == ["batch_failed", "batch_failed"]
    # And nothing changes afterwards
    schedules.sweep(harness.settings)
    schedules.expire(harness.settings)
    assert _batch(harness, batch["id"], reader) == final


def _batch(harness, batch_id: str, key: str) -> dict:
    status, body = harness.call("GET", f"/v1/batches/{batch_id}", key=key)
    assert status == 200, body
    return body


def _results(harness, batch_id: str, key: str) -> list[dict]:
    status, page = harness.call("GET", f"/v1/batches/{batch_id}/results", key=key)
    assert status == 200, page
    return page["data"]


def test_a_request_that_ran_keeps_its_last_error_when_its_batch_is_cancelled(harness):
    # Given a request that failed once with a 503 and waits for its retry
    batch = harness.create([sample_request("q-0", "Flaky [sim:fail=503*5]")])
    outcome = Worker(harness.settings).process(message_for(harness, batch["id"], 0), NO_RECORD)
    assert isinstance(outcome, Parked)
    # When the batch is cancelled meanwhile
    status, cancelled = harness.call("POST", f"/v1/batches/{batch['id']}/cancel")
    assert status == 200 and cancelled["status"] == "cancelled"
    # Then its result is cancelled, with the error of the run it did have
    line = harness.results(batch["id"])[0]
    assert line["status"] == "cancelled"
    assert line["error"]["code"] == "service_unavailable" and line["error"]["status"] == 503


# ---------------------------------------------------------------- models a key may no longer use


def test_a_model_the_owners_tier_may_no_longer_use_fails_model_not_found_without_an_upstream_call(
        harness, stub, tmp_path):
    # Given a catalog where a second tier may batch but may not use glm-5.3-flash, and a batch of
    # the internal tier on both models
    catalog = json.loads(load_catalog().model_dump_json())
    catalog["batch_tiers"] = ["internal", "partner"]
    catalog["models"][MODEL]["tiers"] = ["internal"]
    catalog["models"]["qwen3.6-35b"]["tiers"] = ["internal", "partner"]
    path = tmp_path / "models.json"
    path.write_text(json.dumps(catalog))
    harness.configure(MODEL_CATALOG_PATH=str(path))
    stub.answer = json.dumps({"object": "chat.completion", "choices": [], "usage": {}}).encode()
    batch = harness.create([sample_request("q-1"), sample_request("q-2", model="qwen3.6-35b")])
    # When the account's tier changes mid-batch
    accounts.set_account(harness.settings, ACCOUNT, tier="partner")
    # Then the request on the model the tier may no longer use fails model_not_found, as the spec
    # words it, without reaching the upstream; the other one runs
    assert isinstance(Worker(harness.settings).process(message_for(harness, batch["id"], 0), NO_RECORD), Done)
    assert stub.received == []
    assert isinstance(Worker(harness.settings).process(
        message_for(harness, batch["id"], 1, model="qwen3.6-35b"), NO_RECORD), Done)
    lines = results_by_id(harness, batch["id"])
    assert lines["q-1"]["status"] == "failed"
    assert lines["q-1"]["error"] == {"code": "model_not_found", "message": "Model 'glm-5.3-flash' not found",
                                     "status": 404}
    assert lines["q-2"]["status"] == "completed" and len(stub.received) == 1
    assert harness.batch(batch["id"])["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
