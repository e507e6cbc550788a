"""The IAM tests' scenario: every function's handler run on moto through what the service does
(batches created, run with retries, waits for slots, a body and an answer too big for an item,
results read, a batch retried, one cancelled, one deleted, one expired, then swept and purged; webhook
endpoints managed through every route, the batch table's stream told, deliveries retried, given
up and delivered), each call recorded by the `recorder` fixture of test_iam.py."""

from __future__ import annotations

import base64
import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
from freeinference_batch import accounts
from freeinference_batch.batches import job_steps
from freeinference_batch.core import aws
from freeinference_batch.ops import schedules
from freeinference_batch.worker import upstream
from freeinference_batch_local.cloudformation.template import load_template
from freeinference_batch_local.handlers import LOCAL_STACK_NAME, LambdaContext
from freeinference_batch_local.triggers.dynamodb_stream import stream_record
from freeinference_batch_local.triggers.sqs import failed_message_ids, sqs_record

from tests.conftest import sample_request
from tests.deploy.iam_calls import Recorder
from tests.deploy.iam_grants import queue_names
from tests.service.batches.file_batches import create_file_batch

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "template.yaml"
MODELS = sorted(json.loads((REPO / "layers" / "batch_core" / "freeinference_batch" / "core" / "models.json")
                           .read_text())["models"])


