"""Retrying a finished batch on moto (issue 33): the child holds exactly the parent's requests in
the statuses asked for, bodies and order kept; it runs as a batch of its own; the parent is only
read; and deleting either leaves the other whole."""

from __future__ import annotations

import base64
import os

from freeinference_batch.core import aws
from freeinference_batch.store import caches

from tests.conftest import sample_request
from tests.service.batches.retry_helpers import (
    body_of,
    failing,
    finished,
    meta_item,
    new_gate,
    retry,
    stored_requests,
)
from tests.service.helpers import assert_batch_object, run_schedule


def test_a_retry_holds_the_failed_requests_with_their_bodies_in_the_parents_order(harness):
    # Given a finished batch on two models whose 2nd, 4th and 5th requests were refused
    lines = [sample_request("q-0"), failing("q-1"), sample_request("q-2", model="qwen3.6-35b"),
             failing("q-3", model="qwen3.6-35b", max_tokens=20), failing("q-4", temperature=0.25)]
    parent = finished(harness, lines, metadata={"project": "eval-42"})
    assert parent["status"] == "completed" and parent["request_counts"]["failed"] == 3
    parent_item, parent_results = meta_item(harness, parent["id"]), harness.results(parent["id"])
    # When it is retried with no body
    status, child, headers = retry(harness, parent["id"])
    # Then the answer is a new batch, as create answers one, linked to its parent
    assert status == 200, child
    assert_batch_object(child)
    assert "Idempotent-Replayed" not in headers
    assert child["id"] != parent["id"] and child["retry_of"] == parent["id"] and parent["retry_of"] is None
    assert child["status"] == "validating" and child["request_counts"] == {"total": 3, "completed": 0, "failed": 0}
    assert child["metadata"] == {"project": "eval-42"}  # the parent's, when the body names none
    assert harness.batch(child["id"]) == child
    # And it holds exactly the failed requests: same custom_ids, models and body bytes, in order
    wanted = [lines[1], lines[3], lines[4]]
    assert stored_requests(harness, child["id"]) == [
        (line["custom_id"], line["body"]["model"], body_of(line)) for line in wanted]
    assert [line["custom_id"] for line in harness.results(child["id"])] == ["q-1", "q-3", "q-4"]
    # And the parent is exactly as it was
    assert meta_item(harness, parent["id"]) == parent_item
    assert harness.batch(parent["id"]) == parent and harness.results(parent["id"]) == parent_results


