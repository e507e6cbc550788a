"""No request starts after a cancel, an expiry or a failure has been written (issue 30), on moto:
a chain running on claims its next request with a write of the request alone, so the batch it
checks must be read after that claim (worker/settling.py `_hand_over`). The race is made
deterministic: the batch's stop is written just before the hand-over's claim, after anything the
chain read before it."""

from __future__ import annotations

import time

import pytest
from freeinference_batch.batches import lifecycle
from freeinference_batch.worker import Done, Worker
from freeinference_batch.worker import upstream as upstream_client
from freeinference_batch.worker.settling import Settler

from tests.conftest import sample_request
from tests.service.worker.helpers import NO_RECORD, TIME_LEFT, message_for, meta_of, now, state_of


def stop_by_cancel(harness, batch_id: str) -> None:
    status, body = harness.call("POST", f"/v1/batches/{batch_id}/cancel")
    assert status == 200 and body["status"] == "cancelling", body


def stop_by_failure(harness, batch_id: str) -> None:
    meta = meta_of(harness, batch_id)
    assert lifecycle.fail_batch(harness.settings, meta, now(harness), "owner_unauthorized", "The key was revoked")


def stop_by_expiry(harness, batch_id: str) -> None:
    # The window closes: the clock passes the batch's expires_at (no write: the time itself)
    harness.advance_clock(meta_of(harness, batch_id).expires_at - now(harness) + 1)


@pytest.mark.parametrize(("stop", "ending"), [(stop_by_cancel, "cancelled"), (stop_by_failure, "failed"),
                                              (stop_by_expiry, "expired")])
def test_no_request_starts_after_its_batch_stopped_just_before_a_hand_overs_claim(harness, upstream, monkeypatch,
                                                                                   stop, ending):
    # Given an 8-request batch (4 chains of 2), and an upstream that notes each call it begins
    batch = harness.create([sample_request(f"q-{n}", f"Race {n}") for n in range(8)])
    events: list[str] = []
    real_call = upstream_client.call

    def noting_call(settings, body, **kwargs):
        events.append(f"call {kwargs['request_ref'].split(':')[1]}")
        return real_call(settings, body, **kwargs)

    monkeypatch.setattr(upstream_client, "call", noting_call)
    # And the batch stops (cancel, failure, expiry) just before chain 0 claims its next request,
    # after the chain's every read of the batch so far
    real_claim_next = Settler._claim_next

    def stop_then_claim(self, following, *args, **kwargs):
        stop(harness, batch["id"])
        events.append("stopped")
        return real_claim_next(self, following, *args, **kwargs)

    monkeypatch.setattr(Settler, "_claim_next", stop_then_claim)
    # When chain 0's first message runs with time left for another request
    result = Worker(harness.settings).process(message_for(harness, batch["id"], 0), NO_RECORD,
                                              deadline=time.monotonic() + TIME_LEFT)
    # Then its first request ran, and no upstream call began after the stop was written
    assert isinstance(result, Done)
    assert events == ["call 0", "stopped"]
    assert state_of(harness, batch["id"], 0)["status"] == "completed"
    # And the next request never started: queued, its attempt given back
    handed_back = state_of(harness, batch["id"], 4)
    assert handed_back["status"] == "queued" and int(handed_back.get("attempts", 0)) == 0
    # And the chain was given up with its request counted: none runs
    meta = meta_of(harness, batch["id"])
    assert (meta.running, meta.completed, meta.failed) == (0, 1, 0)
    # And once the messages left are delivered the batch ends, no other request having started
    final = harness.run_to_final(batch["id"])
    assert final["status"] == ending and final["request_counts"]["completed"] == 1
    assert events == ["call 0", "stopped"]
