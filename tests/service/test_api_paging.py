"""Listing batches at any scale, and `after` cursors that outlive their anchor (issue 12)."""

from __future__ import annotations

import re

from freeinference_batch.ops import schedules

from tests.conftest import sample_request


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
