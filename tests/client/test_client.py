"""BatchClient against a fake session: URLs, headers, gzip, paging, retries, errors, waiting."""

from __future__ import annotations

import gzip
import json
import uuid
from typing import Any

import pytest
import requests
from freeinference_batch_client import client as client_module
from freeinference_batch_client.client import (
    DEFAULT_BASE_URL,
    Batch,
    BatchApiError,
    BatchClient,
    BatchClientError,
    BatchConnectionError,
    encode_create_body,
)
from urllib3.exceptions import MaxRetryError, NewConnectionError

from tests.client.helpers import (
    BATCH_ID,
    KEY,
    batch_json,
    error_json,
    make,
    page,
    response,
    result_json,
)


def connect_error() -> requests.ConnectionError:
    reason = NewConnectionError(None, "Connection refused")  # type: ignore[arg-type]
    return requests.ConnectionError(MaxRetryError(None, "/v1/batches", reason))  # type: ignore[arg-type]


# ---- configuration ----------------------------------------------------------------------


def test_defaults_come_from_the_environment_only_when_arguments_are_none(monkeypatch):
    monkeypatch.setenv("FREEINFERENCE_API_KEY", "hyi-from-env")
    monkeypatch.setenv("FREEINFERENCE_BASE_URL", "http://env.test/v1/")
    from_env = BatchClient()
    assert from_env.api_key == "hyi-from-env" and from_env.base_url == "http://env.test/v1"
    explicit = BatchClient("hyi-given", "http://given.test/v1")
    assert explicit.api_key == "hyi-given" and explicit.base_url == "http://given.test/v1"
    monkeypatch.delenv("FREEINFERENCE_BASE_URL")
    assert BatchClient().base_url == DEFAULT_BASE_URL == "https://freeinference.org/v1"


def test_a_missing_key_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("FREEINFERENCE_API_KEY", raising=False)
    with pytest.raises(BatchClientError, match="FREEINFERENCE_API_KEY"):
        BatchClient()


# ---- endpoints ---------------------------------------------------------------------------


def test_create_posts_the_requests_with_the_key():
    client, session, _ = make(response(200, batch_json()))
    lines = [{"custom_id": "q-1", "body": {"model": "glm-5.3-flash", "messages": [{"role": "user", "content": "hi"}]}}]
    batch = client.create(lines, metadata={"project": "p"})
    assert isinstance(batch, Batch) and batch.id == BATCH_ID and batch.status == "validating"
    call = session.calls[0]
    assert (call["method"], call["url"]) == ("POST", "http://api.test/v1/batches")
    assert call["headers"]["Authorization"] == f"Bearer {KEY}"
    assert call["headers"]["Content-Type"] == "application/json"
    assert "Content-Encoding" not in call["headers"]
    assert json.loads(call["data"]) == {"requests": lines, "metadata": {"project": "p"}}
    assert call["timeout"] == 120


def test_large_create_bodies_are_gzipped():
    client, session, _ = make(response(200, batch_json()))
    body = {"model": "m", "messages": [{"content": "x" * 1000}]}
    lines = [{"custom_id": f"q-{i}", "body": body} for i in range(1200)]
    client.create(lines)
    call = session.calls[0]
    assert call["headers"]["Content-Encoding"] == "gzip"
    assert gzip.decompress(call["data"]) == encode_create_body(lines)
    assert len(call["data"]) < len(encode_create_body(lines)) / 10


def test_retrieve_list_cancel_delete_results_urls():
    client, session, _ = make(
        response(200, batch_json()),
        response(200, page([batch_json()])),
        response(200, batch_json("cancelled")),
        response(200, {"id": BATCH_ID, "object": "batch.deleted", "deleted": True}),
        response(200, page([result_json(1)])),
    )
    assert client.retrieve(BATCH_ID).id == BATCH_ID
    listed = client.list(limit=5, after="batch_x")
    assert listed.data[0].id == BATCH_ID and not listed.has_more
    assert client.cancel(BATCH_ID).status == "cancelled"
    deleted = client.delete(BATCH_ID)
    assert deleted.deleted and deleted.object == "batch.deleted"
    results = client.results(BATCH_ID, limit=10)
    assert results.data[0].response.request_id == "req_1"
    assert [(c["method"], c["url"], c["params"]) for c in session.calls] == [
        ("GET", f"http://api.test/v1/batches/{BATCH_ID}", None),
        ("GET", "http://api.test/v1/batches", {"limit": 5, "after": "batch_x"}),
        ("POST", f"http://api.test/v1/batches/{BATCH_ID}/cancel", None),
        ("DELETE", f"http://api.test/v1/batches/{BATCH_ID}", None),
        ("GET", f"http://api.test/v1/batches/{BATCH_ID}/results", {"limit": 10}),
    ]