def big_answer(letter: str) -> upstream.Outcome:
    body = {"object": "chat.completion", "choices": [{"message": {"content": letter * 400_000}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
    return upstream.Outcome("completed", response={"status_code": 200, "request_id": "r", "body": body})


class Receiver:
    """A webhook receiver on loopback: answers 500 while `failing`, else 204."""

    def __init__(self) -> None:
        self.failing = False
        self.got: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["content-length"]))
                receiver.got.append(self.headers["webhook-id"])
                self.send_response(500 if receiver.failing else 204)
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def manage_webhook_endpoints(harness, receiver: Receiver) -> tuple[str, str]:
    """Every webhook route once: an endpoint to the receiver and one to a port nobody listens on."""
    harness.configure(WEBHOOK_ALLOW_LOOPBACK_HTTP="true", WEBHOOK_RETRY_BASE_SECONDS=0,
                      # every call reads the signing key, so each function's read is seen
                      WEBHOOK_SIGNING_KEY_MAX_AGE_SECONDS=0)
    every = ["batch.completed", "batch.failed", "batch.expired", "batch.cancelled"]
    status, live = harness.call("POST", "/v1/webhook_endpoints", {"url": receiver.url, "name": "live",
                                                                  "event_types": every})
    assert status == 200, live
    closed = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    dead_url = f"http://127.0.0.1:{closed.server_port}/hook"
    closed.server_close()  # refused connections from now on
    status, dead = harness.call("POST", "/v1/webhook_endpoints", {"url": dead_url, "name": "dead",
                                                                  "event_types": every})
    assert status == 200, dead
    for method, path, body in (("GET", "/v1/webhook_endpoints", None),
                               ("GET", f"/v1/webhook_endpoints/{live['id']}", None),
                               ("POST", f"/v1/webhook_endpoints/{live['id']}", {"name": "live (renamed)"}),
                               ("POST", f"/v1/webhook_endpoints/{live['id']}/rotate_secret",
                                {"keep_old_secret_active_for_24_hours": True}),
                               ("POST", f"/v1/webhook_endpoints/{live['id']}/test", {"event_type": "batch.completed"}),
                               ("GET", "/v1/webhook_event_types", None)):
        status, answer = harness.call(method, path, body)
        assert status == 200, (path, answer)
    return live["id"], dead["id"]


def tell_status_changes(recorder: Recorder) -> None:
    """The batch table's stream, as its mapping gives it to the status-events function: MODIFY
    records of META items (the mapping's filter), in batches of 100."""
    # The regional endpoint: botocore derives an account-based one from a stream ARN, which
    # moto's in-process mock does not serve (the test's own client: the mapping's reads, not the function's)
    streams = boto3.client("dynamodbstreams", endpoint_url="https://streams.dynamodb.us-east-1.amazonaws.com")
    table = aws.dynamodb().describe_table(TableName=f"{LOCAL_STACK_NAME}-BatchTable")["Table"]
    stream_arn = table["LatestStreamArn"]
    records = []
    for shard in streams.describe_stream(StreamArn=stream_arn)["StreamDescription"]["Shards"]:
        iterator = streams.get_shard_iterator(StreamArn=stream_arn, ShardId=shard["ShardId"],
                                              ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        while iterator:
            page = streams.get_records(ShardIterator=iterator, Limit=1000)
            records += page["Records"]
            iterator = page.get("NextShardIterator") if page["Records"] else None
    told = [stream_record(r, stream_arn) for r in records
            if r["eventName"] == "MODIFY" and r["dynamodb"]["Keys"]["sk"]["S"] == "META"]
    assert told
    (handler,) = recorder.stream_handlers.values()  # type: ignore[attr-defined]
    for start in range(0, len(told), 100):
        answer = handler({"Records": told[start:start + 100]}, LambdaContext("status_events", 256, 60))
        assert answer == {"batchItemFailures": []}


def pump_deliveries(harness, recorder: Recorder) -> int:
    """One receive of the delivery queue given to its function, as its mapping would."""
    ((queue, handler),) = recorder.delivery_handlers.items()  # type: ignore[attr-defined]
    url, sqs = aws.sqs().get_queue_url(QueueName=queue_names(load_template(TEMPLATE))[queue])["QueueUrl"], aws.sqs()
    messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"]).get("Messages", [])
    if messages:
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        records = [sqs_record(m, arn) for m in messages]
        answer = handler({"Records": records}, LambdaContext("webhook_delivery", 256, 60))
        keep = failed_message_ids(answer, [r["messageId"] for r in records]) or set()
        for message, record in zip(messages, records, strict=True):
            if record["messageId"] not in keep:
                sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    return len(messages)


def deliver_webhooks(harness, recorder: Recorder, receiver: Receiver, live: str) -> None:
    # First attempts: the receiver answers 500 and the dead endpoint refuses, both retried (their
    # visibility set; the dead one marked unreachable)
    receiver.failing = True
    while pump_deliveries(harness, recorder):
        pass
    assert receiver.got
    # Then the receiver answers, and the dead endpoint's retry window is over: given up
    receiver.failing = False
    harness.configure(WEBHOOK_RETRY_WINDOW_SECONDS=1)
    harness.advance_clock(5)
    harness.run_until(lambda: not pump_deliveries(harness, recorder) and not _in_flight(harness, recorder))
    status, _ = harness.call("DELETE", f"/v1/webhook_endpoints/{live}")
    assert status == 200


def _in_flight(harness, recorder: Recorder) -> int:
    ((queue, _),) = recorder.delivery_handlers.items()  # type: ignore[attr-defined]
    url = aws.sqs().get_queue_url(QueueName=queue_names(load_template(TEMPLATE))[queue])["QueueUrl"]
    attributes = aws.sqs().get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesNotVisible"])


def create_from_file(harness, lines: list[dict], *, upload: bool = False) -> dict:
    """A batch created from an input file holding `lines`, the file sent through the Files API
    (`files.create`), or with `upload` through the Uploads API in two parts (never downloaded, so
    its content stays the parts' objects, which the check reads)."""
    content = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    multipart = {"content-type": f"multipart/form-data; boundary={BOUNDARY}"}
    if upload:
        status, made = harness.call("POST", "/v1/uploads", {"filename": "in.jsonl", "purpose": "batch",
                                                            "bytes": len(content), "mime_type": "application/jsonl"})
        assert status == 200, made
        half = len(content) // 2
        ids = []
        for part in (content[:half], content[half:]):
            status, added = harness.call("POST", f"/v1/uploads/{made['id']}/parts", raw=_form("data", part),
                                         headers=multipart)
            assert status == 200, added
            ids.append(added["id"])
        status, done = harness.call("POST", f"/v1/uploads/{made['id']}/complete", {"part_ids": ids})
        assert status == 200, done
        file_id = done["file"]["id"]
    else:
        status, made = harness.call("POST", "/v1/files", raw=_form("file", content, purpose="batch"), headers=multipart)
        assert status == 200, made
        file_id = made["id"]
    status, batch = harness.call("POST", "/v1/batches", {"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                                                         "completion_window": "24h"})
    assert status == 200, batch
    return batch


def run_jobs(harness, recorder: Recorder, first_seconds: float = 900, fail_first: bool = False) -> None:
    """The batch jobs queue's messages through the jobs function, one an invocation, until none is
    left; the first invocation `first_seconds` long (60: a step out of time at once, which queues
    the next). `fail_first`: the first step fails, and its message is hidden for its backoff
    (BATCH_JOBS_RETRY_BASE_SECONDS, 0 in the scenario), then runs again."""
    sqs, url = aws.sqs(), harness.settings.batch_jobs_queue_url
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    seconds = first_seconds
    while messages := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1).get("Messages", []):
        record = sqs_record(messages[0], arn)
        if fail_first:
            fail_first = False
            steps = dict(job_steps.STEPS)
            job_steps.STEPS.update({kind: _failing_step for kind in steps})
            try:
                answer = recorder.job_handler({"Records": [record]}, LambdaContext("batch_jobs", 1769, seconds))
            finally:
                job_steps.STEPS.update(steps)
            assert failed_message_ids(answer, [record["messageId"]]) == {record["messageId"]}, answer
            continue
        answer = recorder.job_handler({"Records": [record]}, LambdaContext("batch_jobs", 1769, seconds))
        seconds = 900
        assert not failed_message_ids(answer, [record["messageId"]]), answer
        sqs.delete_message(QueueUrl=url, ReceiptHandle=messages[0]["ReceiptHandle"])


def _failing_step(settings: Any, batch_id: str, deadline: float) -> bool:
    raise OSError(f"a step of batch {batch_id}'s job failed")


def lose_jobs(harness) -> None:
    sqs, url = aws.sqs(), harness.settings.batch_jobs_queue_url
    while messages := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []):
        for message in messages:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])


