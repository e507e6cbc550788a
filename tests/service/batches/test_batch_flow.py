"""The straight path on moto: create, run, read, list, cancel, delete."""

from __future__ import annotations

from tests.conftest import sample_request


def test_batch_runs_to_completion_and_results_come_back_in_order(harness):
    batch = harness.create([sample_request(f"q-{i}", f"Question {i}") for i in range(7)],
                           metadata={"project": "eval-42"})
    assert batch["status"] == "validating"
    assert batch["request_counts"] == {"total": 7, "completed": 0, "failed": 0}
    assert batch["expires_at"] == batch["created_at"] + 86400
    final = harness.run_to_final(batch["id"])
    assert final["status"] == "completed"
    assert final["request_counts"] == {"total": 7, "completed": 7, "failed": 0}
    assert final["in_progress_at"] and final["completed_at"]
    assert final["cost_usd"] > 0
    results = harness.results(batch["id"])
    assert [r["custom_id"] for r in results] == [f"q-{i}" for i in range(7)]
    assert all(r["status"] == "completed" and r["response"]["status_code"] == 200 for r in results)
