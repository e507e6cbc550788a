"""A file batch's output and error files on moto (issue 32): written by the `write_files` job while
the batch is finalizing (cancelling, expiring), line by line what the results pages show, in OpenAI's
output line shape; resumable, written once; null when empty; deleted with the batch. An inline
batch never sees any of it."""

from __future__ import annotations

import json

import pytest
from freeinference_batch.batches import job_steps, output_files
from freeinference_batch.core import aws
from freeinference_batch.store import batch_files, files
from freeinference_batch.store.batch_table import BatchTable

from tests.conftest import sample_request
from tests.service.batches.file_batches import (
    FINAL,
    create_file_batch,
    expected_files,
    file_lines,
    pump_jobs,
    run_until_status,
)
from tests.service.helpers import run_schedule

pytestmark = pytest.mark.usefixtures("one_worker_thread")


def mixed_requests(count: int) -> list[dict]:
    """Every third request fails upstream (a 400 is not retried): both files have lines."""
    return [sample_request(f"q-{i}", f"Question {i}" + (" [sim:status=400]" if i % 3 == 1 else ""))
            for i in range(count)]


def test_a_completed_file_batch_is_finalizing_until_its_files_are_written_then_completed(harness):
    batch_id = create_file_batch(harness, mixed_requests(7))

    # Every request settled: finalizing, not completed, until the job has written its files
    finalizing = run_until_status(harness, batch_id, ("finalizing", *FINAL))
    assert finalizing["status"] == "finalizing" and finalizing["finalizing_at"] is not None
    assert finalizing["completed_at"] is None and finalizing["output_file_id"] is None

    # Cancel and delete during it are refused, naming the status
    for method, path in (("POST", f"/v1/batches/{batch_id}/cancel"), ("DELETE", f"/v1/batches/{batch_id}")):
        status, body = harness.call(method, path)
        assert status == 409 and "finalizing" in body["error"]["message"], body

    assert pump_jobs(harness) == (1, 0)
    final = harness.batch(batch_id)
    assert final["status"] == "completed" and final["completed_at"] >= final["finalizing_at"]
    assert final["request_counts"] == {"total": 7, "completed": 5, "failed": 2}
    output, error = expected_files(harness.results(batch_id))
    assert len(output) == 5 and len(error) == 2
    assert file_lines(harness, final["output_file_id"]) == output
    assert file_lines(harness, final["error_file_id"]) == error
    assert final["output_file_id"] == files.batch_file_id(batch_id, "output")
    progress = batch_files.get_progress(harness.settings, batch_id)
    assert progress.output.done and progress.error.done


def test_a_file_with_no_line_is_null(harness):
    batch_id = create_file_batch(harness, [sample_request(f"q-{i}") for i in range(3)])
    run_until_status(harness, batch_id, ("finalizing",))
    pump_jobs(harness)
    final = harness.batch(batch_id)
    assert final["status"] == "completed" and final["error_file_id"] is None
    assert len(file_lines(harness, final["output_file_id"])) == 3
    assert files.get_file(harness.settings, "acct-1", files.batch_file_id(batch_id, "error")) is None


def test_a_cancelled_file_batch_writes_its_files_while_cancelling(harness):
    batch_id = create_file_batch(harness, [sample_request(f"q-{i}") for i in range(4)])
    status, cancelling = harness.call("POST", f"/v1/batches/{batch_id}/cancel")
    assert status == 200 and cancelling["status"] == "cancelling", cancelling
    # Cancel again while its files are written: unchanged, as for any batch cancelling
    assert harness.call("POST", f"/v1/batches/{batch_id}/cancel")[1]["status"] == "cancelling"
    status, body = harness.call("DELETE", f"/v1/batches/{batch_id}")
    assert status == 409 and "cancelling" in body["error"]["message"]

    pump_jobs(harness)
    final = harness.batch(batch_id)
    assert final["status"] == "cancelled" and final["output_file_id"] is None
    lines = file_lines(harness, final["error_file_id"])
    assert lines == expected_files(harness.results(batch_id))[1]
    assert [line["error"]["code"] for line in lines] == ["batch_cancelled"] * 4


