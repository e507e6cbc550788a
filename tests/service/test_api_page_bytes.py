"""Pages bounded by bytes (issue 12): no answer may pass Lambda's 6,291,456-byte response limit,
a page always carries at least one line, and a result too big for any page comes as a link."""

from __future__ import annotations

import json

import requests
from freeinference_batch.core.pages import LAMBDA_PAYLOAD_LIMIT
from freeinference_batch.store.batch_keys import request_key
from freeinference_batch.store.batch_table import BatchTable
from freeinference_batch.store.dynamo import apply_update, update_element

from tests.conftest import capture_answers, sample_request

# Non-ASCII text, inside and outside the BMP: 6 and 12 bytes a character once JSON-escaped.
TEXT = "Ünïcödé «quoted» \"text\" \\ 😀 "


def payload_bytes(answer: dict) -> int:
    """The handler's return value as Lambda measures it: serialized to JSON."""
    return len(json.dumps(answer).encode())


def completion(content: str) -> dict:
    return {"id": "chatcmpl-x", "object": "chat.completion", "model": "glm-5.3-flash",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12}}


def store_completed(harness, batch_id: str, position: int, body: dict) -> None:
    """A completed request, stored the way the worker stores one (inline or in S3 by size)."""
    table = BatchTable(harness.settings)
    response = {"status_code": 200, "request_id": f"req_{position}", "body": body}
    attributes = table.response_attributes(batch_id, position, "a-claim-token", response)
    assert apply_update(update_element(table.name, request_key(batch_id, position),
                                       "SET #status = :completed, " + ", ".join(f"{a} = :{a}" for a in attributes),
                                       "attribute_not_exists(pk)", {"#status": "status"},
                                       completed="completed", **attributes))


def read_all_results(harness, batch_id: str, answers: list[dict]) -> tuple[list[dict], list[int]]:
    lines, sizes, after = [], [], None
    while True:
        query = "?limit=1000" + (f"&after={after}" if after else "")
        status, page = harness.call("GET", f"/v1/batches/{batch_id}/results{query}")
        assert status == 200, page
        assert payload_bytes(answers[-1]) <= 5_000_000 < LAMBDA_PAYLOAD_LIMIT
        assert page["data"], "a page always carries at least one line"
        lines.extend(page["data"])
        sizes.append(len(page["data"]))
        if not page["has_more"]:
            return lines, sizes
        after = page["last_id"]


def test_a_results_page_of_big_non_ascii_completions_stops_under_budget(harness):
    # Given 30 results of 100,000-character non-ASCII completions (about 1 MB each on the wire)
    count = 30
    batch = harness.create([sample_request(f"q-{i}") for i in range(count)])
    bodies = [completion(f"{i}:" + (TEXT * 5000)[:100_000]) for i in range(count)]
    for position, body in enumerate(bodies):
        store_completed(harness, batch["id"], position, body)
    answers = capture_answers(harness)
    # When they are read with limit=1000
    lines, sizes = read_all_results(harness, batch["id"], answers)
    # Then every page stopped early under the budget, and paging returned every result once, in order
    assert len(sizes) > 1 and all(size < count for size in sizes), sizes
    assert [line["custom_id"] for line in lines] == [f"q-{i}" for i in range(count)]
    assert [line["response"]["body"] for line in lines] == bodies


def test_a_result_too_big_for_any_page_comes_as_a_link_to_its_body(harness):
    # Given a batch whose second result alone is over the page budget
    batch = harness.create([sample_request(f"q-{i}") for i in range(3)])
    huge = completion("é" * 1_000_000)  # 6 MB of JSON once escaped
    small = [completion("short answer"), completion("another")]
    store_completed(harness, batch["id"], 0, small[0])
    store_completed(harness, batch["id"], 1, huge)
    store_completed(harness, batch["id"], 2, small[1])
    answers = capture_answers(harness)
    # When the results are paged
    lines, sizes = read_all_results(harness, batch["id"], answers)
    # Then the big one starts a page (the first page stops before it), its body by a link;
    # the others are inline
    assert [line["custom_id"] for line in lines] == ["q-0", "q-1", "q-2"]
    assert sizes == [1, 2]
    linked = lines[1]["response"]
    assert linked["body"] is None and linked["body_url"].startswith("https://")
    assert lines[0]["response"]["body"] == small[0] and "body_url" not in lines[0]["response"]
    assert lines[2]["response"]["body"] == small[1]
    assert linked["status_code"] == 200 and linked["request_id"] == "req_1"
    # And the link serves the body as JSON, without an API key
    fetched = requests.get(linked["body_url"], timeout=30)
    assert fetched.status_code == 200 and fetched.headers["Content-Type"] == "application/json"
    assert fetched.json() == huge


def test_a_list_of_batches_with_big_non_ascii_metadata_stops_under_budget(harness):
    # Given 100 batches, each with 16 metadata pairs of 64- and 512-character non-ASCII strings
    harness.configure(BATCH_MAX_UNFINISHED=200)
    created = []
    for n in range(100):
        metadata = {f"{n:03d}{k:02d}" + "😀" * 59: "😀" * 512 for k in range(16)}
        created.append(harness.create([sample_request("q-0")], metadata=metadata)["id"])
    answers = capture_answers(harness)
    # When listed 100 at a time
    seen, sizes, after = [], [], None
    while True:
        status, page = harness.call("GET", "/v1/batches?limit=100" + (f"&after={after}" if after else ""))
        assert status == 200, page
        assert payload_bytes(answers[-1]) <= 5_000_000 and page["data"]
        seen.extend(b["id"] for b in page["data"])
        sizes.append(len(page["data"]))
        if not page["has_more"]:
            break
        after = page["last_id"]
    # Then pages stopped early, and every batch came once, newest first
    assert len(sizes) > 1 and all(size < 100 for size in sizes), sizes
    assert seen == created[::-1]
