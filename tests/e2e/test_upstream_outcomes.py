"""A request's upstream outcome on the local stack (the spec's "How batches run"): each answer
ends it with the spec's status and error code after exactly the expected attempts, and a batch of
mixed outcomes completes with exact counts and cost; a request waiting for its retry reads queued
with its last error; a hanging upstream ends in `timeout` after one attempt.

The stacks call a simulated upstream in this test process (conftest.py's `sim`), whose counters
the tests read directly.
"""

from __future__ import annotations

import pytest

# tests/e2e is not a package: pytest imports its conftest, and its tests their helpers, as top-level modules.
from conftest import StackProcess, wait_for
from engine_helpers import attempts, expected_cost_nano, item, submit, wait_final
from freeinference_batch.core.catalog import NANO_PER_USD
from freeinference_batch_local.upstream_sim import UpstreamSimulator

pytestmark = pytest.mark.e2e

# (directive, final status, error code, HTTP status, attempts the simulator sees)
OUTCOMES = {
    "fail-503-twice": ("[sim:fail=503*2]", "completed", None, None, 3),
    "status-400": ("[sim:status=400]", "failed", "invalid_request", 400, 1),
    "status-422": ("[sim:status=422]", "failed", "invalid_request", 422, 1),
    "status-403": ("[sim:status=403]", "failed", "forbidden", 403, 1),
    "status-404": ("[sim:status=404]", "failed", "model_not_found", 404, 1),
    "status-429": ("[sim:status=429]", "failed", "rate_limited", 429, 8),
    "status-503": ("[sim:status=503]", "failed", "service_unavailable", 503, 8),
    "status-500": ("[sim:status=500]", "failed", "upstream_error", 500, 8),
    "status-502": ("[sim:status=502]", "failed", "upstream_error", 502, 8),
}


@pytest.fixture(scope="module")
def outcomes(engine: StackProcess, sim: UpstreamSimulator) -> dict:
    """One batch with a request per case of OUTCOMES, run to its end."""
    api = engine.api()
    names = list(OUTCOMES)
    batch = submit(api, [item(name, f"Case {name} {OUTCOMES[name][0]}") for name in names])
    final = wait_final(api, batch["id"], timeout=150)
    results = {r["custom_id"]: r for r in api.results(batch["id"])}
    seen = {name: attempts(sim, batch["id"], position) for position, name in enumerate(names)}
    return {"batch": final, "results": results, "attempts": seen}


@pytest.mark.parametrize("case", list(OUTCOMES))
def test_upstream_outcome_sets_result_status_error_code_and_attempts(outcomes, case):
    # Given a request whose upstream answers as OUTCOMES[case] says (default BATCH_MAX_ATTEMPTS=8)
    _, status, code, http_status, expected_attempts = OUTCOMES[case]
    result = outcomes["results"][case]
    # Then it ends with the spec's status and error code, after exactly the expected attempts
    assert result["status"] == status, result
    if status == "completed":
        assert result["error"] is None
        assert result["response"]["status_code"] == 200
        assert result["response"]["body"]["choices"][0]["message"]["content"].startswith("Simulated reply")
    else:
        assert result["response"] is None
        assert result["error"]["code"] == code, result
        assert result["error"]["status"] == http_status, result
        assert result["error"]["message"]
    assert outcomes["attempts"][case] == expected_attempts


def test_batch_of_mixed_outcomes_completes_with_exact_counts(outcomes):
    batch = outcomes["batch"]
    assert batch["status"] == "completed"
    succeeded = sum(1 for spec in OUTCOMES.values() if spec[1] == "completed")
    assert batch["request_counts"] == {
        "total": len(OUTCOMES),
        "completed": succeeded,
        "failed": len(OUTCOMES) - succeeded,
    }
    # Only the completed request costs anything.
    assert batch["cost_usd"] == round(expected_cost_nano(list(outcomes["results"].values())) / NANO_PER_USD, 9)


def test_waiting_for_a_retry_shows_queued_with_the_last_error(own_stack, sim):
    # Given a stack whose first retry waits 1-2 s, and requests that fail once with a transient error
    stack = own_stack(BATCH_RETRY_BASE_SECONDS="2", BATCH_RETRY_MAX_SECONDS="2")
    api = stack.api()
    batch = submit(api, [item("q-503", "Once [sim:fail=503*1]"), item("q-429", "Once [sim:fail=429*1]")])
    expected = {"q-503": ("service_unavailable", 503), "q-429": ("rate_limited", 429)}
    seen: dict[str, dict] = {}

    def both_seen_waiting() -> bool:
        for result in api.results(batch["id"]):
            if result["status"] == "queued" and result["error"]:
                seen.setdefault(result["custom_id"], result)
        return set(seen) == set(expected)

    # When they wait for their second attempt, Then their results read queued with the last error
    wait_for(both_seen_waiting, timeout=20, interval=0.05, message="both requests queued with their last error")
    for custom_id, (code, status) in expected.items():
        assert seen[custom_id]["response"] is None
        assert seen[custom_id]["error"]["code"] == code and seen[custom_id]["error"]["status"] == status
    # And they then complete on their second attempt
    final = wait_final(api, batch["id"], timeout=30)
    assert final["status"] == "completed"
    assert final["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
    results = api.results(batch["id"])
    assert all(r["status"] == "completed" and r["error"] is None for r in results)
    assert [attempts(sim, batch["id"], p) for p in (0, 1)] == [2, 2]


def test_hanging_upstream_ends_in_timeout_after_every_attempt(own_stack, sim):
    # Given a 1 s upstream timeout and up to 2 attempts
    stack = own_stack(BATCH_UPSTREAM_TIMEOUT_SECONDS="1", BATCH_MAX_ATTEMPTS="2")
    api = stack.api()
    # When a request never gets an answer
    batch = submit(api, [item("hang", "Wait forever [sim:hang]"), item("fine", "A normal question")])
    final = wait_final(api, batch["id"], timeout=45)
    # Then it fails with timeout (504) after each of its attempts had the most a batch request may
    # run, retried as a 429 or a 5xx is; the other request is unaffected
    assert final["status"] == "completed"
    assert final["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
    hang, fine = api.results(batch["id"])
    assert hang["status"] == "failed" and hang["error"]["code"] == "timeout" and hang["error"]["status"] == 504
    assert hang["error"]["message"] == ("The answer took longer than the 1 s a batch request may run; "
                                        "still timing out after 2 attempts, it is not tried again")
    assert fine["status"] == "completed"
    assert attempts(sim, batch["id"], 0) == 2