def test_an_expiring_file_batch_writes_its_files_before_it_shows_expired(harness):
    batch_id = create_file_batch(harness, [sample_request(f"q-{i}") for i in range(3)])
    harness.advance_clock(86400 + 5)
    run_schedule("expire")
    assert harness.batch(batch_id)["status"] == "validating"  # not expired until its files are there
    status, body = harness.call("POST", f"/v1/batches/{batch_id}/cancel")
    assert status == 409 and "validating" in body["error"]["message"], body

    pump_jobs(harness)
    final = harness.batch(batch_id)
    assert final["status"] == "expired" and final["output_file_id"] is None
    lines = file_lines(harness, final["error_file_id"])
    assert lines == expected_files(harness.results(batch_id))[1]
    assert {line["error"]["code"] for line in lines} == {"batch_expired"}


def test_an_inline_batch_never_finalizes_and_has_no_files(harness):
    batch = harness.create([sample_request("q-0")])
    final = harness.run_to_final(batch["id"])
    assert final["status"] == "completed"
    assert (final["output_file_id"], final["error_file_id"], final["finalizing_at"]) == (None, None, None)
    assert pump_jobs(harness) == (0, 0)


def padded_requests(count: int, pad: int) -> list[dict]:
    """Answers of about 2 x `pad` bytes each (the simulator pads with a two-byte character)."""
    return [sample_request(f"q-{i}", f"Question {i} [sim:pad={pad}]") for i in range(count)]


def test_a_step_that_dies_midway_resumes_keeping_the_parts_already_sent(harness, monkeypatch):
    # Parts of S3's minimum, 5 MiB; 12 answers of ~1.2 MB: the output file is two parts and a last
    harness.configure(BATCH_FILES_PART_BYTES=5 * 1024 * 1024)
    batch_id = create_file_batch(harness, padded_requests(12, 600_000))
    run_until_status(harness, batch_id, ("finalizing",))

    sent: list[int] = []
    real_upload_part = batch_files.upload_part

    def upload_part(settings, batch_id, kind, upload_id, number, body):
        if number == 2 and -2 not in sent:
            sent.append(-2)
            raise ConnectionError("the step died here")
        sent.append(number)
        return real_upload_part(settings, batch_id, kind, upload_id, number, body)

    monkeypatch.setattr(batch_files, "upload_part", upload_part)
    ran, failed = pump_jobs(harness)
    assert (ran, failed) == (1, 1)
    progress = batch_files.get_progress(harness.settings, batch_id)
    assert progress.output.next_part == 2 and progress.output.upload_id and not progress.output.done
    assert harness.batch(batch_id)["status"] == "finalizing"

    assert pump_jobs(harness) == (1, 0)
    assert sent == [1, -2, 2, 3]  # part 1 kept, not sent again
    final = harness.batch(batch_id)
    assert final["status"] == "completed"
    output, _ = expected_files(harness.results(batch_id))
    assert file_lines(harness, final["output_file_id"]) == output
    assert files.get_file(harness.settings, "acct-1", final["output_file_id"]).bytes > 10 * 1024 * 1024


def test_a_step_out_of_time_keeps_only_whole_parts_and_the_next_step_goes_on(harness, monkeypatch):
    harness.configure(BATCH_FILES_PART_BYTES=5 * 1024 * 1024)
    batch_id = create_file_batch(harness, padded_requests(9, 600_000))
    run_until_status(harness, batch_id, ("finalizing",))

    class Ticks:  # the step's clock: one tick a line read
        now = 0

        def monotonic(self) -> float:
            self.now += 1
            return self.now

    monkeypatch.setattr(output_files, "time", Ticks())
    steps = []
    real = output_files.write_files

    def write_files(settings, batch_id, deadline):
        steps.append(batch_files.get_progress(settings, batch_id))
        # The first step's deadline comes after 7 lines (~8.4 MB: a whole part of 5 MiB, and ~3 MB)
        return real(settings, batch_id, 7 if len(steps) == 1 else float("inf"))

    monkeypatch.setitem(job_steps.STEPS, "write_files", write_files)
    assert pump_jobs(harness) == (2, 0)
    assert steps[0] is None
    # The whole part kept, the lines after it left to the next step (read again there)
    assert (steps[1].output.next_part, steps[1].output.position) == (2, 5)
    final = harness.batch(batch_id)
    assert final["status"] == "completed"
    assert file_lines(harness, final["output_file_id"]) == expected_files(harness.results(batch_id))[0]


