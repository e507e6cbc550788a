"""Every function's handler, driven by its sample event from events/ (as `sam local invoke` would)."""

from __future__ import annotations

import json

from freeinference_batch import accounts
from freeinference_batch_local.handlers import LambdaContext, load_handler, repo_root

SAMPLE_KEY = "hyi-sample-key"
SAMPLE_BATCH = "batch_0123456789abcdef0123456789abcdef"


def event(name: str) -> dict:
    return json.loads((repo_root() / "events" / f"{name}.json").read_text())


def invoke_api(name: str, query: dict | None = None, **path: str) -> tuple[int, dict]:
    sample = event(name)
    if query is not None:
        sample["queryStringParameters"] = query
        sample["rawQueryString"] = "&".join(f"{k}={v}" for k, v in query.items())
    if path:
        sample["pathParameters"] = path
        sample["rawPath"] = sample["rawPath"].replace(SAMPLE_BATCH, path["batch_id"])
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
