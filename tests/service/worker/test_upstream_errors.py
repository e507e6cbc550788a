"""What users read when the upstream fails on our side (issue 21): a 401 (the upstream refused the
service's own credential; users' keys never go upstream) is a service fault, retried like a 5xx,
then `upstream_error` with our message and an alarm's metric; the upstream's text of a 401 or a
5xx goes to our logs only."""

from __future__ import annotations

import pytest
from freeinference_batch.worker import runner
from freeinference_batch.worker.upstream import CREDENTIAL_REJECTED_METRIC

from tests.conftest import sample_request


@pytest.fixture
def metrics(monkeypatch) -> list[str]:
    emitted: list[str] = []
    real = runner.metric

    def record(name: str, *args, **kwargs) -> None:
        emitted.append(name)
        real(name, *args, **kwargs)

    monkeypatch.setattr(runner, "metric", record)
    return emitted


def sim_attempts(upstream_fixture, batch_id: str, position: int) -> int:
    sim, _ = upstream_fixture
    return sim.attempts_by_request.get(f"{batch_id}:{position}", 0)


def test_an_upstream_401_is_a_service_fault_retried_then_upstream_error_with_our_message(
        harness, upstream, metrics, caplog):
    # Given at most 3 attempts, and an upstream that refuses the service's credential
    harness.configure(BATCH_MAX_ATTEMPTS=3)
    batch = harness.create([sample_request("q-0", "[sim:status=401] hello")])
    # When the batch runs
    final = harness.run_to_final(batch["id"])
    # Then the request was retried like a 5xx, every attempt, and failed upstream_error (502), not forbidden
    assert sim_attempts(upstream, batch["id"], 0) == 3
    (line,) = harness.results(batch["id"])
    assert line["status"] == "failed" and line["error"]["code"] == "upstream_error"
    assert line["error"]["status"] == 502
    # With our message: nothing of the upstream's text reaches the user
    assert "Simulated" not in line["error"]["message"] and "401" not in line["error"]["message"]
    assert "FreeInference" in line["error"]["message"]
    assert final["request_counts"] == {"total": 1, "completed": 0, "failed": 1}
    # And every refusal emitted the alarm's metric, and the upstream's text is in our logs
    assert metrics.count(CREDENTIAL_REJECTED_METRIC) == 3
    logged = " ".join(f"{r.getMessage()} {getattr(r, 'upstream_message', '')}" for r in caplog.records)
    assert "the upstream refused the service credential" in logged and "Simulated status 401" in logged


@pytest.mark.parametrize(("status", "code"), [(500, "upstream_error"), (502, "upstream_error"),
                                              (503, "service_unavailable"), (504, "timeout")])
def test_the_upstreams_text_of_a_5xx_stays_in_our_logs(harness, upstream, caplog, status, code):
    harness.configure(BATCH_MAX_ATTEMPTS=1)
    batch = harness.create([sample_request("q-0", f"[sim:status={status}] hello")])
    harness.run_to_final(batch["id"])
    (line,) = harness.results(batch["id"])
    assert line["error"]["code"] == code and line["error"]["status"] == status
    assert "Simulated" not in line["error"]["message"] and str(status) in line["error"]["message"]
    assert any(getattr(r, "upstream_message", None) == f"Simulated status {status}" for r in caplog.records)


def test_a_4xx_about_the_request_keeps_the_upstreams_text(harness, upstream):
    # The user's own request at fault: what the model's server said about it is the user's to read
    batch = harness.create([sample_request("q-0", "[sim:status=400] hello")])
    harness.run_to_final(batch["id"])
    (line,) = harness.results(batch["id"])
    assert line["error"]["code"] == "invalid_request" and line["error"]["message"] == "Simulated status 400"
