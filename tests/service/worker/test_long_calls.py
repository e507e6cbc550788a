"""Long generations (issue 21): a call may run as long as the per-call timeout, cut to what its
worker invocation has left (call_budget.py). A call the invocation's end cuts runs again in a
fresh invocation without using an attempt; a call that had the most a call may run and no answer
timed out, and is retried as a 429 or a 5xx is, up to eight attempts in all (issue 30).
Durations are scaled down (an invocation of a few seconds, latencies just over what it leaves),
so the arithmetic is the deployed one and no test waits minutes."""

from __future__ import annotations

import time

from freeinference_batch.store.batch_table import BatchTable

from tests.conftest import sample_request


def state(harness, batch_id: str, position: int) -> dict:
    return BatchTable(harness.settings).get_request(batch_id, position) or {}


def sim_attempts(upstream, batch_id: str, position: int) -> int:
    sim, _ = upstream
    return sim.attempts_by_request.get(f"{batch_id}:{position}", 0)


def test_a_call_cut_by_the_invocations_end_runs_again_in_a_fresh_one_without_using_an_attempt(harness, upstream):
    # Given 8 s invocations that keep 1 s to settle (so a call may run at most 8 - 2 = 6 s), a 10 s
    # timeout, and chains that hand over while a call would get 1 s
    harness.configure(BATCH_UPSTREAM_TIMEOUT_SECONDS=10, BATCH_SETTLE_SECONDS=1, BATCH_HANDOVER_MIN_CALL_SECONDS=1)
    # And a batch whose chain 0 (4 wide) runs request 0 (2.5 s), then request 4, whose answer takes 5 s
    batch = harness.create([sample_request("q-0", "First [sim:latency=2.5]"),
                            *[sample_request(f"q-{n}", f"Quick {n}") for n in (1, 2, 3)],
                            sample_request("q-4", "Long answer [sim:latency=5]")])
    queue = harness.queues["glm-5.3-flash"]
    # When one invocation runs the chain: request 4 is handed over with about 5 s left, so its call
    # may run about 4 s, short of the 6 s a call may run
    harness.pump_once(queue, seconds=8)
    # Then request 4 was cut, not failed: queued again, its attempt given back, no error shown
    cut = state(harness, batch["id"], 4)
    assert cut["status"] == "queued" and int(cut["attempts"]) == 0 and "error" not in cut, cut
    assert sim_attempts(upstream, batch["id"], 4) == 1
    lines = {line["custom_id"]: line for line in harness.results(batch["id"])}
    assert lines["q-4"]["status"] == "queued" and lines["q-4"]["error"] is None
    assert all(lines[f"q-{n}"]["status"] == "completed" for n in range(4))
    # And a fresh invocation (its message was sent at once) gives it the whole 6 s: it completes,
    # on its first counted attempt
    assert harness.pump_once(queue, seconds=8) == 1
    done = state(harness, batch["id"], 4)
    assert done["status"] == "completed" and int(done["attempts"]) == 1
    assert sim_attempts(upstream, batch["id"], 4) == 2
    final = harness.batch(batch["id"])
    assert final["status"] == "completed"
    assert final["request_counts"] == {"total": 5, "completed": 5, "failed": 0}


def test_an_answer_longer_than_a_whole_invocation_allows_is_retried_as_a_timeout(harness, upstream):
    # Given 5 s invocations keeping 1 s to settle at each end: a call may run at most 3 s (the
    # timeout, 10 s, is longer), and two attempts in all
    harness.configure(BATCH_UPSTREAM_TIMEOUT_SECONDS=10, BATCH_SETTLE_SECONDS=1, BATCH_MAX_ATTEMPTS=2)
    batch = harness.create([sample_request("slow", "Very long answer [sim:latency=4]")])
    queue = harness.queues["glm-5.3-flash"]
    # When a fresh invocation runs it: its call had the most a call may run, so it used an attempt
    harness.pump_once(queue, seconds=5)
    waiting = state(harness, batch["id"], 0)
    assert waiting["status"] == "queued" and int(waiting["attempts"]) == 1
    assert waiting["error"]["code"] == "timeout"
    # Then a second fresh invocation runs it again, and it fails, timeout, naming the limit
    deadline = time.monotonic() + 30
    while state(harness, batch["id"], 0)["status"] != "failed":
        assert time.monotonic() < deadline, state(harness, batch["id"], 0)
        if not harness.pump_once(queue, seconds=5):
            time.sleep(0.05)  # the retry's backoff: its message is not visible yet
    (line,) = harness.results(batch["id"])
    assert line["error"]["code"] == "timeout" and line["error"]["status"] == 504
    assert line["error"]["message"] == ("The answer took longer than the 3 s a batch request may run; "
                                        "still timing out after 2 attempts, it is not tried again")
    assert sim_attempts(upstream, batch["id"], 0) == 2 and int(state(harness, batch["id"], 0)["attempts"]) == 2


def test_a_request_timing_out_every_time_has_eight_attempts_then_fails_saying_so(harness, upstream):
    # Given a 0.2 s timeout, the default eight attempts, and a request whose answer takes 1 s
    harness.configure(BATCH_UPSTREAM_TIMEOUT_SECONDS="0.2", BATCH_MAX_ATTEMPTS="8")
    batch = harness.create([sample_request("slow", "Long answer [sim:latency=1]"), sample_request("fine")])
    # When it runs to the end
    final = harness.run_to_final(batch["id"])
    # Then it was tried eight times, as a 429 or a 5xx is, and failed with timeout saying so
    (line,) = [line for line in harness.results(batch["id"]) if line["custom_id"] == "slow"]
    assert line["status"] == "failed"
    assert line["error"] == {"code": "timeout", "status": 504, "message": (
        "The answer took longer than the 0.2 s a batch request may run; "
        "still timing out after 8 attempts, it is not tried again")}
    assert sim_attempts(upstream, batch["id"], 0) == 8 and int(state(harness, batch["id"], 0)["attempts"]) == 8
    assert final["status"] == "completed" and final["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
