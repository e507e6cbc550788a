"""Batches created from a file (OpenAI's form) on moto: the create's refusals, the background
check that stores and starts a good file or fails a bad one naming its lines, and the guards
that keep an unchecked batch from completing, and end it cancelled or expired."""

from __future__ import annotations

import json
import time

import pytest
from freeinference_batch import accounts
from freeinference_batch.batches import file_batches, job_steps
from freeinference_batch.core import aws
from freeinference_batch.core.settings import SQS_MAX_VISIBILITY_SECONDS
from freeinference_batch.store import accounts_table, files
from freeinference_batch.store.batch_table import BatchTable
from freeinference_batch.store.dynamo import from_item
from freeinference_batch_local.handlers import LambdaContext, load_handler
from freeinference_batch_local.triggers.sqs import failed_message_ids, sqs_record

from tests.conftest import sample_request
from tests.service.batches.file_batch_helpers import (
    create_from,
    input_file,
    job_messages,
    line_of,
    run_file_batch_to_final,
    run_jobs,
)
from tests.service.batches.retry_helpers import stored_requests
from tests.service.helpers import assert_batch_object, run_schedule, take_messages


def _unfinished(harness) -> int:
    answer = aws.dynamodb().get_item(TableName=harness.settings.accounts_table_name,
                                     Key=accounts_table.account_item_key("acct-1"), ConsistentRead=True)
    return int(from_item(answer["Item"]).get("unfinished", 0))


def _good_lines(count: int = 3) -> list[bytes]:
    return [line_of(sample_request(f"q-{i}", f"Say {i}.")) for i in range(count)]


# ---- create ------------------------------------------------------------------------------------


