"""Retrying a finished batch on the local stack (issue 33), over HTTP: a batch whose requests the
upstream refused is retried once the upstream is fixed, and the child completes exactly those
requests, in the parent's order, the parent unchanged; the CLI's `results --merged` writes the
whole job with each request's latest outcome, and says so when the parent has been deleted since;
and the refusals: a batch not final (409), nothing that matches (400), another account's (404).

The stack calls a simulated upstream in this test process (conftest.py's `sim`): a request written
`[sim:status=CODE until=NAME]` fails until the test opens gate NAME.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

# tests/e2e is not a package: pytest imports its conftest, and its tests their helpers, as top-level modules.
from conftest import StackProcess
from engine_helpers import QWEN, attempts, item, submit, wait_final, wait_status
from freeinference_batch_client.cli import main
from freeinference_batch_local.upstream_sim import UpstreamSimulator, reply_for

pytestmark = pytest.mark.e2e


def cli(stack: StackProcess, *args: str):
    """`freeinference-batch ARGS` against the stack, with its dev key (in this process)."""
    env = {"FREEINFERENCE_BASE_URL": stack.base_url, "FREEINFERENCE_API_KEY": stack.key}
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def test_a_batch_with_failures_is_retried_and_the_child_completes_them(engine, sim: UpstreamSimulator,
                                                                      tmp_path: Path):
    api = engine.api()
    gate = f"fixed-{uuid.uuid4().hex[:8]}"
    # Given a batch on two models whose 2nd and 5th requests the upstream refuses (400, at once) and
    # whose 4th it answers 503 until it is fixed (retried, then failed after every attempt)
    items = [item("q-0", "Question 0"), item("q-1", f"Question 1 [sim:status=400 until={gate}]"),
             item("q-2", "Question 2", model=QWEN), item("q-3", f"Question 3 [sim:status=503 until={gate}]", QWEN),
             item("q-4", f"Question 4 [sim:status=400 until={gate}]", max_tokens=30)]
    parent = wait_final(api, submit(api, items)["id"], timeout=120)
    assert parent["status"] == "completed" and parent["retry_of"] is None
    assert parent["request_counts"] == {"total": 5, "completed": 2, "failed": 3}
    parent_results = api.results(parent["id"])
    assert [r["error"]["code"] for r in parent_results if r["error"]] == ["invalid_request", "service_unavailable",
                                                                         "invalid_request"]
    # When the upstream is fixed and the batch is retried (with an Idempotency-Key, sent twice)
    sim.open_gate(gate)
    answers = [api.post(f"/batches/{parent['id']}/retry", json={"statuses": ["failed", "expired"]},
                        headers={"Idempotency-Key": f"retry-{parent['id']}"}) for _ in range(2)]
    assert [answer.status_code for answer in answers] == [200, 200], [answer.text for answer in answers]
    child = answers[0].json()
    assert answers[1].json() == child and answers[1].headers.get("Idempotent-Replayed") == "true"
    assert child["retry_of"] == parent["id"] and child["status"] == "validating"
    assert child["request_counts"] == {"total": 3, "completed": 0, "failed": 0}
    # Then the child runs those three, each once, and completes them in the parent's order
    final = wait_final(api, child["id"], timeout=60)
    assert final["status"] == "completed" and final["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    results = api.results(child["id"])
    assert [(r["custom_id"], r["status"]) for r in results] == [("q-1", "completed"), ("q-3", "completed"),
                                                                ("q-4", "completed")]
    assert [attempts(sim, child["id"], position) for position in range(3)] == [1, 1, 1]
    # (the simulator's reply is a digest of the model and messages it got: the bodies as first sent)
    for result, sent in zip(results, [items[1], items[3], items[4]], strict=True):
        reply, _ = reply_for(sent["body"]["model"], sent["body"]["messages"], sent["body"].get("max_tokens"))
        assert result["response"]["body"]["choices"][0]["message"]["content"] == reply
    # And the parent is as it was, and lists beside its child
    assert api.batch(parent["id"]) == parent and api.results(parent["id"]) == parent_results
    listed = [b["id"] for b in api.get("/batches", params={"limit": 100}).json()["data"]]
    assert listed.index(child["id"]) < listed.index(parent["id"])

    # The CLI writes the whole job, each custom_id's latest outcome, in the order first submitted
    out = tmp_path / "merged.jsonl"
    ran = cli(engine, "results", child["id"], "--merged", "-o", str(out))
    assert ran.exit_code == 0, ran.stderr
    merged = [json.loads(text) for text in out.read_text().splitlines()]
    assert [(line["custom_id"], line["id"]) for line in merged] == [
        ("q-0", parent_results[0]["id"]), ("q-1", results[0]["id"]), ("q-2", parent_results[2]["id"]),
        ("q-3", results[1]["id"]), ("q-4", results[2]["id"])]
    assert all(line["error"] is None for line in merged)
    # And once the parent is deleted, the child stays whole and the merge says what it lacks
    assert api.delete(f"/batches/{parent['id']}").status_code == 200
    assert api.batch(child["id"]) == final and api.results(child["id"]) == results
    ran = cli(engine, "results", child["id"], "--merged", "-o", str(out))
    assert ran.exit_code == 0, ran.stderr
    assert f"{parent['id']}, which {child['id']} retries, no longer exists" in ran.stderr
    assert [json.loads(text)["custom_id"] for text in out.read_text().splitlines()] == ["q-1", "q-3", "q-4"]


def test_a_retry_is_refused_unless_the_batch_is_final_has_a_match_and_is_yours(engine, sim: UpstreamSimulator):
    api = engine.api()
    gate = f"hold-{uuid.uuid4().hex[:8]}"
    # Given a batch held running, and one that completed every request
    held = submit(api, [item("h-0", f"Held [sim:gate={gate}]")])
    wait_status(api, held["id"], ("in_progress",))
    done = wait_final(api, submit(api, [item("d-0"), item("d-1")])["id"])
    before = {b["id"] for b in api.get("/batches", params={"limit": 100}).json()["data"]}
    try:
        # Then the running batch is not final: 409 saying so
        answer = api.post(f"/batches/{held['id']}/retry")
        assert answer.status_code == 409, answer.text
        error = answer.json()["error"]
        assert error["code"] == "batch_not_final" and "is in_progress" in error["message"]
        # Nothing of the completed batch failed or expired: 400 naming the statuses
        answer = api.post(f"/batches/{done['id']}/retry")
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "nothing_to_retry", answer.text
        assert "failed or expired" in answer.json()["error"]["message"]
        # Another account's batch reads as not found, as the batch itself does to it
        stranger = engine.api(engine.create_key("e2e-retry-stranger", tier="internal"))
        answer = stranger.post(f"/batches/{done['id']}/retry", json={"statuses": ["completed"]})
        assert answer.status_code == 404 and answer.json() == stranger.get(f"/batches/{done['id']}").json()
        # And none of them stored anything
        assert {b["id"] for b in api.get("/batches", params={"limit": 100}).json()["data"]} == before
    finally:
        sim.open_gate(gate)
    assert wait_final(api, held["id"])["status"] == "completed"
