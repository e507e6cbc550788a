"""What a retry refuses, and how it is counted (issue 33): a parent not final (409), nothing that
matches (400), another account's batch (404), a bad body (400), a model gone since (400), the
account's limit of unfinished batches (429); and `Idempotency-Key` as on create. A refusal
stores nothing."""

from __future__ import annotations

import json

import pytest
from freeinference_batch import accounts
from freeinference_batch.core.catalog import load_catalog
from freeinference_batch.store import accounts_table

from tests.conftest import sample_request
from tests.service.batches.retry_helpers import failing, finished, meta_item, retry, stored_batch_ids
from tests.service.helpers import ERROR_FIELDS, other_key


def refused(harness, batch_id: str, status: int, code: str, *fragments: str, body=None, raw=None, **kwargs) -> dict:
    """A retry refused with `status` and `code` in the API's error shape, its message naming each
    fragment; nothing stored by it."""
    before = stored_batch_ids(harness)
    got, answer, _ = retry(harness, batch_id, body, raw=raw, **kwargs)
    assert got == status, answer
    error = answer["error"]
    assert set(error) == ERROR_FIELDS and error["code"] == code, error
    for fragment in fragments:
        assert fragment in error["message"], (fragment, error["message"])
    assert stored_batch_ids(harness) == before
    return error


def unfinished(harness, account: str = "acct-1") -> int:
    return int(accounts_table.get_account(harness.settings, account).get("unfinished", 0))


def test_a_batch_that_has_not_finished_is_not_retried(harness):
    running = harness.create([sample_request("q-0")])
    error = refused(harness, running["id"], 409, "batch_not_final", running["id"], "is validating",
                    "only a finished batch")
    assert error["type"] == "conflict_error"
    assert harness.batch(running["id"]) == running


def test_a_retry_with_nothing_to_take_names_the_statuses(harness):
    parent = finished(harness, [sample_request("q-0"), sample_request("q-1")])
    error = refused(harness, parent["id"], 400, "nothing_to_retry", parent["id"], "failed or expired",
                    "nothing to retry")
    assert error["param"] == "statuses"
    refused(harness, parent["id"], 400, "nothing_to_retry", "cancelled", body={"statuses": ["cancelled"]})


def test_another_accounts_batch_and_a_missing_one_read_as_not_found(harness):
    parent = finished(harness, [failing("q-0")])
    stranger = other_key(harness, "acct-2")
    error = refused(harness, parent["id"], 404, "batch_not_found", parent["id"], key=stranger)
    # Exactly as the batch reads to that account
    assert harness.call("GET", f"/v1/batches/{parent['id']}", key=stranger)[1]["error"] == error
    refused(harness, "batch_" + "0" * 32, 404, "batch_not_found", "not found")
    refused(harness, "not-a-batch", 404, "batch_not_found", "'not-a-batch' not found")


@pytest.mark.parametrize(("body", "raw", "fragments", "param"), [
    ({"statuses": ["failed", "queued"]}, None, ["Unsupported statuses: 'queued'", "failed, expired, cancelled, "
                                               "completed"], "statuses"),
    ({"statuses": []}, None, ["Invalid body: statuses:"], "statuses"),
    ({"statuses": "failed"}, None, ["Invalid body: statuses:"], "statuses"),
    ({"statuses": [1]}, None, ["Invalid body: statuses.0:"], "statuses.0"),
    ({"status": ["failed"]}, None, ["Invalid body: status: Extra inputs are not permitted"], "status"),
    ({"metadata": {"k": 1}}, None, ["Invalid body: metadata.k:"], "metadata.k"),
    ({"metadata": {"": "v"}}, None, ["metadata keys must not be empty"], "metadata"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, None, ["metadata holds 17 pairs"], "metadata"),
    (None, b"[]", ["The body must be a JSON object"], None),
    (None, b"{not json", ["The body is not valid JSON"], None),
])
def test_a_bad_body_is_refused_naming_what_is_wrong(harness, body, raw, fragments, param):
    parent = finished(harness, [failing("q-0")])
    error = refused(harness, parent["id"], 400, "invalid_request", *fragments, body=body, raw=raw)
    assert error["param"] == param


