"""Long generations (issue 21): a call may run as long as the per-call timeout, cut to what its
worker invocation has left (call_budget.py). A call the invocation's end cuts runs again in a
fresh invocation without using an attempt; an answer longer than a whole invocation allows fails
once, `timeout`. Durations are scaled down (an invocation of a few seconds, latencies just over
what it leaves), so the arithmetic is the deployed one and no test waits minutes."""

from __future__ import annotations

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


def test_an_answer_longer_than_a_whole_invocation_allows_fails_once_with_timeout(harness, upstream):
    # Given 5 s invocations keeping 1 s to settle at each end: a call may run at most 3 s (the
    # timeout, 10 s, is longer)
    harness.configure(BATCH_UPSTREAM_TIMEOUT_SECONDS=10, BATCH_SETTLE_SECONDS=1)
    batch = harness.create([sample_request("slow", "Very long answer [sim:latency=4]")])
    # When a fresh invocation runs it
    harness.pump_once(harness.queues["glm-5.3-flash"], seconds=5)
    # Then it failed at once, timeout, saying how long a batch request may run: one call, not eight
    (line,) = harness.results(batch["id"])
    assert line["status"] == "failed"
    assert line["error"]["code"] == "timeout" and line["error"]["status"] == 504
    assert "took longer than the 3 s a batch request may run" in line["error"]["message"]
    assert sim_attempts(upstream, batch["id"], 0) == 1 and int(state(harness, batch["id"], 0)["attempts"]) == 1
    final = harness.batch(batch["id"])
    assert final["status"] == "completed" and final["request_counts"] == {"total": 1, "completed": 0, "failed": 1}


def test_an_answer_over_the_timeout_fails_once_naming_the_timeout(harness, upstream):
    # Given the harness's 2 s timeout, shorter than what its invocations (150 s) leave
    batch = harness.create([sample_request("slow", "Long answer [sim:latency=3]")])
    # When it runs
    harness.run_to_final(batch["id"])
    # Then one call, failed as timing out after the 2 s a batch request may run
    (line,) = harness.results(batch["id"])
    assert line["error"]["code"] == "timeout"
    assert "took longer than the 2 s a batch request may run" in line["error"]["message"]
    assert sim_attempts(upstream, batch["id"], 0) == 1