class WorkerDied(BaseException):
    """The Lambda running a request is killed mid-run: nothing cleans up."""


BOUNDARY = "scenario-boundary"


def _form(name: str, data: bytes, **fields: str) -> bytes:
    out = b"".join(f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
                   for k, v in fields.items())
    head = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"; filename="in.jsonl"\r\n\r\n'
    return out + head.encode() + data + f"\r\n--{BOUNDARY}--\r\n".encode()


def manage_files(harness) -> None:
    """Every file and upload route once, an upload of two parts joined by its download; an input
    file and a pending upload left for the purge to expire."""
    multipart = {"content-type": f"multipart/form-data; boundary={BOUNDARY}"}

    def call(method: str, path: str, body: Any = None, raw: bytes | None = None) -> dict:
        status, answer = harness.call(method, path, body, raw=raw, headers=multipart if raw else None)
        assert status in (200, 307), (path, answer)
        return answer

    made = call("POST", "/v1/files", raw=_form("file", b'{"a":1}\n', purpose="batch"))
    kept = call("POST", "/v1/files", raw=_form("file", b'{"b":2}\n', purpose="batch"))
    call("GET", "/v1/files?limit=5")
    call("GET", f"/v1/files/{made['id']}")
    call("GET", f"/v1/files/{made['id']}/content")
    call("DELETE", f"/v1/files/{made['id']}")
    parts = [random.Random(n).randbytes(3 * 1024 * 1024) for n in range(2)]
    upload = call("POST", "/v1/uploads", {"filename": "big.jsonl", "purpose": "batch", "bytes": 6 * 1024 * 1024,
                                          "mime_type": "application/jsonl"})
    ids = [call("POST", f"/v1/uploads/{upload['id']}/parts", raw=_form("data", part))["id"] for part in parts]
    done = call("POST", f"/v1/uploads/{upload['id']}/complete", {"part_ids": ids})
    call("GET", f"/v1/files/{done['file']['id']}/content")
    cancelled = call("POST", "/v1/uploads", {"filename": "c", "purpose": "batch", "bytes": 10,
                                             "mime_type": "application/jsonl"})
    call("POST", f"/v1/uploads/{cancelled['id']}/parts", raw=_form("data", b"0123"))
    call("POST", f"/v1/uploads/{cancelled['id']}/cancel")
    pending = call("POST", "/v1/uploads", {"filename": "p", "purpose": "batch", "bytes": 10,
                                           "mime_type": "application/jsonl"})
    call("POST", f"/v1/uploads/{pending['id']}/parts", raw=_form("data", b"0123"))
    assert kept["id"]