def test_ids_are_sent_as_one_path_segment():
    client, session, _ = make(response(404, error_json("not found", "batch_not_found", "not_found_error")))
    with pytest.raises(BatchApiError):
        client.retrieve("../x?y")
    assert session.calls[0]["url"] == "http://api.test/v1/batches/..%2Fx%3Fy"
    with pytest.raises(ValueError):
        client.retrieve("")


def test_iter_results_pages_with_after():
    client, session, _ = make(
        response(200, page([result_json(1), result_json(2)], has_more=True)),
        response(200, page([result_json(3, "failed")], has_more=False)),
    )
    lines = list(client.iter_results(BATCH_ID, page_size=2))
    assert [line.custom_id for line in lines] == ["q-1", "q-2", "q-3"]
    assert lines[2].error.code == "timeout" and lines[2].error.status == 504
    assert [c["params"] for c in session.calls] == [{"limit": 2}, {"limit": 2, "after": "batch_req_2"}]


def test_iter_batches_pages_with_after():
    first = batch_json()
    second = {**batch_json(), "id": "batch_" + "b" * 32}
    client, session, _ = make(response(200, page([first], has_more=True)), response(200, page([second])))
    assert [batch.id for batch in client.iter_batches(page_size=1)] == [first["id"], second["id"]]
    assert session.calls[1]["params"] == {"limit": 1, "after": first["id"]}


def test_unknown_fields_are_kept():
    client, _, _ = make(response(200, batch_json(new_field=1)))
    assert client.retrieve(BATCH_ID).model_extra == {"new_field": 1}


def test_a_waiting_batch_says_why_and_a_server_before_waiting_reads_as_none():
    waiting = {"reason": "daily_quota", "message": "The account's daily quota is used up", "since": 150}
    client, _, _ = make(response(200, batch_json("in_progress", waiting=waiting)))
    batch = client.retrieve(BATCH_ID)
    assert batch.waiting is not None and (batch.waiting.reason, batch.waiting.since) == ("daily_quota", 150)
    older = {name: value for name, value in batch_json().items() if name != "waiting"}
    client, _, _ = make(response(200, older))
    assert client.retrieve(BATCH_ID).waiting is None


# ---- errors and retries --------------------------------------------------------------------


def test_errors_raise_batch_api_error_with_status_code_and_message():
    body = error_json("requests[0] (custom_id 'a'): Model 'x' not found", "model_not_found", param=None)
    client, _, sleeps = make(response(400, body))
    with pytest.raises(BatchApiError) as caught:
        client.create([{"custom_id": "a", "body": {}}])
    error = caught.value
    assert (error.status, error.code, error.type) == (400, "model_not_found", "invalid_request_error")
    assert error.message == "requests[0] (custom_id 'a'): Model 'x' not found"
    assert "400" in str(error) and "model_not_found" in str(error)
    assert sleeps == []


def test_gateway_and_non_json_errors_still_have_a_message():
    client, _, _ = make(response(404, {"message": "Not Found"}), response(502, raw=b"Bad gateway", headers={}),
                        max_retries=0)
    with pytest.raises(BatchApiError) as caught:
        client.retrieve(BATCH_ID)
    assert (caught.value.status, caught.value.code, caught.value.message) == (404, None, "Not Found")
    with pytest.raises(BatchApiError) as caught:
        client.retrieve(BATCH_ID)
    assert caught.value.status == 502 and caught.value.message == "Bad gateway"


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504])
def test_reads_are_retried_on_429_and_5xx_with_growing_backoff(status):
    failing = [response(status, error_json("busy", "x")) for _ in range(3)]
    client, session, sleeps = make(*failing, response(200, batch_json()))
    assert client.retrieve(BATCH_ID).id == BATCH_ID
    assert len(session.calls) == 4
    assert len(sleeps) == 3
    # Jittered exponential backoff: attempt n waits between half and all of base * 2**n.
    for attempt, delay in enumerate(sleeps):
        assert 0.5 * 0.5 * 2**attempt <= delay <= 0.5 * 2**attempt


