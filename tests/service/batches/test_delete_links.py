"""A deleted batch's result links stop working at once (issue 21): delete removes the stored
responses whose presigned links it gave out, bounded in time, and the purge deletes whatever a
delete of a very large batch left."""

from __future__ import annotations

import requests
from freeinference_batch.batches import operations
from freeinference_batch.core import aws
from freeinference_batch.store import objects

from tests.conftest import sample_request
from tests.service.helpers import completion, run_schedule, store_completed


def stored_responses(harness, batch_id: str) -> list[str]:
    answer = aws.s3().list_objects_v2(Bucket=harness.settings.payload_bucket_name, Prefix=f"{batch_id}/responses/")
    return [o["Key"] for o in answer.get("Contents", [])]


def linked_batch(harness, count: int) -> tuple[str, list[str]]:
    """A finished-looking batch of `count` results too big for any page: each a link to S3."""
    batch = harness.create([sample_request(f"q-{i}") for i in range(count)])
    for position in range(count):
        store_completed(harness, batch["id"], position, completion(f"{position}:" + "é" * 1_000_000))
    links = [line["response"]["body_url"] for line in harness.results(batch["id"])]
    assert all(links) and len(stored_responses(harness, batch["id"])) == count
    return batch["id"], links


def test_a_deleted_batchs_result_links_stop_working_at_once(harness):
    # Given a batch whose result is given as a presigned link, which works
    batch_id, (link,) = linked_batch(harness, 1)
    assert requests.get(link, timeout=30).status_code == 200
    # When the batch is deleted
    status, body = harness.call("DELETE", f"/v1/batches/{batch_id}")
    assert status == 200 and body["deleted"] is True
    # Then the link no longer serves the body, well before its hour is up, and nothing is left in S3
    fetched = requests.get(link, timeout=30)
    assert fetched.status_code in (403, 404) and "é" not in fetched.text
    assert stored_responses(harness, batch_id) == []


def test_a_delete_goes_through_every_page_of_stored_responses(harness, monkeypatch):
    # Given S3 listings of 2 keys a page (1,000 on AWS) and 5 stored responses
    monkeypatch.setattr(objects, "S3_KEYS_PER_CALL", 2)
    batch_id, links = linked_batch(harness, 5)
    # When the batch is deleted, every page is deleted
    assert harness.call("DELETE", f"/v1/batches/{batch_id}")[0] == 200
    assert stored_responses(harness, batch_id) == []
    assert all(requests.get(link, timeout=30).status_code in (403, 404) for link in links)


def test_a_delete_out_of_time_answers_and_leaves_the_rest_to_the_purge(harness, monkeypatch):
    # Given a delete with no time to spend on S3 (a batch of tens of thousands of stored responses)
    monkeypatch.setattr(objects, "S3_KEYS_PER_CALL", 2)
    monkeypatch.setattr(operations, "DELETE_RESPONSES_SECONDS", 0.0)
    batch_id, _ = linked_batch(harness, 5)
    # When it is deleted, it answers at once (the first page deleted), and the batch is gone
    assert harness.call("DELETE", f"/v1/batches/{batch_id}")[0] == 200
    assert harness.call("GET", f"/v1/batches/{batch_id}")[0] == 404
    assert 0 < len(stored_responses(harness, batch_id)) < 5
    # And the purge, due at once, deletes what is left
    run_schedule("purge")
    assert stored_responses(harness, batch_id) == []