def test_a_file_batch_is_created_validating_with_nothing_runnable(harness):
    record = input_file(harness, _good_lines())
    status, batch = create_from(harness, record.id, metadata={"run": "7"})
    assert status == 200, batch
    assert_batch_object(batch)
    assert batch["status"] == "validating" and batch["input_file_id"] == record.id and batch["errors"] is None
    assert batch["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    assert batch["metadata"] == {"run": "7"} and batch["completion_window"] == "24h"
    assert batch["expires_at"] == batch["created_at"] + 86400  # the window counts from create
    assert _unfinished(harness) == 1  # counted at once
    # Its check is queued, and nothing of it can run yet
    assert [json.loads(m["Body"]) for m in job_messages(harness)] == [{"kind": "validate", "batch_id": batch["id"]}]
    assert take_messages(harness) == []
    assert BatchTable(harness.settings).get_lanes(batch["id"]) == []


@pytest.mark.parametrize(("fields", "param", "words"), [
    ({"endpoint": "/v1/embeddings"}, "endpoint", "endpoint must be '/v1/chat/completions'"),
    ({"completion_window": "48h"}, "completion_window", "completion_window must be '24h'"),
    ({"endpoint": None}, "endpoint", "endpoint must be a string"),
    ({"metadata": {"k": 1}}, "metadata", "metadata must be an object"),
    ({"requests": [sample_request("q-0")]}, "input_file_id", "both 'requests' and 'input_file_id'"),
])
def test_a_bad_file_form_is_refused_naming_the_field(harness, fields, param, words):
    record = input_file(harness, _good_lines())
    status, body = create_from(harness, record.id, **fields)
    assert status == 400, body
    assert body["error"]["param"] == param and words in body["error"]["message"], body
    assert job_messages(harness) == [] and _unfinished(harness) == 0


def test_a_missing_field_of_the_file_form_is_named(harness):
    record = input_file(harness, _good_lines())
    status, body = harness.call("POST", "/v1/batches", {"input_file_id": record.id, "endpoint": "/v1/chat/completions"})
    assert status == 400 and body["error"]["param"] == "completion_window", body


def test_a_body_of_neither_form_names_both_fields(harness):
    status, body = harness.call("POST", "/v1/batches", {"metadata": {"a": "b"}})
    assert status == 400, body
    assert "'requests'" in body["error"]["message"] and "'input_file_id'" in body["error"]["message"]


def test_an_unknown_foreign_deleted_or_output_file_is_refused_at_once(harness):
    foreign = input_file(harness, _good_lines(), account="acct-2")
    deleted = input_file(harness, _good_lines())
    assert files.delete_input_file(harness.settings, deleted, time.time())
    output = files.register_batch_file(harness.settings, "acct-1", "batch_" + "0" * 32, "output", "k", 1, 0, 10**10)
    for file_id in ("file-00000000000000000000000000000000", foreign.id, deleted.id, output.id, "nonsense"):
        status, body = create_from(harness, file_id)
        assert status == 400 and body["error"]["param"] == "input_file_id", (file_id, body)
    assert job_messages(harness) == [] and _unfinished(harness) == 0


def test_a_file_create_needs_batch_access_and_counts_toward_the_limit(harness):
    record = input_file(harness, _good_lines())
    no_access = accounts.create_key(harness.settings, "acct-9", tier="standard", concurrency=1)
    status, body = harness.call("POST", "/v1/batches", {"input_file_id": record.id, "endpoint": "/v1/chat/completions",
                                                        "completion_window": "24h"}, key=no_access)
    assert status == 403, body
    harness.configure(BATCH_MAX_UNFINISHED=1)
    assert create_from(harness, record.id)[0] == 200
    status, body = create_from(harness, record.id)
    assert status == 429 and body["error"]["code"] == "too_many_unfinished_batches", body


def test_an_idempotency_key_replays_a_file_create(harness):
    record = input_file(harness, _good_lines())
    body = {"input_file_id": record.id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    first = harness.call("POST", "/v1/batches", body, headers={"idempotency-key": "k-1"})
    again = harness.call("POST", "/v1/batches", body, headers={"idempotency-key": "k-1"})
    assert first[0] == again[0] == 200 and first[1] == again[1]
    assert len(job_messages(harness)) == 1 and _unfinished(harness) == 1


# ---- the check -------------------------------------------------------------------------------


def test_a_good_file_is_stored_as_create_stores_it_and_runs(harness):
    lines = [*_good_lines(4), line_of(sample_request("q-4", model="qwen3.6-35b"))]
    record = input_file(harness, [lines[0], b"", *lines[1:]], parts=3)  # a blank line; lines across parts
    _, batch = create_from(harness, record.id)
    assert run_jobs(harness) == 1
    checked = harness.batch(batch["id"])
    assert checked["status"] == "validating" and checked["request_counts"]["total"] == 5
    # The same items an inline create of the same requests stores
    _, inline = harness.call("POST", "/v1/batches", {"requests": [json.loads(line) for line in lines]})
    assert stored_requests(harness, batch["id"]) == stored_requests(harness, inline["id"])
    final = run_file_batch_to_final(harness, batch["id"])
    assert final["status"] == "completed" and final["request_counts"] == {"total": 5, "completed": 5, "failed": 0}
    assert final["input_file_id"] == record.id and final["errors"] is None
    assert [r["custom_id"] for r in harness.results(batch["id"])] == [f"q-{i}" for i in range(5)]
    assert inline["input_file_id"] is None and inline["errors"] is None  # inline batches keep them null


def test_bad_lines_fail_the_batch_naming_each_line_and_run_nothing(harness):
    lines = [line_of(sample_request("q-1")), line_of(sample_request("q-2", model="no-such-model")),
             b"{not json", line_of(sample_request("q-1")), b'{"custom_id": "q-5", "method": "POST"}',
             b"[1, 2]", line_of(sample_request("q-7", stream=True))]
    record = input_file(harness, lines)
    _, batch = create_from(harness, record.id)
    assert _unfinished(harness) == 1
    run_jobs(harness)
    failed = harness.batch(batch["id"])
    assert failed["status"] == "failed" and failed["failed_at"] is not None
    assert failed["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    assert failed["errors"]["object"] == "list"
    by_line = {e["line"]: e for e in failed["errors"]["data"]}
    assert sorted(by_line) == [2, 3, 4, 5, 6, 7]
    assert by_line[2]["message"] == "custom_id 'q-2': Model 'no-such-model' not found"
    assert by_line[2]["code"] == "model_not_found"
    assert by_line[3]["message"].startswith("The line is not valid JSON")
    assert by_line[4]["message"].startswith("custom_id 'q-1' repeats line 1") and by_line[4]["param"] == "custom_id"
    assert by_line[5]["message"] == "custom_id 'q-5': body is required"
    assert by_line[6]["message"].startswith("The line: each request must be an object")
    assert by_line[7]["message"].startswith("custom_id 'q-7': body.stream must not be true")
    # Nothing stored or run, and the account's unfinished batch given back
    assert BatchTable(harness.settings).get_lanes(batch["id"]) == [] and take_messages(harness) == []
    assert _unfinished(harness) == 0
    assert harness.results(batch["id"]) == []


def test_an_empty_file_and_too_many_lines_fail_it(harness):
    harness.configure(BATCH_MAX_REQUESTS=2)
    _, empty = create_from(harness, input_file(harness, [b"", b"  "]).id)
    _, many = create_from(harness, input_file(harness, _good_lines(3)).id)
    run_jobs(harness)
    assert harness.batch(empty["id"])["errors"]["data"][0]["code"] == "empty_file"
    error = harness.batch(many["id"])["errors"]["data"][0]
    assert error["code"] == "too_many_requests" and error["line"] == 3


def test_a_check_past_its_share_of_the_step_fails_it_and_leaves_the_rest_for_storing(harness, monkeypatch):
    # Given a file of 1,000 lines (the check looks at its clock every 1,000), and a step clock that
    # reads 0 as the step starts and 50 s at that look, in a step of 120 s
    record = input_file(harness, _good_lines(1000))
    _, batch = create_from(harness, record.id)

    class StepClock:
        reads = 0

        def monotonic(self) -> float:
            self.reads += 1
            return 0.0 if self.reads == 1 else 50.0

    monkeypatch.setattr(file_batches, "time", StepClock())
    # When its check runs: 50 s is past the check's third of the step (40 s), though inside the step
    assert file_batches.validate(harness.settings, batch["id"], 120.0) is True
    # Then the batch fails naming the line it reached, and nothing of it is stored
    failed = harness.batch(batch["id"])
    assert failed["status"] == "failed", failed
    assert failed["errors"]["data"] == [{
        "code": "file_check_timeout", "line": 1000, "param": None,
        "message": "The file could not be checked within the time one check has; split it into smaller files"}]
    assert BatchTable(harness.settings).get_lanes(batch["id"]) == [] and _unfinished(harness) == 0


def test_errors_name_at_most_the_stated_number_of_lines(harness, monkeypatch):
    monkeypatch.setattr(file_batches, "ERRORS_MAX", 3)
    record = input_file(harness, [line_of(sample_request(f"q-{i}", model="gone")) for i in range(6)])
    _, batch = create_from(harness, record.id)
    run_jobs(harness)
    assert [e["line"] for e in harness.batch(batch["id"])["errors"]["data"]] == [1, 2, 3]


def test_a_cancel_while_validating_ends_it_cancelled_and_the_check_stops(harness):
    _, batch = create_from(harness, input_file(harness, _good_lines()).id)
    status, cancelled = harness.call("POST", f"/v1/batches/{batch['id']}/cancel")
    assert status == 200 and cancelled["status"] == "cancelled" and _unfinished(harness) == 0
    run_jobs(harness)
    assert harness.batch(batch["id"]) == cancelled
    assert take_messages(harness) == []


def test_a_cancel_during_the_check_stops_it_before_it_starts(harness, monkeypatch):
    _, batch = create_from(harness, input_file(harness, _good_lines()).id)
    reserve = BatchTable.reserve_result_ids

    def cancel_first(table, count):  # the cancel lands between the items and META
        harness.call("POST", f"/v1/batches/{batch['id']}/cancel")
        return reserve(table, count)

    monkeypatch.setattr(BatchTable, "reserve_result_ids", cancel_first)
    run_jobs(harness)
    final = harness.batch(batch["id"])
    assert final["status"] == "cancelled" and final["request_counts"]["total"] == 0
    assert take_messages(harness) == [] and _unfinished(harness) == 0


def test_a_check_run_twice_stores_and_starts_it_once(harness):
    _, batch = create_from(harness, input_file(harness, _good_lines(3)).id)
    assert file_batches.validate(harness.settings, batch["id"], float("inf"))
    first = BatchTable(harness.settings).get_meta(batch["id"])
    started = take_messages(harness)
    assert file_batches.validate(harness.settings, batch["id"], float("inf"))
    assert BatchTable(harness.settings).get_meta(batch["id"]) == first and take_messages(harness) == []
    assert len(started) == 3


def test_a_check_that_dies_midway_runs_again_and_stores_it_whole(harness, monkeypatch):
    # Given a check that dies after writing the lanes, before META is whole
    lines = [line_of(sample_request(f"q-{i}", "x" * 2000)) for i in range(40)]
    _, batch = create_from(harness, input_file(harness, lines).id)
    monkeypatch.setattr(file_batches, "BLOCK_BYTES", 20_000)  # several blocks
    reserve = BatchTable.reserve_result_ids
    monkeypatch.setattr(BatchTable, "reserve_result_ids", lambda table, count: (_ for _ in ()).throw(OSError("died")))
    with pytest.raises(OSError):
        file_batches.validate(harness.settings, batch["id"], float("inf"))
    assert harness.batch(batch["id"])["request_counts"]["total"] == 0
    # When it runs again
    monkeypatch.setattr(BatchTable, "reserve_result_ids", reserve)
    assert file_batches.validate(harness.settings, batch["id"], float("inf"))
    # Then the batch holds every request once and runs to the end
    assert [r[0] for r in stored_requests(harness, batch["id"])] == [f"q-{i}" for i in range(40)]
    final = run_file_batch_to_final(harness, batch["id"], timeout=60)
    assert final["request_counts"] == {"total": 40, "completed": 40, "failed": 0}


def test_an_input_file_deleted_before_its_check_fails_the_batch(harness):
    record = input_file(harness, _good_lines())
    _, batch = create_from(harness, record.id)
    files.delete_input_file(harness.settings, record, time.time())
    run_jobs(harness)
    failed = harness.batch(batch["id"])
    assert failed["status"] == "failed" and failed["errors"]["data"][0]["code"] == "file_not_found"


# ---- lifecycle guards ----------------------------------------------------------------------------


def test_the_schedules_never_complete_an_unchecked_batch(harness):
    _, batch = create_from(harness, input_file(harness, _good_lines()).id)
    run_schedule("sweep")
    run_schedule("expire")
    assert harness.batch(batch["id"])["status"] == "validating"
    run_jobs(harness)
    assert run_file_batch_to_final(harness, batch["id"])["status"] == "completed"


def test_an_unchecked_batch_whose_window_closes_expires(harness):
    _, batch = create_from(harness, input_file(harness, _good_lines()).id)
    harness.advance_clock(86400 + 1)
    run_schedule("expire")
    expired = harness.batch(batch["id"])
    assert expired["status"] == "expired" and _unfinished(harness) == 0
    run_jobs(harness)  # the check, late, does nothing
    assert harness.batch(batch["id"]) == expired and take_messages(harness) == []


def test_a_retry_of_a_file_batch_is_a_file_batch(harness):
    lines = [line_of(sample_request("q-0")), line_of(sample_request("q-1"))]
    _, batch = create_from(harness, (record := input_file(harness, lines)).id)
    run_jobs(harness)
    run_file_batch_to_final(harness, batch["id"])
    status, child = harness.call("POST", f"/v1/batches/{batch['id']}/retry", {"statuses": ["completed"]})
    assert status == 200, child
    assert child["input_file_id"] == record.id and child["request_counts"]["total"] == 2
    assert run_file_batch_to_final(harness, child["id"])["status"] == "completed"


def test_a_check_whose_job_was_lost_is_sent_again_by_the_sweep_once_per_quiet_period(harness):
    from freeinference_batch.ops import schedules

    _, batch = create_from(harness, input_file(harness, _good_lines()).id)
    assert len(job_messages(harness)) == 1  # taken and never answered: lost
    assert run_schedule("sweep")["checks_resent"] == 0  # not quiet yet
    harness.advance_clock(schedules.CHECK_QUIET_SECONDS + 1)
    assert run_schedule("sweep")["checks_resent"] == 1
    assert run_schedule("sweep")["checks_resent"] == 0  # once per quiet period
    assert [json.loads(m["Body"])["batch_id"] for m in job_messages(harness)] == [batch["id"]]
    assert harness.batch(batch["id"])["status"] == "validating"


def test_a_step_that_fails_runs_again_after_a_backoff_not_the_queues_visibility_timeout(harness, monkeypatch):
    # Given a file batch whose check fails on its first run (an AWS error outlasting botocore's retries)
    harness.configure(BATCH_JOBS_RETRY_BASE_SECONDS=3)
    _, batch = create_from(harness, input_file(harness, _good_lines()).id)
    validate = job_steps.STEPS["validate"]
    monkeypatch.setitem(job_steps.STEPS, "validate", lambda *_: (_ for _ in ()).throw(OSError("throttled")))
    handler = load_handler("batch_jobs")
    sqs, url = aws.sqs(), harness.settings.batch_jobs_queue_url
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]

    def receive() -> list[dict]:
        return sqs.receive_message(QueueUrl=url, AttributeNames=["All"]).get("Messages", [])

    def run(message: dict) -> set[str]:
        record = sqs_record(message, arn)
        return failed_message_ids(handler({"Records": [record]}, LambdaContext("batch_jobs", 1769, 900)),
                                  [record["messageId"]])

    first = receive()
    assert len(first) == 1 and run(first[0])
    # Then it is hidden for the base delay, not the queue's 5,400 s, and comes back a second time
    assert receive() == []
    deadline = time.monotonic() + 10
    while not (again := receive()):
        assert time.monotonic() < deadline, "the failed step never came back"
        time.sleep(0.1)
    assert again[0]["Attributes"]["ApproximateReceiveCount"] == "2"
    # And run then, the check stores the batch and starts its requests
    monkeypatch.setitem(job_steps.STEPS, "validate", validate)
    assert not run(again[0])
    assert harness.batch(batch["id"])["request_counts"]["total"] == 3 and len(take_messages(harness)) == 3


def test_a_failed_steps_backoff_doubles_with_each_receive_up_to_sqs_cap(harness, monkeypatch):
    hidden: list[int] = []
    monkeypatch.setattr(job_steps.queues, "change_visibility", lambda url, handle, seconds: hidden.append(seconds))
    delays = [job_steps.retry_later(harness.settings, "handle", receives) for receives in (1, 2, 3, 4, 5, 20)]
    assert delays == hidden == [60, 120, 240, 480, 960, SQS_MAX_VISIBILITY_SECONDS]