def pump_until_a_run_dies(harness, queue_url: str, timeout: float = 30.0) -> None:
    """Worker invocations on the queue until one dies. The batch's five requests are four lanes
    (the model's batch concurrency), and the account's two slots go to whichever two of the four
    messages claim first: the lane whose second request dies may wait for a slot, to be woken (made
    visible again) by the runs before it, and run in a later invocation."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if not harness.pump_once(queue_url):
                time.sleep(0.05)
        except WorkerDied:
            return
    raise AssertionError("no run died before the deadline")


def run_scenario(harness, recorder: Recorder, monkeypatch) -> None:
    # The workers read the upstream credential from the template's secret, as deployed.
    secret_arn = aws._client("secretsmanager").describe_secret(
        SecretId=f"{LOCAL_STACK_NAME}-UpstreamApiKeySecret")["ARN"]
    # (max age 0: every run reads it, so each worker's read is seen, as on AWS where each has its own cache)
    harness.configure(UPSTREAM_API_KEY_SECRET=secret_arn, UPSTREAM_API_KEY_MAX_AGE_SECONDS=0)
    real_call = upstream.call

    def call(settings, body: bytes, **kwargs: Any) -> upstream.Outcome:
        if b"Dies" in body:
            raise WorkerDied
        return big_answer("A") if b"BigAnswer" in body else real_call(settings, body, **kwargs)

    monkeypatch.setattr(upstream, "call", call)
    context = LambdaContext("schedule", 512, 300)
    # An account with two concurrent requests: chains of both models wait for its slots and
    # wake each other (across queues).
    accounts.set_account(harness.settings, "acct-1", concurrency=2)
    receiver = Receiver()
    live, _ = manage_webhook_endpoints(harness, receiver)
    manage_files(harness)
    # A body too big for an item, whatever the compression (random text).
    big_body = base64.b64encode(random.Random(7).randbytes(450_000)).decode()

    def requests(tag: str) -> list[dict]:
        out = []
        for model in MODELS:
            out += [sample_request(f"{tag}-{model}-{i}", model=model) for i in range(5)]
            out += [sample_request(f"{tag}-{model}-retry", "[sim:fail=503*1] again", model=model),
                    sample_request(f"{tag}-{model}-big-answer", "BigAnswer", model=model)]
        return out

    status, first = harness.call("POST", "/v1/batches", {"requests": [*requests("a"),
                                                                    sample_request("big-body", big_body)]},
                                 headers={"idempotency-key": "scenario-first"})
    assert status == 200, first
    second = harness.create(requests("b"))
    # A create refused at the limit takes back what it stored, its S3 body included.
    harness.configure(BATCH_MAX_UNFINISHED=2)
    status, refused = harness.call("POST", "/v1/batches", {"requests": [sample_request("big-again", big_body)]})
    assert status == 429, refused
    harness.configure(BATCH_MAX_UNFINISHED=10)
    for batch in (first, second):
        assert harness.run_to_final(batch["id"], timeout=90)["status"] == "completed"
    status, page = harness.call("GET", f"/v1/batches/{first['id']}/results?limit=1000")
    assert status == 200 and len(page["data"]) == 15
    status, _ = harness.call("GET", "/v1/batches?limit=5")
    assert status == 200

    # A run that dies mid-request after settling one, and a message that is lost: the sweep counts
    # what the run settled (the account's usage), and takes both back.
    lost = harness.create([*(sample_request(f"d-{n}") for n in range(4)), sample_request("d-4", "Dies"),
                           sample_request("l-0", model=MODELS[1])])
    pump_until_a_run_dies(harness, harness.queues[MODELS[0]])
    sqs = aws.sqs()
    for message in sqs.receive_message(QueueUrl=harness.queues[MODELS[1]], MaxNumberOfMessages=10)["Messages"]:
        sqs.delete_message(QueueUrl=harness.queues[MODELS[1]], ReceiptHandle=message["ReceiptHandle"])
    harness.advance_clock(harness.settings.lease_seconds + harness.settings.batch_dispatch_lease_seconds + 60)
    recorder.schedules["sweep_handler"]({}, context)
    monkeypatch.setattr(upstream, "call", real_call)
    assert harness.run_to_final(lost["id"])["status"] == "completed"

    # Batches from an input file (issue 32): one checked and run, whose output file is a multipart
    # upload of two parts (answers of ~600 KB) and whose error file holds its failed request (a body
    # big enough for S3 among its lines); one whose bad lines fail it; the first then deleted.
    harness.configure(BATCH_FILES_PART_BYTES=5 * 1024 * 1024)
    good = create_from_file(harness, [*(sample_request(f"f-{n}", "[sim:pad=300000]") for n in range(10)),
                                      sample_request("f-fail", "[sim:status=400]"),
                                      sample_request("f-big-body", big_body),
                                      sample_request("f-other-model", model=MODELS[1])], upload=True)
    bad = create_from_file(harness, [sample_request("x-0", model="no-such-model")])
    run_jobs(harness, recorder)
    assert harness.batch(bad["id"])["status"] == "failed"
    harness.run_until(lambda: harness.batch(good["id"])["status"] == "finalizing", timeout=90)
    run_jobs(harness, recorder, first_seconds=60)
    finished = harness.batch(good["id"])
    assert finished["status"] == "completed" and finished["output_file_id"] and finished["error_file_id"]
    status, _ = harness.call("DELETE", f"/v1/batches/{good['id']}")
    assert status == 200
    # A check whose job was lost: the sweep sends it again once it has gone quiet.
    quiet = create_from_file(harness, [sample_request("z-0")])
    lose_jobs(harness)
    harness.advance_clock(schedules.CHECK_QUIET_SECONDS + 1)
    assert recorder.schedules["sweep_handler"]({}, context)["checks_resent"] == 1
    harness.configure(BATCH_JOBS_RETRY_BASE_SECONDS=0)  # its first step fails, and is retried at once
    run_jobs(harness, recorder, fail_first=True)
    harness.run_until(lambda: harness.batch(quiet["id"])["status"] == "finalizing", timeout=90)
    run_jobs(harness, recorder)
    assert harness.batch(quiet["id"])["status"] == "completed"

    # A retry reads its parent's requests (the big body from S3) and stores them as a new batch.
    status, child = harness.call("POST", f"/v1/batches/{first['id']}/retry", {"statuses": ["completed"]})
    assert status == 200 and child["request_counts"]["total"] == 15, child
    # A file batch cancelled with nothing running: the API queues its files' job (lost here: the
    # sweep sends it again once it has been quiet long enough, after the expiry below).
    cancelled = {"id": create_file_batch(harness, [sample_request("c-0")])}
    for batch_id in (child["id"], cancelled["id"]):
        status, _ = harness.call("POST", f"/v1/batches/{batch_id}/cancel")
        assert status == 200
    status, _ = harness.call("DELETE", f"/v1/batches/{first['id']}")
    assert status == 200

    lose_jobs(harness)
    # Two batches expiring: one inline, one created from a file (the expiry queues its files' job)
    expiring = harness.create([sample_request("e-0"), sample_request("e-1", model=MODELS[1])])
    expiring_file = create_file_batch(harness, [sample_request("e-0")])
    harness.advance_clock(harness.settings.batch_completion_window_seconds + 3700)
    recorder.schedules["expire_handler"]({}, context)
    recorder.schedules["sweep_handler"]({}, context)
    run_jobs(harness, recorder)
    harness.run_until(lambda: harness.batch(expiring["id"])["status"] == "expired")
    assert harness.batch(expiring_file)["status"] == "expired"
    assert harness.batch(cancelled["id"])["status"] == "cancelled"
    recorder.schedules["purge_handler"]({}, context)  # the deleted batch goes at once
    harness.advance_clock(harness.settings.batch_retention_seconds + 60)
    recorder.schedules["purge_handler"]({}, context)

    # Every status change above, told; each final one delivered to the two endpoints
    tell_status_changes(recorder)
    try:
        deliver_webhooks(harness, recorder, receiver, live)
    finally:
        receiver.close()