def test_reads_give_up_after_max_retries():
    client, session, sleeps = make(*[response(503, error_json("down", "service_unavailable"))] * 3, max_retries=2)
    with pytest.raises(BatchApiError) as caught:
        client.list()
    assert caught.value.status == 503
    assert len(session.calls) == 3 and len(sleeps) == 2


def test_backoff_is_capped():
    client, _, _ = make(backoff_base=1, backoff_max=4)
    assert all(client._backoff(attempt) <= 4 for attempt in range(20))


def test_retry_after_is_honoured():
    client, _, sleeps = make(response(429, error_json("slow down", "rate_limited"), {"Retry-After": "7"}),
                             response(200, batch_json()))
    client.retrieve(BATCH_ID)
    assert sleeps == [7.0]


def test_a_very_long_retry_after_is_not_waited_for():
    client, session, sleeps = make(response(429, error_json("later", "rate_limited"), {"Retry-After": "3600"}))
    with pytest.raises(BatchApiError) as caught:
        client.retrieve(BATCH_ID)
    assert caught.value.retry_after == 3600
    assert sleeps == [] and len(session.calls) == 1


def test_quota_exceeded_is_not_retried():
    client, session, _ = make(response(429, error_json("quota", "quota_exceeded", "rate_limit_error")))
    with pytest.raises(BatchApiError) as caught:
        client.retrieve(BATCH_ID)
    assert caught.value.code == "quota_exceeded" and len(session.calls) == 1


def test_reads_are_retried_on_connection_errors_and_timeouts():
    client, session, sleeps = make(requests.ConnectionError("reset"), requests.ReadTimeout("slow"),
                                   response(200, page([])))
    assert client.list().data == []
    assert len(session.calls) == 3 and len(sleeps) == 2


@pytest.mark.parametrize("status", [429, 500, 503])
@pytest.mark.parametrize("method", ["cancel", "delete"])
def test_cancel_and_delete_are_not_retried_on_429_or_5xx(status, method):
    client, session, sleeps = make(response(status, error_json("no", "x")), response(200, batch_json()))
    with pytest.raises(BatchApiError):
        getattr(client, method)(BATCH_ID)
    assert len(session.calls) == 1 and sleeps == []


@pytest.mark.parametrize("method", ["cancel", "delete"])
def test_cancel_and_delete_are_not_retried_when_the_request_may_have_arrived(method):
    client, session, _ = make(requests.ReadTimeout("no answer"), requests.ConnectionError("reset by peer"))
    call = {"cancel": lambda: client.cancel(BATCH_ID), "delete": lambda: client.delete(BATCH_ID)}[method]
    with pytest.raises(BatchConnectionError):
        call()
    with pytest.raises(BatchConnectionError):
        call()
    assert len(session.calls) == 2


def test_writes_are_retried_when_the_connection_could_not_be_opened():
    client, session, sleeps = make(connect_error(), requests.ConnectTimeout("connect"), response(200, batch_json()))
    assert client.create([{"custom_id": "a", "body": {}}]).id == BATCH_ID
    assert len(session.calls) == 3 and len(sleeps) == 2


def test_connection_errors_after_the_retries_are_batch_connection_errors():
    client, _, _ = make(*[requests.ConnectionError("down")] * 2, max_retries=1)
    with pytest.raises(BatchConnectionError, match="down"):
        client.retrieve(BATCH_ID)


# ---- waiting ---------------------------------------------------------------------------


