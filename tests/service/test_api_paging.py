"""Pages of results and of the batch list, on moto: results in submission order and batches newest
first, as the spec shows them, by `limit` (default and given) and `after`, at any scale; ids
ordered by time, and `after` cursors that outlive their anchor (issue 12)."""

from __future__ import annotations

import re

import pytest
from freeinference_batch.ops import schedules

from tests.conftest import sample_request
from tests.service.helpers import assert_batch_object, body_with, other_key, req

RESULT_FIELDS = {"id", "custom_id", "status", "response", "error"}


def create_many(harness, count: int, key: str | None = None, **extra) -> list[str]:
    ids = []
    for _ in range(count):
        status, batch = harness.call("POST", "/v1/batches", {"requests": [sample_request("q-0")], **extra}, key=key)
        assert status == 200, batch
        ids.append(batch["id"])
    return ids


def page_all(harness, limit: int, key: str | None = None) -> tuple[list[str], list[int]]:
    seen, sizes, after = [], [], None
    while True:
        query = f"?limit={limit}" + (f"&after={after}" if after else "")
        status, page = harness.call("GET", f"/v1/batches{query}", key=key)
        assert status == 200, page
        seen.extend(b["id"] for b in page["data"])
        sizes.append(len(page["data"]))
        if not page["has_more"]:
            return seen, sizes
        after = page["last_id"]


def test_ids_are_time_ordered_and_well_formed(harness):
    # Given two batches created a moment apart
    first, second = create_many(harness, 2)
    # Then both are batch_ + 32 hex digits, and the later one sorts after the earlier one
    for batch_id in (first, second):
        assert re.fullmatch(r"batch_[0-9a-f]{32}", batch_id), batch_id
    assert first[6:20] <= second[6:20]
    assert int(first[6:20], 16) // 1_000_000 == harness.batch(first)["created_at"]


def test_listing_250_batches_pages_through_every_one_newest_first(harness):
    # Given an account with 250 batches (more than one BatchGetItem may read)
    harness.configure(BATCH_MAX_UNFINISHED=300)
    created = create_many(harness, 250)
    newest_first = created[::-1]
    # When listed with the largest limit, and with another one
    for limit in (100, 37):
        seen, sizes = page_all(harness, limit)
        # Then every batch comes once, newest first, in full pages
        assert seen == newest_first, limit
        assert all(size == limit for size in sizes[:-1]), sizes


def test_a_cursor_whose_batch_was_deleted_or_purged_keeps_working(harness):
    harness.configure(BATCH_MAX_UNFINISHED=50)
    created = create_many(harness, 12)
    newest_first = created[::-1]
    # Given a first page of 4
    status, page = harness.call("GET", "/v1/batches?limit=4")
    assert status == 200 and page["last_id"] == newest_first[3], page
    anchor = page["last_id"]
    # When its last batch is deleted before the next page is asked for
    assert harness.call("DELETE", f"/v1/batches/{anchor}")[0] == 200
    status, second = harness.call("GET", f"/v1/batches?limit=4&after={anchor}")
    # Then the next page continues right after where it stood
    assert status == 200, second
    assert [b["id"] for b in second["data"]] == newest_first[4:8]
    # And when that page's anchor is deleted and purged altogether
    anchor = second["last_id"]
    assert harness.call("DELETE", f"/v1/batches/{anchor}")[0] == 200
    assert schedules.purge(harness.settings)["purged"] >= 1
    assert _meta_gone(harness, anchor)
    status, third = harness.call("GET", f"/v1/batches?limit=4&after={anchor}")
    assert status == 200, third
    assert [b["id"] for b in third["data"]] == newest_first[8:12]
    assert third["has_more"] is False


def _meta_gone(harness, batch_id: str) -> bool:
    from freeinference_batch.store.batch_table import BatchTable

    return BatchTable(harness.settings).get_meta(batch_id) is None


def test_another_accounts_id_as_cursor_only_gives_a_time_in_your_own_list(harness):
    from freeinference_batch import accounts

    stranger = accounts.create_key(harness.settings, "acct-stranger", tier="internal")
    harness.configure(BATCH_MAX_UNFINISHED=50)
    older = create_many(harness, 3)
    theirs = create_many(harness, 1, key=stranger)[0]
    newer = create_many(harness, 3)
    # When the owner pages after the stranger's batch id
    status, page = harness.call("GET", f"/v1/batches?limit=100&after={theirs}")
    # Then the owner's own batches older than it come, and nothing of the stranger's
    assert status == 200, page
    assert [b["id"] for b in page["data"]] == older[::-1]
    assert theirs not in str(page) and all(b not in str(page) for b in newer)


def test_malformed_after_is_still_400(harness):
    create_many(harness, 1)
    for value in ("garbage", "batch_" + "0" * 31, "batch_" + "G" * 32, "batch_req_1000"):
        status, answer = harness.call("GET", f"/v1/batches?after={value}")
        assert status == 400, (value, answer)
        assert "after" in answer["error"]["message"] and answer["error"]["param"] == "after"


