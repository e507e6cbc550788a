"""Idempotent create: the Idempotency-Key header (issue 12)."""

from __future__ import annotations

import gzip
import json

from freeinference_batch import accounts
from freeinference_batch.batches import idempotency
from freeinference_batch.core import aws
from freeinference_batch.store import accounts_table

from tests.conftest import capture_answers, sample_request

BODY = {"requests": [sample_request("q-0"), sample_request("q-1")], "metadata": {"job": "j-1"}}


def create(harness, key_header: str | None, body: dict = BODY, *, api_key: str | None = None,
           gzipped: bool = False) -> tuple[int, dict, dict]:
    """(status, body, headers) of a create with that Idempotency-Key."""
    original = harness.api_handler
    answers = capture_answers(harness)
    try:
        headers = {} if key_header is None else {"Idempotency-Key": key_header}
        raw = json.dumps(body).encode()
        if gzipped:
            raw, headers["content-encoding"] = gzip.compress(raw), "gzip"
        status, answer = harness.call("POST", "/v1/batches", raw=raw, headers=headers, key=api_key)
    finally:
        harness.api_handler = original
    return status, answer, answers[-1].get("headers") or {}


def batch_ids_stored(harness) -> set[str]:
    """Every batch id with any item in the batch table (a half-stored loser would show here)."""
    items = aws.dynamodb().scan(TableName=harness.settings.batch_table_name)["Items"]
    return {i["pk"]["S"].removeprefix("BATCH#") for i in items if i["pk"]["S"].startswith("BATCH#")}


def unfinished(harness, account: str = "acct-1") -> int:
    return int(accounts_table.get_account(harness.settings, account).get("unfinished", 0))


def test_the_same_key_and_body_answers_the_original_batch(harness):
    harness.configure(BATCH_MAX_UNFINISHED=1)  # a second batch would be refused: the replay must not be one
    status, first, headers = create(harness, "job-1")
    assert status == 200 and "Idempotent-Replayed" not in headers, first
    # When the client retries with the same key and body, even gzipped this time
    for gzipped in (False, True):
        status, again, headers = create(harness, "job-1", gzipped=gzipped)
        # Then the original answer comes back, marked as a replay, and no second batch exists
        assert status == 200, again
        assert again == first and headers.get("Idempotent-Replayed") == "true"
    assert [b["id"] for b in harness.call("GET", "/v1/batches")[1]["data"]] == [first["id"]]
    assert batch_ids_stored(harness) == {first["id"]} and unfinished(harness) == 1
    # And a create without a key, or with another key, is a new batch (here: over the limit)
    assert create(harness, "job-2")[0] == 429
    assert create(harness, None)[0] == 429


def test_the_same_key_with_another_body_is_422(harness):
    status, first, _ = create(harness, "job-1")
    assert status == 200
    other = {**BODY, "metadata": {"job": "j-2"}}
    status, error, _ = create(harness, "job-1", other)
    assert status == 422, error
    assert error["error"]["code"] == "idempotency_key_reused" and error["error"]["param"] == "Idempotency-Key"
    assert "Idempotency-Key" in error["error"]["message"] and "different body" in error["error"]["message"]
    assert batch_ids_stored(harness) == {first["id"]} and unfinished(harness) == 1


def test_bad_keys_are_400_and_store_nothing(harness):
    for bad in ("", "x" * 256, "café", "tab\there", "nul\x00"):
        status, error, _ = create(harness, bad)
        assert status == 400, (bad, error)
        assert error["error"]["code"] == "invalid_idempotency_key"
        assert "255 printable ASCII" in error["error"]["message"]
    assert batch_ids_stored(harness) == set() and unfinished(harness) == 0
    # The bounds are fine
    assert create(harness, "x" * 255)[0] == 200
    assert create(harness, " ~")[0] == 200


def test_keys_are_per_account(harness):
    stranger = accounts.create_key(harness.settings, "acct-stranger", tier="internal")
    other_stranger = accounts.create_key(harness.settings, "acct-other", tier="internal")
    status, mine, _ = create(harness, "shared-key")
    assert status == 200
    # Another account's identical key and body is unrelated: a batch of its own
    status, theirs, headers = create(harness, "shared-key", api_key=stranger)
    assert status == 200 and "Idempotent-Replayed" not in headers and theirs["id"] != mine["id"]
    # With another body too: not 422, and nothing said about my batch
    status, third, _ = create(harness, "shared-key", {**BODY, "metadata": {"x": "y"}}, api_key=other_stranger)
    assert status == 200 and third["id"] not in (mine["id"], theirs["id"]), third
    assert mine["id"] not in json.dumps(third)


def test_a_key_is_forgotten_after_24_hours(harness):
    status, first, _ = create(harness, "job-1")
    harness.advance_clock(idempotency.WINDOW_SECONDS - 60)
    assert create(harness, "job-1")[1]["id"] == first["id"]  # still remembered
    harness.advance_clock(61)  # now the record is expired, though TTL has not removed it
    status, second, headers = create(harness, "job-1")
    assert status == 200 and second["id"] != first["id"] and "Idempotent-Replayed" not in headers


def test_two_concurrent_creates_with_one_key_store_one_batch(harness, monkeypatch):
    # Given a create that read "no record" just before another create with the key committed
    status, winner, _ = create(harness, "job-1")
    assert status == 200
    real_replay = idempotency.replay
    calls: list[int] = []

    def raced(settings, key, now):
        calls.append(1)
        return None if len(calls) == 1 else real_replay(settings, key, now)

    monkeypatch.setattr(idempotency, "replay", raced)
    # When it commits: its record's condition fails in the same transaction as its batch
    status, loser, headers = create(harness, "job-1")
    # Then it answers the winner's batch, and left nothing of its own behind
    assert status == 200 and loser == winner and headers.get("Idempotent-Replayed") == "true", loser
    assert batch_ids_stored(harness) == {winner["id"]} and unfinished(harness) == 1
