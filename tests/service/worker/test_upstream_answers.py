"""Answers of the upstream that are not a chat completion to keep as they are, on moto: one that
is not a JSON object or too large to keep is a server error, retried like a 5xx, then
`upstream_error`; one whose objects have empty keys (which DynamoDB refuses as names) is stored
and read back whole.
"""

from __future__ import annotations

import json

import pytest
from freeinference_batch.core.catalog import load_catalog
from freeinference_batch.worker import Done, Parked, Worker
from freeinference_batch.worker import upstream as upstream_client

from tests.conftest import sample_request
from tests.service.worker.helpers import MODEL, NO_RECORD, message_for, meta_of, state_of, usage_today


@pytest.mark.parametrize(("answer", "charged"), [
    (b'{"object":"chat.completion","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7},"score":NaN}',
     True),
    (b"<html>Bad gateway</html>", False),
    (b'["not", "an", "object"]', False),
    (b"", False),
])
def test_an_answer_that_is_not_a_json_object_is_a_server_error_retried_then_upstream_error(
        harness, stub, answer, charged):
    # Given an upstream whose 200 answer is not a JSON object (not a chat completion), and 3 attempts
    harness.configure(BATCH_MAX_ATTEMPTS="3")
    stub.answer = answer
    batch = harness.create([sample_request("q-0", "Hello")])
    message = message_for(harness, batch["id"], 0)
    # When the request runs: it is retried like a 5xx, showing what went wrong meanwhile
    for attempt in (1, 2):
        assert isinstance(Worker(harness.settings).process(message, NO_RECORD), Parked)
        state = state_of(harness, batch["id"], 0)
        assert (state["status"], state["attempts"]) == ("queued", attempt)
        line = harness.results(batch["id"])[0]
        assert line["status"] == "queued" and line["error"]["code"] == "upstream_error"
    assert isinstance(Worker(harness.settings).process(message, NO_RECORD), Done)
    # Then after every attempt it fails upstream_error (502), charged once for the tokens reported
    line = harness.results(batch["id"])[0]
    assert line["status"] == "failed" and line["error"]["code"] == "upstream_error"
    assert line["error"]["status"] == 502 and "not valid JSON" in line["error"]["message"]
    assert state_of(harness, batch["id"], 0)["attempts"] == 3 and len(stub.received) == 3
    cost = load_catalog().models[MODEL].cost_nano(5, 7) if charged else 0
    assert meta_of(harness, batch["id"]).cost_nano == usage_today(harness) == cost
    assert harness.batch(batch["id"])["status"] == "completed"


def test_an_answer_too_large_to_keep_is_retried_like_a_5xx(harness, stub, monkeypatch):
    monkeypatch.setattr(upstream_client, "MAX_RESPONSE_BYTES", 1000)
    harness.configure(BATCH_MAX_ATTEMPTS="2")
    stub.answer = json.dumps({"object": "chat.completion", "choices": [], "pad": "x" * 2000}).encode()
    batch = harness.create([sample_request("q-0", "Hello")])
    message = message_for(harness, batch["id"], 0)
    assert isinstance(Worker(harness.settings).process(message, NO_RECORD), Parked)
    assert isinstance(Worker(harness.settings).process(message, NO_RECORD), Done)
    line = harness.results(batch["id"])[0]
    assert (line["status"], line["error"]["code"], line["error"]["status"]) == ("failed", "upstream_error", 502)
    assert "larger than 1000 bytes" in line["error"]["message"] and len(stub.received) == 2


def test_an_answer_with_empty_object_keys_is_stored_and_read_back(harness, stub):
    # DynamoDB refuses empty attribute names, map keys included: responses are stored as bytes.
    completion = {"object": "chat.completion", "choices": [{"message": {"content": "hi"}}],
                  "extra": {"": "an empty key", "nested": {"": []}}, "usage": {"prompt_tokens": 1}}
    stub.answer = json.dumps(completion).encode()
    batch = harness.create([sample_request("q-0", "Hello")])
    assert isinstance(Worker(harness.settings).process(message_for(harness, batch["id"], 0), NO_RECORD), Done)
    line = harness.results(batch["id"])[0]
    assert line["status"] == "completed" and line["response"]["body"] == completion
