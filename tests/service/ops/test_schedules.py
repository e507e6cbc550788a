"""The schedule handlers (functions/schedules/app.py) on moto, each called with its sample event
from events/: expire closes completion windows, sweep recovers what crashes leave behind,
purge removes deleted batches and finished ones past retention."""

from __future__ import annotations

import base64
import os
import threading

import pytest
from freeinference_batch import worker
from freeinference_batch.core import aws
from freeinference_batch_local.handlers import LambdaContext
from freeinference_batch_local.triggers.sqs import sqs_record

from tests.conftest import sample_request
from tests.service.helpers import lose_messages, position_of, run_schedule, take_messages

pytestmark = pytest.mark.usefixtures("one_worker_thread")

FINAL = ("completed", "failed", "expired", "cancelled")


def visible_messages(harness, model: str = "glm-5.3-flash") -> int:
    attributes = aws.sqs().get_queue_attributes(
        QueueUrl=harness.queues[model], AttributeNames=["ApproximateNumberOfMessages"]
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"])


def invoke_worker(harness, messages: list[dict], model: str = "glm-5.3-flash"):
    arn = aws.sqs().get_queue_attributes(QueueUrl=harness.queues[model], AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    records = [sqs_record(m, arn) for m in messages]
    return harness.worker_handler({"Records": records}, LambdaContext("worker", 512, 150))


def batch_items(harness, batch_id: str) -> list[dict]:
    answer = aws.dynamodb().query(
        TableName=harness.settings.batch_table_name,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": f"BATCH#{batch_id}"}},
        ConsistentRead=True,
    )
    return answer["Items"]


def batch_objects(harness, batch_id: str) -> list[str]:
    answer = aws.s3().list_objects_v2(Bucket=harness.settings.payload_bucket_name, Prefix=f"{batch_id}/")
    return [o["Key"] for o in answer.get("Contents", [])]


def results_by_id(harness, batch_id: str) -> dict[str, dict]:
    return {r["custom_id"]: r for r in harness.results(batch_id)}


def incompressible(size: int) -> str:
    return base64.b64encode(os.urandom(size)).decode()


# ---- expire ----------------------------------------------------------------------------------


def test_expire_handler_expires_a_batch_past_its_window_and_nothing_else(harness):
    # Given a batch whose window has closed before any request started, and a newer one
    harness.configure(BATCH_MAX_UNFINISHED=2)
    late = harness.create([sample_request(f"q-{i}") for i in range(3)])
    harness.advance_clock(86400 + 1)
    fresh = harness.create([sample_request("f-0")])
    # When the expire schedule runs
    assert run_schedule("expire") == {"expired": 1, "past_window": 0}
    # Then the late batch is expired, every request with batch_expired, all counted failed
    batch = harness.batch(late["id"])
    assert batch["status"] == "expired"
    assert isinstance(batch["expired_at"], int) and batch["expired_at"] >= batch["expires_at"]
    assert batch["request_counts"] == {"total": 3, "completed": 0, "failed": 3}
    for line in harness.results(late["id"]):
        assert line["status"] == "expired" and line["response"] is None
        assert line["error"]["code"] == "batch_expired"
    # And the newer batch is untouched
    assert harness.batch(fresh["id"]) == fresh
    # The expired batch gave back its unfinished slot: one more fits beside the fresh one, then the limit
    assert harness.call("POST", "/v1/batches", {"requests": [sample_request("n-0")]})[0] == 200
    assert harness.call("POST", "/v1/batches", {"requests": [sample_request("n-1")]})[0] == 429
    # Running it again changes nothing; the expired batch's leftover messages do nothing either
    assert run_schedule("expire") == {"expired": 0, "past_window": 0}
    harness.run_until(lambda: visible_messages(harness) == 0)
    assert harness.batch(late["id"]) == batch


def test_expire_waits_for_a_running_request_which_keeps_its_result(harness):
    # Given a batch whose first request is running (slow upstream) while the others have not started
    harness.configure(BATCH_UPSTREAM_TIMEOUT_SECONDS=15)
    batch = harness.create(
        [sample_request("q-0", "Slow [sim:latency=3]"), sample_request("q-1"), sample_request("q-2")]
    )
    messages = take_messages(harness)
    first = [m for m in messages if position_of(m) == 0]
    assert len(first) == 1, messages
    runner = threading.Thread(target=invoke_worker, args=(harness, first))
    runner.start()
    try:
        harness.run_until(lambda: results_by_id(harness, batch["id"])["q-0"]["status"] == "running", timeout=10)
        # When the window closes (long ago: past the alarm's grace too) and expire runs
        harness.advance_clock(86400 + 3600 + 1)
        assert run_schedule("expire") == {"expired": 0, "past_window": 1}
        # Then the batch waits for the running request
        assert harness.batch(batch["id"])["status"] == "in_progress"
    finally:
        runner.join(30)
    assert not runner.is_alive()
    run_schedule("expire")
    # And ends expired: the running request kept its result, the others expired
    final = harness.batch(batch["id"])
    assert final["status"] == "expired" and final["expired_at"] is not None
    assert final["request_counts"] == {"total": 3, "completed": 1, "failed": 2}
    lines = results_by_id(harness, batch["id"])
    assert lines["q-0"]["status"] == "completed" and lines["q-0"]["response"]["status_code"] == 200
    assert [lines[c]["status"] for c in ("q-1", "q-2")] == ["expired", "expired"]
    assert {lines[c]["error"]["code"] for c in ("q-1", "q-2")} == {"batch_expired"}


# ---- sweep -----------------------------------------------------------------------------------


def test_sweep_handler_resends_lost_messages_once_their_dispatch_lease_runs_out(harness):
    # Given a batch whose first messages were lost (glm-5.3-flash runs 4 at a time)
    batch = harness.create([sample_request(f"q-{i}") for i in range(6)])
    assert lose_messages(harness) == 4
    # While the dispatch leases last, the sweep leaves the chains alone
    assert run_schedule("sweep") == {"finalized": 0, "resent": 0, "recovered": 0, "interrupted": 0, "counted": 0,
                                     "checks_resent": 0, "files_resent": 0}
    assert visible_messages(harness) == 0
    # When they have run out
    harness.advance_clock(harness.settings.batch_dispatch_lease_seconds + 1)
    assert run_schedule("sweep") == {"finalized": 0, "resent": 4, "recovered": 0, "interrupted": 0, "counted": 0,
                                     "checks_resent": 0, "files_resent": 0}
    # Then each chain has its message again, exactly once (a second sweep sends nothing more)
    assert visible_messages(harness) == 4
    assert run_schedule("sweep")["resent"] == 0
    # And the batch runs to the end with exact counts
    final = harness.run_to_final(batch["id"])
    assert final["status"] == "completed"
    assert final["request_counts"] == {"total": 6, "completed": 6, "failed": 0}
    assert [r["custom_id"] for r in harness.results(batch["id"]) if r["status"] == "completed"] == [
        f"q-{i}" for i in range(6)
    ]


def test_sweep_handler_takes_back_a_request_whose_worker_died(harness):
    # Given a worker that dies right after claiming the request (its message is never deleted)
    harness.configure(BATCH_LEASE_SECONDS=5)
    batch = harness.create([sample_request("q-0")])
    messages = take_messages(harness)
    harness.configure(BATCH_FAULT_CRASH_RATE=1)
    with pytest.raises(worker.SimulatedCrash):
        invoke_worker(harness, messages)
    harness.configure(BATCH_FAULT_CRASH_RATE=0)
    assert results_by_id(harness, batch["id"])["q-0"]["status"] == "running"
    # While its lease lasts, the sweep leaves it
    assert run_schedule("sweep") == {"finalized": 0, "resent": 0, "recovered": 0, "interrupted": 0, "counted": 0,
                                     "checks_resent": 0, "files_resent": 0}
    # When the leases have run out, the sweep takes it back and sends it again
    harness.advance_clock(harness.settings.batch_dispatch_lease_seconds + 6)
    assert run_schedule("sweep") == {"finalized": 0, "resent": 1, "recovered": 1, "interrupted": 0, "counted": 0,
                                     "checks_resent": 0, "files_resent": 0}
    assert results_by_id(harness, batch["id"])["q-0"]["status"] == "queued"
    # Then it runs once more and the batch completes with exact counts
    final = harness.run_to_final(batch["id"])
    assert final["status"] == "completed"
    assert final["request_counts"] == {"total": 1, "completed": 1, "failed": 0}
    assert results_by_id(harness, batch["id"])["q-0"]["response"]["status_code"] == 200


def test_sweep_handler_finalizes_a_batch_whose_last_request_settled_without_finalizing(harness, monkeypatch):
    # Given a worker that dies right after settling the batch's only request
    def crash_after_settle(self, step: str) -> None:
        if step == "after settle":
            raise worker.SimulatedCrash(step)

    monkeypatch.setattr(worker.Worker, "_maybe_crash", crash_after_settle)
    batch = harness.create([sample_request("q-0")])
    with pytest.raises(worker.SimulatedCrash):
        invoke_worker(harness, take_messages(harness))
    stuck = harness.batch(batch["id"])
    assert stuck["status"] == "in_progress"
    assert stuck["request_counts"] == {"total": 1, "completed": 1, "failed": 0}
    # When the sweep runs, then the batch is completed
    assert run_schedule("sweep") == {"finalized": 1, "resent": 0, "recovered": 0, "interrupted": 0, "counted": 0,
                                     "checks_resent": 0, "files_resent": 0}
    final = harness.batch(batch["id"])
    assert final["status"] == "completed" and final["completed_at"] is not None
    assert run_schedule("sweep") == {"finalized": 0, "resent": 0, "recovered": 0, "interrupted": 0, "counted": 0,
                                     "checks_resent": 0, "files_resent": 0}


# ---- purge -----------------------------------------------------------------------------------


def test_purge_handler_removes_every_item_and_object_of_a_deleted_batch(harness):
    # Given a batch with a request too big for an item (its input goes to S3), and another batch
    doomed = harness.create([sample_request("q-0"), sample_request("big", incompressible(450_000))])
    kept = harness.create([sample_request("k-0")])
    assert batch_objects(harness, doomed["id"]), "the big request should be stored in S3"
    # When it is deleted
    status, answer = harness.call("DELETE", f"/v1/batches/{doomed['id']}")
    assert status == 200 and answer == {"id": doomed["id"], "object": "batch.deleted", "deleted": True}
    # Then it reads as gone at once, while its items wait for the purge
    assert harness.call("GET", f"/v1/batches/{doomed['id']}")[0] == 404
    assert batch_items(harness, doomed["id"])
    # And after the purge schedule, nothing of it is left; the other batch is untouched
    assert run_schedule("purge") == {"purged": 1, "expired_files": 0, "expired_uploads": 0}
    assert batch_items(harness, doomed["id"]) == []
    assert batch_objects(harness, doomed["id"]) == []
    assert harness.batch(kept["id"]) == kept
    assert batch_items(harness, kept["id"])
    assert run_schedule("purge") == {"purged": 0, "expired_files": 0, "expired_uploads": 0}


def test_purge_handler_removes_a_finished_batch_after_retention(harness):
    # Given a finished batch
    batch = harness.create([sample_request("q-0"), sample_request("q-1")])
    assert harness.run_to_final(batch["id"])["status"] == "completed"
    # Within retention the purge keeps it
    assert run_schedule("purge") == {"purged": 0, "expired_files": 0, "expired_uploads": 0}
    assert harness.call("GET", f"/v1/batches/{batch['id']}")[0] == 200
    # Past retention it reads as gone even before the purge reaches it
    harness.advance_clock(harness.settings.batch_retention_seconds + 1)
    assert harness.call("GET", f"/v1/batches/{batch['id']}")[0] == 404
    assert harness.call("GET", f"/v1/batches/{batch['id']}/results")[0] == 404
    status, page = harness.call("GET", "/v1/batches")
    assert status == 200 and batch["id"] not in {b["id"] for b in page["data"]}
    # And the purge removes all of it
    assert run_schedule("purge") == {"purged": 1, "expired_files": 0, "expired_uploads": 0}
    assert batch_items(harness, batch["id"]) == []
    assert batch_objects(harness, batch["id"]) == []
