"""The sample events of events/: every function has its own (one per API route), each is what its
event source sends, and every handler, driven by its sample event (as `sam local invoke` would),
does what the event asks."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
from freeinference_batch import accounts
from freeinference_batch_local.handlers import LambdaContext, load_handler, repo_root

from tests.deploy.templates import API_METHOD_REFUSALS, API_ROUTES, EVENTS

SAMPLE_KEY = "hyi-sample-key-0123456789abcdef0123456789abcdef"
SAMPLE_BATCH = "batch_0123456789abcdef0123456789abcdef"
SAMPLE_ENDPOINT = "we_0123456789abcdef0123456789abcdef"


def event(name: str) -> dict:
    return json.loads((repo_root() / "events" / f"{name}.json").read_text())


def invoke_api(name: str, query: dict | None = None, **path: str) -> tuple[int, dict]:
    sample = event(name)
    if query is not None:
        sample["queryStringParameters"] = query
        sample["rawQueryString"] = "&".join(f"{k}={v}" for k, v in query.items())
    if path:
        sample["pathParameters"] = path
        for name, sample_id in (("batch_id", SAMPLE_BATCH), ("endpoint_id", SAMPLE_ENDPOINT)):
            if name in path:
                sample["rawPath"] = sample["rawPath"].replace(sample_id, path[name])
        sample["requestContext"]["http"]["path"] = sample["rawPath"]
    answer = load_handler("api")(sample, LambdaContext("api", 1769, 29))
    return answer["statusCode"], json.loads(answer["body"])


def test_api_sample_events_drive_a_batch_through_every_endpoint(harness):
    accounts.create_key(harness.settings, "sample-account", tier="internal", key=SAMPLE_KEY)

    status, created = invoke_api("api-create-batch")
    assert status == 200 and created["status"] == "validating"
    assert created["request_counts"]["total"] == len(json.loads(event("api-create-batch")["body"])["requests"])
    batch_id = created["id"]

    status, fetched = invoke_api("api-get-batch", batch_id=batch_id)
    assert status == 200 and fetched["id"] == batch_id

    status, listed = invoke_api("api-list-batches")
    assert status == 200 and [b["id"] for b in listed["data"]] == [batch_id]

    # The sample's `after` names a result of another batch: refused, as the spec says.
    status, refused = invoke_api("api-get-results", batch_id=batch_id)
    assert status == 400 and "is not a result of batch" in refused["error"]["message"]
    status, page = invoke_api("api-get-results", {"limit": "100"}, batch_id=batch_id)
    assert status == 200 and [line["status"] for line in page["data"]] == ["queued", "queued"]

    status, cancelled = invoke_api("api-cancel-batch", batch_id=batch_id)
    assert status == 200 and cancelled["status"] == "cancelled"

    # The sample retries what did not succeed, cancelled included: both requests, in a new batch.
    status, child = invoke_api("api-retry-batch", batch_id=batch_id)
    assert status == 200 and child["retry_of"] == batch_id and child["request_counts"]["total"] == 2, child
    status, again = invoke_api("api-retry-batch", batch_id=batch_id)  # the sample's Idempotency-Key
    assert status == 200 and again == child

    status, deleted = invoke_api("api-delete-batch", batch_id=batch_id)
    assert status == 200 and deleted == {"id": batch_id, "object": "batch.deleted", "deleted": True}

    status, gone = invoke_api("api-get-batch", batch_id=batch_id)
    assert status == 404 and batch_id in gone["error"]["message"]


def test_api_sample_event_of_an_unknown_batch_reads_as_not_found(harness):
    accounts.create_key(harness.settings, "sample-account", tier="internal", key=SAMPLE_KEY)
    status, body = invoke_api("api-get-batch")
    assert status == 404
    assert body["error"]["message"] == f"Batch {SAMPLE_BATCH!r} not found"


def test_worker_sample_event_for_a_batch_that_does_not_exist_is_dropped(harness):
    answer = load_handler("worker")(event("worker-sqs"), LambdaContext("worker", 512, 150))
    assert answer == {"batchItemFailures": []}


@contextmanager
def receiver() -> Iterator[tuple[str, list[dict]]]:
    """A webhook receiver on loopback answering 204: its URL and the deliveries it got."""
    got: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            got.append({"headers": dict(self.headers), "body": json.loads(body)})
            self.send_response(204)
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/webhook", got
    finally:
        server.shutdown()
        server.server_close()


def test_webhook_sample_events_drive_an_endpoint_through_every_route(harness):
    # The local stack's setting (the samples' receiver is on loopback); off in the template
    harness.configure(WEBHOOK_ALLOW_LOOPBACK_HTTP="true")
    accounts.create_key(harness.settings, "sample-account", tier="internal", key=SAMPLE_KEY)

    status, created = invoke_api("api-create-webhook-endpoint")
    assert status == 200, created
    assert created["object"] == "webhook_endpoint" and created["signing_secret"].startswith("whsec_")
    endpoint_id = created["id"]

    status, fetched = invoke_api("api-get-webhook-endpoint", endpoint_id=endpoint_id)
    assert status == 200 and fetched["url"] == "http://127.0.0.1:9000/webhook" and "signing_secret" not in fetched
    status, listed = invoke_api("api-list-webhook-endpoints")
    assert status == 200 and [e["id"] for e in listed["data"]] == [endpoint_id]
    status, updated = invoke_api("api-update-webhook-endpoint", endpoint_id=endpoint_id)
    assert status == 200 and updated["event_types"] == ["batch.completed"]
    status, rotated = invoke_api("api-rotate-webhook-secret", endpoint_id=endpoint_id)
    assert status == 200 and rotated["signing_secret"] not in (created["signing_secret"], None)
    status, types = invoke_api("api-list-webhook-event-types")
    assert status == 200 and "batch.completed" in types["data"]

    # The test route's sample, to a receiver that answers (the sample's port 8000 may be anyone's)
    with receiver() as (url, got):
        status, _ = harness.call("POST", f"/v1/webhook_endpoints/{endpoint_id}", {"url": url}, key=SAMPLE_KEY)
        assert status == 200
        status, tested = invoke_api("api-test-webhook-endpoint", endpoint_id=endpoint_id)
    assert status == 200 and tested["status_code"] == 204, tested
    assert [d["body"]["type"] for d in got] == ["batch.completed"]

    status, deleted = invoke_api("api-delete-webhook-endpoint", endpoint_id=endpoint_id)
    assert status == 200 and deleted == {"id": endpoint_id, "object": "webhook_endpoint.deleted", "deleted": True}
    status, gone = invoke_api("api-get-webhook-endpoint", endpoint_id=endpoint_id)
    assert status == 404 and endpoint_id in gone["error"]["message"]


def test_status_events_sample_tells_the_change_and_queues_a_delivery(harness):
    # The sample is the stream record of account "sample"'s batch becoming completed
    harness.configure(WEBHOOK_ALLOW_LOOPBACK_HTTP="true")
    accounts.create_key(harness.settings, "sample", tier="internal", key=SAMPLE_KEY)
    status, endpoint = invoke_api("api-create-webhook-endpoint")
    assert status == 200
    events_client, sqs = boto3.client("events"), boto3.client("sqs")
    watch = sqs.create_queue(QueueName="watch-status-changes")["QueueUrl"]
    watch_arn = sqs.get_queue_attributes(QueueUrl=watch, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    events_client.put_rule(Name="watch", EventPattern=json.dumps({"source": ["freeinference.batch"]}))
    events_client.put_targets(Rule="watch", Targets=[{"Id": "q", "Arn": watch_arn}])

    answer = load_handler("status_events")(event("status_events-dynamodb-stream"),
                                           LambdaContext("status_events", 256, 60))

    assert answer == {"batchItemFailures": []}
    (delivery,) = sqs.receive_message(QueueUrl=harness.settings.webhook_delivery_queue_url,
                                      MaxNumberOfMessages=10)["Messages"]
    queued = json.loads(delivery["Body"])
    assert (queued["batch_id"], queued["endpoint_id"], queued["event_type"]) == (
        SAMPLE_BATCH, endpoint["id"], "batch.completed")
    (told,) = sqs.receive_message(QueueUrl=watch, MaxNumberOfMessages=10)["Messages"]
    detail = json.loads(told["Body"])["detail"]
    assert (detail["status"], detail["previous_status"]) == ("completed", "in_progress")


def test_webhook_delivery_sample_for_an_endpoint_that_does_not_exist_is_dropped(harness):
    answer = load_handler("webhook_delivery")(event("webhook_delivery-sqs"), LambdaContext("webhook_delivery", 256, 60))
    assert answer == {"batchItemFailures": []}


def _sample_event_names(properties: dict[str, Any]) -> list[str]:
    """The sample events a function must have: `<code dir>-*.json`; a schedule handler
    `<name>_handler` has `schedule-<name>.json`."""
    code_dir = Path(properties["CodeUri"]).name
    handler = properties["Handler"].partition(".")[2]
    if code_dir == "schedules":
        return [f"schedule-{handler.removesuffix('_handler')}.json"]
    return sorted(p.name for p in EVENTS.glob(f"{code_dir}-*.json"))


def test_every_function_has_a_sample_event(functions: dict[str, dict[str, Any]]) -> None:
    for logical_id, properties in functions.items():
        names = _sample_event_names(properties)
        assert names, f"{logical_id}: no events/{Path(properties['CodeUri']).name}-*.json"
        for name in names:
            assert (EVENTS / name).is_file(), f"{logical_id}: events/{name} is missing"


def test_sample_events_are_valid_json() -> None:
    samples = sorted(EVENTS.glob("*.json"))
    assert samples
    for path in samples:
        json.loads(path.read_text())


def test_api_sample_events_cover_every_route() -> None:
    covered = set()
    for path in EVENTS.glob("api-*.json"):
        event = json.loads(path.read_text())
        assert event["version"] == "2.0", path.name
        method, _, route = event["routeKey"].partition(" ")
        # An ANY route takes the methods its path does not declare (API_METHOD_REFUSALS)
        assert event["requestContext"]["http"]["method"] == method or method == "ANY", path.name
        assert event["requestContext"]["routeKey"] == event["routeKey"], path.name
        assert event["rawPath"] == event["requestContext"]["http"]["path"], path.name
        for name, value in (event.get("pathParameters") or {}).items():
            route = route.replace("{" + name + "}", value)
        assert route == event["rawPath"], f"{path.name}: pathParameters do not rebuild rawPath"
        covered.add(event["routeKey"])
    declared = {f"{method} {route}" for method, route in API_ROUTES}
    refusals = {f"{method} {route}" for method, route in API_METHOD_REFUSALS}
    assert declared <= covered and covered - declared and covered - declared <= refusals


def test_the_sample_event_of_an_undeclared_method_is_405_with_allow(harness):
    sample = event("api-method-not-allowed")
    answer = load_handler("api")(sample, LambdaContext("api", 1769, 29))
    assert answer["statusCode"] == 405 and answer["headers"]["Allow"] == "GET, POST", answer
    assert json.loads(answer["body"])["error"]["code"] == "method_not_allowed"


def test_worker_sample_event_is_an_sqs_batch() -> None:
    event = json.loads((EVENTS / "worker-sqs.json").read_text())
    (record,) = event["Records"]
    assert record["eventSource"] == "aws:sqs"
    assert set(json.loads(record["body"])) == {"batch_id", "model", "index", "position"}