def test_the_child_runs_as_a_batch_of_its_own_and_completes_what_failed(harness, upstream):
    # Given a batch whose requests failed while the upstream refused them, since fixed
    gate = new_gate()
    parent = finished(harness, [failing("q-0", gate), sample_request("q-1"), failing("q-2", gate)])
    assert parent["request_counts"] == {"total": 3, "completed": 1, "failed": 2}
    upstream[0].open_gate(gate)
    # When its failures are retried and the child runs
    status, child, _ = retry(harness, parent["id"], {"statuses": ["failed"]})
    assert status == 200, child
    final = harness.run_to_final(child["id"])
    # Then the child completes both, in the parent's order, and the parent still shows its failures
    assert final["status"] == "completed" and final["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
    assert final["retry_of"] == parent["id"] and final["cost_usd"] > 0
    results = harness.results(child["id"])
    assert [(r["custom_id"], r["status"]) for r in results] == [("q-0", "completed"), ("q-2", "completed")]
    assert [r["status"] for r in harness.results(parent["id"])] == ["failed", "completed", "failed"]


def test_statuses_choose_the_requests_and_metadata_may_be_replaced_or_dropped(harness):
    parent = finished(harness, [sample_request("q-0"), failing("q-1"), sample_request("q-2")],
                      metadata={"project": "eval-42"})
    # Completed ones alone
    status, done, _ = retry(harness, parent["id"], {"statuses": ["completed"], "metadata": {"run": "2"}})
    assert status == 200, done
    assert [r["custom_id"] for r in harness.results(done["id"])] == ["q-0", "q-2"]
    assert done["metadata"] == {"run": "2"}
    # Every status, named in any order and twice: each request once, in the parent's order
    status, every, _ = retry(harness, parent["id"],
                             {"statuses": ["completed", "failed", "completed"], "metadata": None})
    assert status == 200, every
    assert [r["custom_id"] for r in harness.results(every["id"])] == ["q-0", "q-1", "q-2"]
    assert every["metadata"] is None


def test_a_cancelled_batch_retries_its_cancelled_requests_and_an_expired_one_its_expired(harness):
    harness.configure(BATCH_MAX_UNFINISHED=5)
    # Given a batch cancelled before anything ran
    cancelled = harness.create([sample_request("c-0"), sample_request("c-1")])
    status, answer = harness.call("POST", f"/v1/batches/{cancelled['id']}/cancel")
    assert status == 200 and answer["status"] == "cancelled", answer
    # Then its requests are cancelled, which the default (failed and expired) does not take
    status, refused, _ = retry(harness, cancelled["id"])
    assert status == 400 and refused["error"]["code"] == "nothing_to_retry", refused
    status, child, _ = retry(harness, cancelled["id"], {"statuses": ["cancelled"]})
    assert status == 200 and child["request_counts"]["total"] == 2, child
    # Given a batch whose window closed before its requests started
    late = harness.create([sample_request("e-0"), sample_request("e-1"), sample_request("e-2")])
    harness.advance_clock(86400 + 1)
    run_schedule("expire")
    assert harness.batch(late["id"])["status"] == "expired"
    # Then the default retry takes every expired request, into a window of its own from now
    status, child, _ = retry(harness, late["id"])
    assert status == 200, child
    assert [r["custom_id"] for r in harness.results(child["id"])] == ["e-0", "e-1", "e-2"]
    assert child["status"] == "validating" and child["expires_at"] > harness.batch(late["id"])["expires_at"]


def test_a_retry_of_a_retry_names_its_own_parent(harness):
    first = finished(harness, [failing("q-0"), sample_request("q-1")])
    second = harness.run_to_final(retry(harness, first["id"])[1]["id"])
    status, third, _ = retry(harness, second["id"])
    assert status == 200, third
    assert (second["retry_of"], third["retry_of"]) == (first["id"], second["id"])
    assert [r["custom_id"] for r in harness.results(third["id"])] == ["q-0"]


def test_deleting_the_parent_leaves_the_child_whole_and_a_large_body_its_own_copy(harness, upstream):
    # Given a failed request whose body is too big for an item (it is stored in S3)
    gate = new_gate()
    large = failing("big", gate)
    large["body"]["messages"].append({"role": "user", "content": base64.b64encode(os.urandom(400_000)).decode()})
    parent = finished(harness, [sample_request("q-0"), large])
    status, child, _ = retry(harness, parent["id"])
    assert status == 200, child
    assert stored_requests(harness, child["id"]) == [("big", "glm-5.3-flash", body_of(large))]
    s3 = aws.s3()
    bucket = harness.settings.payload_bucket_name
    assert s3.list_objects_v2(Bucket=bucket, Prefix=f"{child['id']}/input/")["KeyCount"] == 1
    # When the parent is deleted and purged
    status, _ = harness.call("DELETE", f"/v1/batches/{parent['id']}")
    assert status == 200
    run_schedule("purge")
    assert s3.list_objects_v2(Bucket=bucket, Prefix=f"{parent['id']}/")["KeyCount"] == 0
    assert harness.call("GET", f"/v1/batches/{parent['id']}")[0] == 404
    # Then the child still reads, and runs its large request from its own copy
    caches.chunks.clear()
    upstream[0].open_gate(gate)
    final = harness.run_to_final(child["id"])
    assert final["status"] == "completed" and final["request_counts"]["completed"] == 1, final
    assert final["retry_of"] == parent["id"]  # the link stays: the client says the parent is gone


def test_deleting_the_child_leaves_the_parent_whole(harness):
    parent = finished(harness, [failing("q-0"), sample_request("q-1")])
    before = (meta_item(harness, parent["id"]), harness.results(parent["id"]), stored_requests(harness, parent["id"]))
    status, child, _ = retry(harness, parent["id"])
    assert status == 200, child
    status, _ = harness.call("POST", f"/v1/batches/{child['id']}/cancel")
    assert status == 200
    status, _ = harness.call("DELETE", f"/v1/batches/{child['id']}")
    assert status == 200
    run_schedule("purge")
    assert harness.call("GET", f"/v1/batches/{child['id']}")[0] == 404
    assert (meta_item(harness, parent["id"]), harness.results(parent["id"]),
            stored_requests(harness, parent["id"])) == before