def test_two_runs_of_the_job_at_once_send_each_part_with_the_same_lines(harness, monkeypatch):
    # Given a file batch of three parts (7 answers of ~1.2 MB a part), and two runs of its job at
    # once (SQS delivers at least once): the first has sent part 1 and holds 5 lines of part 2 when
    # the second takes over, sends part 2 whole and runs out of time; then the first runs out of time
    harness.configure(BATCH_FILES_PART_BYTES=8 * 1024 * 1024)
    batch_id = create_file_batch(harness, padded_requests(20, 600_000))
    run_until_status(harness, batch_id, ("finalizing",))
    sent: dict[int, list[bytes]] = {}
    real_upload_part = batch_files.upload_part

    def upload_part(settings, batch_id, kind, upload_id, number, body):
        sent.setdefault(number, []).append(body)
        return real_upload_part(settings, batch_id, kind, upload_id, number, body)

    class Ticks:  # both runs' clock: one tick a line read
        now = 0

        def monotonic(self) -> float:
            self.now += 1
            if self.now == 12:  # the first run has read lines 0..11
                # the second reads lines 7..15: part 2 is lines 7..13
                assert output_files.write_files(harness.settings, batch_id, self.now + 9) is False
            return self.now

    monkeypatch.setattr(batch_files, "upload_part", upload_part)
    monkeypatch.setattr(output_files, "time", Ticks())
    output_files.write_files(harness.settings, batch_id, 12)
    # When the job goes on to its end
    assert output_files.write_files(harness.settings, batch_id, float("inf")) is True
    # Then no part was sent with other lines than another run's same part, and the file is whole
    assert sorted(sent) == [1, 2, 3]
    assert all(len(set(bodies)) == 1 for bodies in sent.values()), {n: list(map(len, b)) for n, b in sent.items()}
    final = harness.batch(batch_id)
    assert final["status"] == "completed"
    assert file_lines(harness, final["output_file_id"]) == expected_files(harness.results(batch_id))[0]


def test_a_step_run_again_writes_nothing_twice(harness, monkeypatch):
    batch_id = create_file_batch(harness, mixed_requests(4))
    run_until_status(harness, batch_id, ("finalizing",))
    pump_jobs(harness)
    final = harness.batch(batch_id)
    before = (file_lines(harness, final["output_file_id"]), file_lines(harness, final["error_file_id"]))

    writes: list[str] = []
    s3 = aws.s3()
    for name in ("put_object", "create_multipart_upload", "upload_part", "complete_multipart_upload"):
        monkeypatch.setattr(s3, name, lambda *a, _name=name, **k: writes.append(_name))
    # A duplicate delivery of the job, and a direct run: both find the batch final
    assert output_files.write_files(harness.settings, batch_id, float("inf")) is True
    assert writes == []
    assert harness.batch(batch_id) == final
    assert (file_lines(harness, final["output_file_id"]), file_lines(harness, final["error_file_id"])) == before