@pytest.mark.usefixtures("one_worker_thread")
def test_results_page_in_submission_order(harness):
    # Given a batch mixing two models and a request that fails, run to the end
    lines = [
        req(
            f"q-{i}",
            body=body_with(
                model="glm-5.3-flash" if i % 2 else "qwen3.6-35b",
                messages=[{"role": "user", "content": f"Question {i}"}],
            ),
        )
        for i in range(5)
    ]
    lines[3]["body"]["messages"][0]["content"] = "Question 3 [sim:status=400]"
    batch = harness.create(lines)
    # Before running, every request is listed, queued
    status, page = harness.call("GET", f"/v1/batches/{batch['id']}/results")
    assert status == 200, page
    assert [r["custom_id"] for r in page["data"]] == [f"q-{i}" for i in range(5)]
    assert all(r["status"] == "queued" and r["response"] is None for r in page["data"])
    harness.run_to_final(batch["id"])
    # When paged two at a time
    pages, after = [], None
    while True:
        query = "?limit=2" + (f"&after={after}" if after else "")
        status, page = harness.call("GET", f"/v1/batches/{batch['id']}/results{query}")
        assert status == 200, page
        assert set(page) == {"object", "data", "has_more", "first_id", "last_id"}
        assert page["object"] == "list"
        assert page["first_id"] == page["data"][0]["id"] and page["last_id"] == page["data"][-1]["id"]
        pages.append(page)
        if not page["has_more"]:
            break
        after = page["last_id"]
    # Then the pages are 2, 2, 1 long, in submission order, with the spec's result lines
    assert [len(p["data"]) for p in pages] == [2, 2, 1]
    assert [p["has_more"] for p in pages] == [True, True, False]
    lines_read = [r for p in pages for r in p["data"]]
    assert [r["custom_id"] for r in lines_read] == [f"q-{i}" for i in range(5)]
    numbers = [int(re.fullmatch(r"batch_req_(\d+)", r["id"]).group(1)) for r in lines_read]
    assert numbers == sorted(numbers) and len(set(numbers)) == 5
    for index, line in enumerate(lines_read):
        assert set(line) == RESULT_FIELDS
        if index == 3:
            assert line["status"] == "failed" and line["response"] is None
            assert line["error"]["code"] == "invalid_request" and line["error"]["status"] == 400
        else:
            assert line["status"] == "completed" and line["error"] is None
            assert line["response"]["status_code"] == 200 and isinstance(line["response"]["request_id"], str)
            assert line["response"]["body"]["object"] == "chat.completion"
    # And the whole set in one page reads the same
    status, whole = harness.call("GET", f"/v1/batches/{batch['id']}/results?limit=1000")
    assert whole["data"] == lines_read and whole["has_more"] is False
    # After the last id there is an empty last page
    status, empty = harness.call("GET", f"/v1/batches/{batch['id']}/results?after={lines_read[-1]['id']}")
    assert status == 200 and empty["data"] == [] and empty["has_more"] is False, empty


def test_results_default_limit_is_100(harness):
    batch = harness.create([req(f"q-{i}") for i in range(130)])
    status, page = harness.call("GET", f"/v1/batches/{batch['id']}/results")
    assert status == 200 and len(page["data"]) == 100 and page["has_more"] is True
    status, rest = harness.call("GET", f"/v1/batches/{batch['id']}/results?after={page['last_id']}")
    assert [r["custom_id"] for r in page["data"] + rest["data"]] == [f"q-{i}" for i in range(130)]
    assert rest["has_more"] is False


def test_list_is_newest_first_with_limit_and_after(harness):
    harness.configure(BATCH_MAX_UNFINISHED=30)
    key = other_key(harness, "acct-lister")
    created = [harness.call("POST", "/v1/batches", {"requests": [req()]}, key=key)[1]["id"] for _ in range(23)]
    newest_first = created[::-1]
    # Default limit 20
    status, page = harness.call("GET", "/v1/batches", key=key)
    assert status == 200, page
    assert [b["id"] for b in page["data"]] == newest_first[:20]
    assert page["has_more"] is True and page["first_id"] == newest_first[0] and page["last_id"] == newest_first[19]
    for batch in page["data"]:
        assert_batch_object(batch)
    # Paging by limit and after
    seen, after = [], None
    while True:
        query = "?limit=7" + (f"&after={after}" if after else "")
        status, page = harness.call("GET", f"/v1/batches{query}", key=key)
        assert status == 200, page
        seen.extend(b["id"] for b in page["data"])
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert seen == newest_first
    # A deleted batch leaves the list
    assert harness.call("DELETE", f"/v1/batches/{created[5]}", key=key)[0] == 200
    status, page = harness.call("GET", "/v1/batches?limit=100", key=key)
    assert [b["id"] for b in page["data"]] == [b for b in newest_first if b != created[5]]
