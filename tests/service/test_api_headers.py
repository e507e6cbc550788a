"""The API's answers as a browser or a cache reads them (issue 31): every answer says
`X-Content-Type-Options: nosniff`, an answer carrying a webhook signing secret says
`Cache-Control: no-store`, and a method a path does not take is 405 with `Allow`, in the API's
error shape (template.yaml routes those methods to the function; API Gateway answered 404)."""

from __future__ import annotations

from tests.conftest import capture_answers
from tests.service.helpers import ERROR_FIELDS, req

MISSING = "batch_" + "0" * 32
ENDPOINT = {"url": "http://127.0.0.1:9999/hook", "name": "hook", "event_types": ["batch.completed"]}


def test_every_answer_says_nosniff(harness):
    batch = harness.create([req()])
    answers = capture_answers(harness)
    calls = [
        ("GET", "/v1/batches", {}),  # 200
        ("GET", f"/v1/batches/{batch['id']}/results?limit=0", {}),  # 400
        ("GET", "/v1/batches", {"key": "hyi-not-a-key"}),  # 401
        ("GET", f"/v1/batches/{MISSING}", {}),  # 404
        ("GET", "/v1/nothing", {}),  # no route
        ("PUT", "/v1/batches", {}),  # 405
    ]
    for method, path, kwargs in calls:
        harness.call(method, path, **kwargs)
    assert [answer["statusCode"] for answer in answers] == [200, 400, 401, 404, 404, 405]
    for (method, path, _), answer in zip(calls, answers, strict=True):
        assert answer["headers"].get("X-Content-Type-Options") == "nosniff", (method, path, answer["headers"])


def test_only_answers_with_a_signing_secret_say_no_store(harness):
    harness.configure(WEBHOOK_ALLOW_LOOPBACK_HTTP="true")
    answers = capture_answers(harness)
    status, created = harness.call("POST", "/v1/webhook_endpoints", ENDPOINT)
    assert status == 200 and created["signing_secret"], created
    path = f"/v1/webhook_endpoints/{created['id']}"
    status, rotated = harness.call("POST", f"{path}/rotate_secret", {})
    assert status == 200 and rotated["signing_secret"], rotated
    harness.call("GET", path)
    harness.call("GET", "/v1/webhook_endpoints")
    no_store = [answer["headers"].get("Cache-Control") == "no-store" for answer in answers]
    assert no_store == [True, True, False, False], [answer["headers"] for answer in answers]


def test_a_method_a_path_does_not_take_is_405_with_allow_in_the_error_shape(harness):
    answers = capture_answers(harness)
    cases = [
        ("PUT", "/v1/batches", "GET, POST"),
        ("PATCH", f"/v1/batches/{MISSING}", "DELETE, GET"),
        ("TRACE", f"/v1/batches/{MISSING}/results", "GET"),
        ("GET", f"/v1/batches/{MISSING}/cancel", "POST"),
        ("PUT", f"/v1/batches/{MISSING}/retry", "POST"),
        ("HEAD", "/v1/webhook_endpoints", "GET, POST"),
        ("PUT", "/v1/webhook_endpoints/we_1", "DELETE, GET, POST"),
        ("GET", "/v1/webhook_endpoints/we_1/rotate_secret", "POST"),
        ("DELETE", "/v1/webhook_endpoints/we_1/test", "POST"),
        ("POST", "/v1/webhook_event_types", "GET"),
    ]
    for method, path, allowed in cases:
        status, body = harness.call(method, path, key=False)  # refused before any key is read
        assert status == 405, (method, path, body)
        assert set(body["error"]) == ERROR_FIELDS and body["error"]["code"] == "method_not_allowed", body
        assert method in body["error"]["message"] and allowed in body["error"]["message"], body
        assert answers[-1]["headers"]["Allow"] == allowed, (method, path)
    # A path the API does not have is still 404
    assert harness.call("PUT", "/v1/nothing")[0] == 404
