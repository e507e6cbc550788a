"""Webhook endpoint writes on AWS's bad days: a transaction other writes keep cancelling is a
503 that changed nothing (never a 500, never a 404 for an endpoint that is there), and a write
whose answer was lost, re-sent, finds its own earlier success."""

from __future__ import annotations

from freeinference_batch.store import webhook_endpoints
from freeinference_batch.store.dynamo import TransactionConflict

ENDPOINT = {"url": "http://127.0.0.1:9009/hook", "name": "hook", "event_types": ["batch.completed"]}


def conflicting(*_: object, **__: object) -> None:
    raise TransactionConflict(["None", "TransactionConflict"])


def twice(real):
    """The transaction applied, its answer lost, botocore sending it again: the second sending
    meets the first one's success."""
    def send(elements: list[dict]) -> None:
        real(elements)
        real(elements)
    return send


def test_a_create_or_delete_cancelled_by_conflicts_is_a_503_that_changed_nothing(harness, monkeypatch):
    harness.configure(WEBHOOK_ALLOW_LOOPBACK_HTTP="true")
    status, kept = harness.call("POST", "/v1/webhook_endpoints", ENDPOINT)
    assert status == 200
    monkeypatch.setattr(webhook_endpoints, "transact", conflicting)

    status, refused = harness.call("POST", "/v1/webhook_endpoints", ENDPOINT)
    assert status == 503 and refused["error"]["code"] == "service_unavailable", refused
    status, refused = harness.call("DELETE", f"/v1/webhook_endpoints/{kept['id']}")
    assert status == 503 and refused["error"]["code"] == "service_unavailable", refused

    monkeypatch.undo()
    status, listed = harness.call("GET", "/v1/webhook_endpoints")
    assert status == 200 and [e["id"] for e in listed["data"]] == [kept["id"]]


def test_a_create_and_a_delete_whose_answers_were_lost_find_their_own_success(harness, monkeypatch):
    harness.configure(WEBHOOK_ALLOW_LOOPBACK_HTTP="true", WEBHOOK_MAX_ENDPOINTS="2")
    monkeypatch.setattr(webhook_endpoints, "transact", twice(webhook_endpoints.transact))

    status, created = harness.call("POST", "/v1/webhook_endpoints", ENDPOINT)
    assert status == 200, created
    status, deleted = harness.call("DELETE", f"/v1/webhook_endpoints/{created['id']}")
    assert status == 200 and deleted["deleted"] is True, deleted

    # Counted once each: two more fit under a limit of two
    for _ in range(2):
        status, answer = harness.call("POST", "/v1/webhook_endpoints", ENDPOINT)
        assert status == 200, answer
    status, refused = harness.call("POST", "/v1/webhook_endpoints", ENDPOINT)
    assert status == 400 and refused["error"]["code"] == "too_many_webhook_endpoints"


def test_a_rotation_whose_answer_was_lost_finds_its_own_new_secret(harness):
    harness.configure(WEBHOOK_ALLOW_LOOPBACK_HTTP="true")
    status, created = harness.call("POST", "/v1/webhook_endpoints", ENDPOINT)
    assert status == 200
    store = webhook_endpoints.WebhookEndpoints(harness.settings)
    old = store.get("acct-1", created["id"]).secret_nonce
    args = ("acct-1", created["id"], old, "new-nonce", "whsec_...new", None, 200)
    first = store.rotate(*args)
    # The same write sent again (its answer lost): its condition (the old nonce) fails, and the
    # stored nonce is its own
    again = store.rotate(*args)
    assert first is not None and again is not None and again.secret_nonce == "new-nonce"
    # Another rotation's nonce is not mistaken for ours
    assert store.rotate("acct-1", created["id"], old, "other-nonce", "whsec_...oth", None, 201) is None