def test_a_body_larger_than_two_fields_need_is_413(harness):
    parent = finished(harness, [failing("q-0")])
    raw = json.dumps({"metadata": {"k": "v"}, "padding": "x" * 300_000}).encode()
    error = refused(harness, parent["id"], 413, "payload_too_large", "at most 262144 bytes", raw=raw)
    assert "Split" not in error["message"]


def test_a_model_gone_since_refuses_the_retry_naming_the_request_by_its_place_in_the_parent(harness, tmp_path):
    parent = finished(harness, [failing("q-0"), sample_request("q-1"), failing("q-2", model="qwen3.6-35b")])
    # When the account's tier may no longer use qwen3.6-35b
    catalog = json.loads(load_catalog().model_dump_json())
    catalog["models"]["qwen3.6-35b"]["tiers"] = ["standard"]
    path = tmp_path / "models.json"
    path.write_text(json.dumps(catalog))
    harness.configure(MODEL_CATALOG_PATH=str(path))
    # Then the retry is refused as a create naming it would be, the request named where the parent had it
    error = refused(harness, parent["id"], 400, "model_not_found")
    assert error["message"] == "requests[2] (custom_id 'q-2'): Model 'qwen3.6-35b' not found"
    # And retrying what the tier may still use is a batch as before
    status, child, _ = retry(harness, parent["id"], {"statuses": ["completed"]})
    assert status == 200 and child["request_counts"]["total"] == 1, child


def test_an_account_that_may_no_longer_create_batches_may_not_retry_them(harness):
    parent = finished(harness, [failing("q-0")])
    accounts.set_account(harness.settings, "acct-1", tier="standard")
    refused(harness, parent["id"], 403, "forbidden", "internal accounts only")


def test_the_child_counts_toward_the_unfinished_limit(harness):
    harness.configure(BATCH_MAX_UNFINISHED=2)
    parent = finished(harness, [failing("q-0"), failing("q-1")])
    assert unfinished(harness) == 0
    # When the final parent is retried, the child is one unfinished batch
    status, child, _ = retry(harness, parent["id"])
    assert status == 200, child
    assert unfinished(harness) == 1
    other = harness.create([sample_request("x-0")])
    assert unfinished(harness) == 2
    # Then a third, create or retry, is over the limit, and stores nothing
    refused(harness, parent["id"], 429, "too_many_unfinished_batches", "2 unfinished batches")
    assert unfinished(harness) == 2
    # And once the child is cancelled there is room again
    harness.call("POST", f"/v1/batches/{child['id']}/cancel")
    harness.call("POST", f"/v1/batches/{other['id']}/cancel")
    assert unfinished(harness) == 0
    assert retry(harness, parent["id"])[0] == 200


def test_the_same_idempotency_key_answers_the_same_child(harness):
    harness.configure(BATCH_MAX_UNFINISHED=1)  # a second child would be refused: the replay must not be one
    parent = finished(harness, [failing("q-0"), sample_request("q-1"), failing("q-2")])
    other = finished(harness, [failing("o-0")])
    parent_item = meta_item(harness, parent["id"])
    status, child, headers = retry(harness, parent["id"], {"statuses": ["failed"]}, idempotency_key="retry-1")
    assert status == 200 and "Idempotent-Replayed" not in headers, child
    # When the client sends it again, the original answer comes back, marked, and no second child
    status, again, headers = retry(harness, parent["id"], {"statuses": ["failed"]}, idempotency_key="retry-1")
    assert status == 200 and again == child and headers.get("Idempotent-Replayed") == "true"
    assert unfinished(harness) == 1 and meta_item(harness, parent["id"]) == parent_item
    # The same key with another body, or for another parent, is another request: 422
    refused(harness, parent["id"], 422, "idempotency_key_reused", child["id"], body={"statuses": ["completed"]},
            idempotency_key="retry-1")
    refused(harness, other["id"], 422, "idempotency_key_reused", idempotency_key="retry-1",
            body={"statuses": ["failed"]})
    # A key that is not 1-255 printable ASCII characters is refused as on create
    refused(harness, parent["id"], 400, "invalid_idempotency_key", "Idempotency-Key", idempotency_key="")