def test_a_progress_write_whose_answer_was_lost_finds_its_own_success(harness, monkeypatch):
    # Given a file batch whose job's every progress write is applied, then re-sent by botocore (its
    # answer lost), as DynamoDB then answers: refused by its own success
    batch_id = create_file_batch(harness, mixed_requests(4))
    run_until_status(harness, batch_id, ("finalizing",))
    client = aws.dynamodb()
    put_item, resent = client.put_item, []

    def applied_then_resent(**kwargs):
        if kwargs["Item"]["sk"] != {"S": batch_files.FILES_SK}:
            return put_item(**kwargs)
        put_item(**kwargs)
        resent.append(kwargs["Item"]["version"]["N"])
        return put_item(**kwargs)

    monkeypatch.setattr(client, "put_item", applied_then_resent)
    # When its job runs, then it writes both files and ends the batch, without the sweep
    assert pump_jobs(harness) == (1, 0)
    assert resent
    final = harness.batch(batch_id)
    assert final["status"] == "completed" and final["output_file_id"] and final["error_file_id"]
    output, error = expected_files(harness.results(batch_id))
    assert file_lines(harness, final["output_file_id"]) == output
    assert file_lines(harness, final["error_file_id"]) == error


def test_the_sweep_sends_again_a_job_that_went_quiet(harness):
    batch_id = create_file_batch(harness, [sample_request("q-0")])
    run_until_status(harness, batch_id, ("finalizing",))
    sqs, url = aws.sqs(), harness.settings.batch_jobs_queue_url
    lost = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
    assert len(lost) == 1
    sqs.delete_message(QueueUrl=url, ReceiptHandle=lost[0]["ReceiptHandle"])

    assert run_schedule("sweep")["files_resent"] == 0  # not quiet for long yet
    harness.advance_clock(harness.settings.batch_files_stall_seconds + 1)
    assert run_schedule("sweep")["files_resent"] == 1
    assert run_schedule("sweep")["files_resent"] == 0  # touched: the next sweeps wait for it
    pump_jobs(harness)
    assert harness.batch(batch_id)["status"] == "completed"


def test_deleting_a_file_batch_deletes_its_files(harness):
    batch_id = create_file_batch(harness, mixed_requests(3))
    run_until_status(harness, batch_id, ("finalizing",))
    pump_jobs(harness)
    final = harness.batch(batch_id)
    assert final["output_file_id"] and final["error_file_id"]
    status, _ = harness.call("DELETE", f"/v1/batches/{batch_id}")
    assert status == 200
    for file_id in (final["output_file_id"], final["error_file_id"]):
        assert files.get_file(harness.settings, "acct-1", file_id) is None
    listed = aws.s3().list_objects_v2(Bucket=harness.settings.payload_bucket_name, Prefix=f"{batch_id}/files/")
    assert listed.get("KeyCount", 0) == 0
    run_schedule("purge")
    assert BatchTable(harness.settings).get_meta(batch_id) is None


@pytest.mark.parametrize(("status", "error", "expected"), [
    # answered with an HTTP error: OpenAI's form, the answer with the error as its body
    ("failed", {"code": "invalid_request", "message": "bad", "status": 400},
     {"response": {"status_code": 400, "request_id": None, "body": {"error": {
         "message": "bad", "type": "invalid_request", "param": None, "code": "invalid_request"}}}, "error": None}),
    # failed with no HTTP answer (its runs all cut short), or not run: the error alone
    ("failed", {"code": "upstream_error", "message": "cut"},
     {"response": None, "error": {"code": "upstream_error", "message": "cut"}}),
    ("expired", {"code": "rate_limited", "message": "slow", "status": 429},
     {"response": None, "error": {"code": "rate_limited", "message": "slow"}}),
    ("cancelled", None, {"response": None, "error": output_files.NOT_RUN["cancelled"]}),
])
def test_an_error_file_line_is_a_response_only_for_a_failed_requests_http_error(status, error, expected):
    line = {"id": "batch_req_9", "custom_id": "q-9", "status": status, "response": None, "error": error}
    kind, data = output_files.file_line(line)
    assert kind == "error" and data.endswith(b"\n")
    assert json.loads(data) == {"id": "batch_req_9", "custom_id": "q-9", **expected}
    assert list(json.loads(data)) == ["id", "custom_id", "response", "error"]