def test_wait_polls_until_final_and_reports_each_update():
    client, _, sleeps = make(
        response(200, batch_json("validating")),
        response(200, batch_json("in_progress")),
        response(200, batch_json("completed", request_counts={"total": 2, "completed": 2, "failed": 0})),
    )
    seen = []
    final = client.wait(BATCH_ID, poll_interval=3, on_update=lambda batch: seen.append(batch.status))
    assert final.status == "completed" and final.is_final
    assert seen == ["validating", "in_progress", "completed"]
    assert sleeps == [3, 3]


def test_wait_times_out(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(client_module.time, "monotonic", lambda: now[0])
    client, _, sleeps = make(*[response(200, batch_json("in_progress"))] * 10)

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds

    client._sleep = sleep
    with pytest.raises(TimeoutError, match="in_progress"):
        client.wait(BATCH_ID, poll_interval=2, timeout=5)
    assert sum(sleeps) == pytest.approx(5)


# ---- idempotent create ---------------------------------------------------------------------


def test_create_sends_an_idempotency_key_and_reuses_it_across_its_retries():
    # Given a create whose first attempts time out, answer 500 and 503 (each may have stored it)
    client, session, sleeps = make(requests.ReadTimeout("no answer"), response(500, error_json("oops", "x")),
                                   response(503, error_json("busy", "service_unavailable"), {"Retry-After": "1"}),
                                   response(200, batch_json(), {"Idempotent-Replayed": "true"}))
    # Then it is retried until answered, every attempt with the same key and body
    assert client.create([{"custom_id": "a", "body": {}}]).id == BATCH_ID
    keys = {call["headers"]["Idempotency-Key"] for call in session.calls}
    assert len(session.calls) == 4 and len(keys) == 1 and len(sleeps) == 3
    assert len({call["data"] for call in session.calls}) == 1
    key = keys.pop()
    assert str(uuid.UUID(key)) == key
    # And the next create is a new job: a new key
    client2, session2, _ = make(response(200, batch_json()))
    client2.create([{"custom_id": "a", "body": {}}])
    assert session2.calls[0]["headers"]["Idempotency-Key"] != key


def test_create_takes_the_callers_idempotency_key():
    client, session, _ = make(response(200, batch_json()))
    client.create([{"custom_id": "a", "body": {}}], idempotency_key="job-42-part-1")
    assert session.calls[0]["headers"]["Idempotency-Key"] == "job-42-part-1"


@pytest.mark.parametrize("code,status", [("too_many_unfinished_batches", 429), ("idempotency_key_reused", 422)])
def test_create_is_not_retried_on_errors_that_last(code, status):
    client, session, sleeps = make(response(status, error_json("no", code)), response(200, batch_json()))
    with pytest.raises(BatchApiError) as caught:
        client.create([{"custom_id": "a", "body": {}}])
    assert caught.value.code == code and len(session.calls) == 1 and sleeps == []


# ---- results too big for a page -------------------------------------------------------------


def test_results_fetch_a_body_given_by_link_without_the_api_key():
    linked = result_json(1001)
    linked["response"] = {"status_code": 200, "request_id": "req_1001", "body": None,
                          "body_url": "https://bucket.s3.amazonaws.com/x?X-Amz-Signature=s"}
    stored = {"id": "big", "object": "chat.completion"}
    client, session, _ = make(response(200, page([result_json(1000), linked])), response(503, raw=b"slow down"),
                              response(200, stored))
    lines = list(client.iter_results(BATCH_ID))
    # Then every line carries its body, the linked one fetched (retried once) from its URL
    assert [line.response.body for line in lines] == [{"id": "c"}, stored]
    fetches = session.calls[1:]
    assert [call["url"] for call in fetches] == [linked["response"]["body_url"]] * 2
    assert all("Authorization" not in call["headers"] for call in fetches)


# ---- webhook endpoints ---------------------------------------------------------------------

ENDPOINT_ID = "we_" + "b" * 32


def endpoint_json(**fields: Any) -> dict:
    return {"id": ENDPOINT_ID, "object": "webhook_endpoint", "url": "https://example.com/hooks", "name": "hooks",
            "event_types": ["batch.completed"], "created_at": 100, "updated_at": 100,
            "signing_secret_hint": "whsec_...abcd", **fields}


def test_webhook_endpoint_routes_urls_and_bodies():
    client, session, _ = make(
        response(200, endpoint_json(signing_secret="whsec_c2VjcmV0")),
        response(200, page([endpoint_json()])),
        response(200, endpoint_json()),
        response(200, endpoint_json(name="renamed")),
        response(200, endpoint_json(signing_secret="whsec_bmV3")),
        response(200, {"object": "webhook_endpoint.test", "webhook_endpoint_id": ENDPOINT_ID,
                       "event_type": "batch.failed", "status_code": 204, "success": True}),
        response(200, {"id": ENDPOINT_ID, "object": "webhook_endpoint.deleted", "deleted": True}),
        response(200, {"object": "list", "data": ["batch.completed", "batch.failed"]}),
    )
    created = client.webhooks.create("https://example.com/hooks", "hooks")
    assert created.signing_secret == "whsec_c2VjcmV0"
    listed = client.webhooks.list(limit=5)
    assert listed.data[0].signing_secret is None  # lists never show it
    assert client.webhooks.retrieve(ENDPOINT_ID).id == ENDPOINT_ID
    assert client.webhooks.update(ENDPOINT_ID, name="renamed").name == "renamed"
    assert client.webhooks.rotate_secret(ENDPOINT_ID, keep_old_secret_active_for_24_hours=True).signing_secret
    assert client.webhooks.test(ENDPOINT_ID, "batch.failed").status_code == 204
    assert client.webhooks.delete(ENDPOINT_ID).deleted
    assert client.webhooks.event_types() == ["batch.completed", "batch.failed"]
    base = "http://api.test/v1/webhook_endpoints"
    assert [(c["method"], c["url"], c["params"]) for c in session.calls] == [
        ("POST", base, None), ("GET", base, {"limit": 5}), ("GET", f"{base}/{ENDPOINT_ID}", None),
        ("POST", f"{base}/{ENDPOINT_ID}", None), ("POST", f"{base}/{ENDPOINT_ID}/rotate_secret", None),
        ("POST", f"{base}/{ENDPOINT_ID}/test", None), ("DELETE", f"{base}/{ENDPOINT_ID}", None),
        ("GET", "http://api.test/v1/webhook_event_types", None),
    ]
    bodies = [json.loads(c["data"]) if c["data"] else None for c in session.calls]
    # The four final statuses unless told otherwise; an update sends only what changes
    assert bodies[0] == {"url": "https://example.com/hooks", "name": "hooks",
                         "event_types": ["batch.completed", "batch.failed", "batch.expired", "batch.cancelled"]}
    assert bodies[3] == {"name": "renamed"}
    assert bodies[4] == {"keep_old_secret_active_for_24_hours": True}
    assert bodies[5] == {"event_type": "batch.failed"}
    assert bodies[6] is None


@pytest.mark.parametrize("call", ["create", "test", "rotate_secret", "delete"])
def test_webhook_writes_are_not_retried_on_5xx(call):
    # A second create is a second endpoint, a second test another delivery, a second rotate another secret
    client, session, sleeps = make(response(503, error_json("busy", "x")), response(200, endpoint_json()))
    invoke = {"create": lambda: client.webhooks.create("https://example.com/hooks", "hooks"),
              "test": lambda: client.webhooks.test(ENDPOINT_ID),
              "rotate_secret": lambda: client.webhooks.rotate_secret(ENDPOINT_ID),
              "delete": lambda: client.webhooks.delete(ENDPOINT_ID)}[call]
    with pytest.raises(BatchApiError):
        invoke()
    assert len(session.calls) == 1 and sleeps == []


def test_webhook_reads_are_retried_and_pages_follow_after():
    second = endpoint_json(id="we_" + "c" * 32)
    client, session, sleeps = make(response(503, error_json("busy", "x")),
                                   response(200, page([endpoint_json()], has_more=True)), response(200, page([second])))
    assert [e.id for e in client.webhooks.iter(page_size=1)] == [ENDPOINT_ID, second["id"]]
    assert len(sleeps) == 1 and session.calls[-1]["params"] == {"limit": 1, "after": ENDPOINT_ID}
