"""openapi.yaml: a valid OpenAPI 3.1 document, and the local stack's live answers conform to it.

Every answer below is checked against the schema the document gives for that operation and
status (an undocumented status fails), for successes and for each error status of the spec:
400, 401, 403, 404, 409, 413 and 429.
"""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import requests
import yaml
from openapi_spec_validator import validate as validate_spec

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SPEC: dict[str, Any] = yaml.safe_load((REPO / "openapi.yaml").read_text())
MISSING_ID = "batch_" + "0" * 32

CREATE = ("/batches", "post")
LIST = ("/batches", "get")
RETRIEVE = ("/batches/{batch_id}", "get")
DELETE = ("/batches/{batch_id}", "delete")
RESULTS = ("/batches/{batch_id}/results", "get")
CANCEL = ("/batches/{batch_id}/cancel", "post")
RETRY = ("/batches/{batch_id}/retry", "post")  # ours beyond the spec's six (issue 33)
ENDPOINTS = "/webhook_endpoints"
ENDPOINT = "/webhook_endpoints/{endpoint_id}"
WEBHOOKS = {(ENDPOINTS, "post"), (ENDPOINTS, "get"), (ENDPOINT, "get"), (ENDPOINT, "post"), (ENDPOINT, "delete"),
            (f"{ENDPOINT}/rotate_secret", "post"), (f"{ENDPOINT}/test", "post"), ("/webhook_event_types", "get")}


def deref(node: dict) -> dict:
    while "$ref" in node:
        target: Any = SPEC
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


def schema_for(operation: tuple[str, str], status: int) -> dict:
    path, method = operation
    responses = SPEC["paths"][path][method]["responses"]
    assert str(status) in responses, f"{method.upper()} {path}: status {status} is not documented"
    return deref(responses[str(status)])["content"]["application/json"]["schema"]


def validate_json(schema: dict, instance: Any) -> None:
    # The components ride along so the document's own "#/components/..." references resolve.
    root = {**schema, "components": SPEC["components"]}
    validator = jsonschema.Draft202012Validator(root, format_checker=jsonschema.FormatChecker())
    errors = sorted(validator.iter_errors(instance), key=lambda error: list(error.absolute_path))
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors[:10])


def conforms(answer: requests.Response, operation: tuple[str, str], status: int | None = None) -> Any:
    """The answer has `status` (if given), is documented for the operation, and matches its schema."""
    if status is not None:
        assert answer.status_code == status, f"expected {status}, got {answer.status_code}: {answer.text[:500]}"
    assert answer.headers.get("content-type", "").startswith("application/json"), answer.headers
    body = answer.json()
    validate_json(schema_for(operation, answer.status_code), body)
    return body


def component(name: str, instance: Any) -> None:
    validate_json({"$ref": f"#/components/schemas/{name}"}, instance)


def request(custom_id: str, content: str = "hello", model: str = "glm-5.3-flash") -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": content}]}}


@pytest.fixture(scope="module")
def key(stack) -> str:
    return stack.create_key("e2e-openapi", tier="internal")


def results_of(api, batch_id: str) -> dict:
    return conforms(api.get(f"/batches/{batch_id}/results", params={"limit": 1000}), RESULTS, 200)


# ---- the document --------------------------------------------------------------------------


def test_the_document_is_valid_openapi_3_1():
    validate_spec(SPEC)
    assert SPEC["openapi"].startswith("3.1")


# OpenAI's Files and Uploads APIs (issue 32)
FILES = {("/files", "post"), ("/files", "get"), ("/files/{file_id}", "get"), ("/files/{file_id}", "delete"),
         ("/files/{file_id}/content", "get"), ("/uploads", "post"), ("/uploads/{upload_id}/parts", "post"),
         ("/uploads/{upload_id}/complete", "post"), ("/uploads/{upload_id}/cancel", "post")}


def test_the_document_has_the_six_endpoints_the_retry_the_webhook_routes_and_their_errors():
    operations = {(path, method) for path, item in SPEC["paths"].items() for method in item if method != "parameters"}
    assert operations == {CREATE, LIST, RETRIEVE, DELETE, RESULTS, CANCEL, RETRY} | WEBHOOKS | FILES
    statuses = {status for path, method in operations for status in SPEC["paths"][path][method]["responses"]}
    assert {"200", "400", "401", "403", "404", "409", "413", "429"} <= statuses
    assert set(SPEC["paths"][CREATE[0]]["post"]["responses"]) >= {"400", "401", "403", "404", "413", "429"}
    assert "409" in SPEC["paths"][DELETE[0]]["delete"]["responses"]
    schemes = SPEC["components"]["securitySchemes"]
    assert schemes["bearerAuth"] == {**schemes["bearerAuth"], "type": "http", "scheme": "bearer"}
    assert (schemes["apiKeyHeader"]["in"], schemes["apiKeyHeader"]["name"]) == ("header", "X-API-Key")
    limits = {op: {p["name"]: p["schema"] for p in SPEC["paths"][op[0]][op[1]].get("parameters", [])}
              for op in (LIST, RESULTS)}
    assert limits[LIST]["limit"] == {"type": "integer", "minimum": 1, "maximum": 100, "default": 20}
    assert limits[RESULTS]["limit"] == {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100}
    assert "after" in limits[LIST] and "after" in limits[RESULTS]


def test_the_batch_schema_names_every_field_of_the_spec():
    batch = SPEC["components"]["schemas"]["Batch"]
    spec_fields = [
        "id", "object", "endpoint", "errors", "input_file_id", "completion_window", "status", "output_file_id",
        "error_file_id", "created_at", "in_progress_at", "expires_at", "finalizing_at", "completed_at", "failed_at",
        "expired_at", "cancelling_at", "cancelled_at", "request_counts", "metadata", "cost_usd", "error",
    ]
    # Then ours beyond the spec's, each documented as an addition to it (issue 33).
    additions = ["retry_of", "waiting"]
    assert list(batch["properties"]) == spec_fields + additions
    assert batch["required"] == spec_fields + additions
    # The spec's statuses, and `finalizing` (issue 32: batches created from a file only)
    assert batch["properties"]["status"]["enum"] == [
        "validating", "in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled",
    ]


def test_the_documents_examples_match_its_schemas():
    example = SPEC["paths"]["/batches"]["post"]["requestBody"]["content"]["application/json"]["examples"]
    component("CreateBatchRequest", example["two-requests"]["value"])
    for name in ("BadRequest", "Unauthorized", "NotFound"):
        component("Error", SPEC["components"]["responses"][name]["content"]["application/json"]["example"])


def test_the_schemas_have_teeth():
    # A batch object as the spec shows it validates; each departure from the spec does not.
    batch = {
        "id": "batch_6f1c0a7e2b8d4e55a1c3f9d2e4b6a8c0", "object": "batch", "endpoint": "/v1/chat/completions",
        "errors": None, "input_file_id": None, "completion_window": "24h", "status": "validating",
        "output_file_id": None, "error_file_id": None, "created_at": 1792929600, "in_progress_at": None,
        "expires_at": 1793016000, "finalizing_at": None, "completed_at": None, "failed_at": None,
        "expired_at": None, "cancelling_at": None, "cancelled_at": None,
        "request_counts": {"total": 2, "completed": 0, "failed": 0}, "metadata": {"project": "eval-42"},
        "cost_usd": 0.0, "error": None, "retry_of": None, "waiting": None,
    }
    component("Batch", batch)
    waiting = {"reason": "model_busy", "message": "Model 'glm-5.3-flash' is at its batch capacity", "since": 1792929700}
    component("Batch", {**batch, "waiting": waiting})
    broken = [
        {**batch, "waiting": {**waiting, "reason": "sleepy"}},
        {key: value for key, value in batch.items() if key != "waiting"},
        {**batch, "status": "finalizing-soon"},
        {**batch, "input_file_id": 1},
        {**batch, "extra": 1},
        {key: value for key, value in batch.items() if key != "error"},
        {**batch, "request_counts": {"total": 2, "completed": 0}},
        {**batch, "created_at": "yesterday"},
    ]
    for instance in broken:
        with pytest.raises(AssertionError):
            component("Batch", instance)
    with pytest.raises(AssertionError):
        component("Error", {"error": {"message": "", "type": "x", "code": None, "param": None}})


# ---- successes -----------------------------------------------------------------------------


def test_create_retrieve_list_results_cancel_delete_conform(stack, key):
    api = stack.api(key)
    # create: a success and a refusal upstream, with metadata
    batch = conforms(api.create_batch([request("ok"), request("refused", "no [sim:status=400]")],
                                      metadata={"project": "openapi"}), CREATE, 200)
    assert batch["status"] == "validating"
    conforms(api.get(f"/batches/{batch['id']}"), RETRIEVE, 200)
    final = api.wait_for_status(batch["id"], {"completed"})
    component("Batch", final)
    assert final["completed_at"] is not None and final["in_progress_at"] is not None

    page = results_of(api, batch["id"])
    by_id = {line["custom_id"]: line for line in page["data"]}
    assert by_id["ok"]["status"] == "completed" and by_id["refused"]["error"]["status"] == 400
    # one page at a time, then the next with after
    first = conforms(api.get(f"/batches/{batch['id']}/results", params={"limit": 1}), RESULTS, 200)
    assert first["has_more"] is True
    second = conforms(api.get(f"/batches/{batch['id']}/results", params={"limit": 1, "after": first["last_id"]}),
                      RESULTS, 200)
    assert second["has_more"] is False and second["data"][0]["custom_id"] == "refused"

    listed = conforms(api.get("/batches", params={"limit": 1}), LIST, 200)
    assert listed["data"][0]["id"] == batch["id"]
    conforms(api.get("/batches", params={"limit": 100, "after": batch["id"]}), LIST, 200)
    conforms(api.get("/batches"), LIST, 200)

    # retry: the failed request as a new batch; nothing cancelled to retry
    child = conforms(api.post(f"/batches/{batch['id']}/retry", json={"metadata": None}), RETRY, 200)
    assert child["retry_of"] == batch["id"] and child["request_counts"]["total"] == 1 and child["metadata"] is None
    nothing = conforms(api.post(f"/batches/{batch['id']}/retry", json={"statuses": ["cancelled"]}), RETRY, 400)
    assert nothing["error"]["code"] == "nothing_to_retry"
    unknown = conforms(api.post(f"/batches/{batch['id']}/retry", json={"statuses": ["queued"]}), RETRY, 400)
    assert unknown["error"]["param"] == "statuses"

    unchanged = conforms(api.post(f"/batches/{batch['id']}/cancel"), CANCEL, 200)
    assert unchanged["status"] == "completed"
    deleted = conforms(api.delete(f"/batches/{batch['id']}"), DELETE, 200)
    assert deleted == {"id": batch["id"], "object": "batch.deleted", "deleted": True}


def test_documented_defaults_hold(stack, key):
    api = stack.api(key)
    # completion_window is accepted and ignored; results page 100 lines by default; lists 20 at most
    batch = conforms(api.create_batch([request(f"d{i}") for i in range(101)], completion_window="1h"), CREATE, 200)
    assert batch["completion_window"] == "24h" and batch["metadata"] is None
    page = conforms(api.get(f"/batches/{batch['id']}/results"), RESULTS, 200)
    assert len(page["data"]) == 100 and page["has_more"] is True
    assert [line["custom_id"] for line in page["data"]] == [f"d{i}" for i in range(100)]
    assert len(conforms(api.get("/batches"), LIST, 200)["data"]) <= 20
    conforms(api.post(f"/batches/{batch['id']}/cancel"), CANCEL, 200)  # no need to run them all


def test_x_api_key_header_authenticates_as_documented(stack, key):
    answer = requests.get(f"{stack.base_url}/batches", headers={"X-API-Key": key}, timeout=30)
    conforms(answer, LIST, 200)


def test_running_cancelling_and_cancelled_conform_and_delete_while_running_is_409(stack, key):
    api = stack.api(key)
    batch = conforms(api.create_batch([request(f"slow-{i}", "slow [sim:latency=2]") for i in range(6)]), CREATE, 200)
    batch_id = batch["id"]

    def running() -> dict | None:
        page = results_of(api, batch_id)
        return page if any(line["status"] == "running" for line in page["data"]) else None

    page = api.wait_for(running, timeout=20, message="a running request")
    assert {line["status"] for line in page["data"]} <= {"queued", "running", "completed"}
    in_progress = conforms(api.get(f"/batches/{batch_id}"), RETRIEVE, 200)
    assert in_progress["status"] == "in_progress" and in_progress["in_progress_at"] is not None

    conflict = conforms(api.delete(f"/batches/{batch_id}"), DELETE, 409)
    assert conflict["error"]["message"]
    not_final = conforms(api.post(f"/batches/{batch_id}/retry"), RETRY, 409)
    assert not_final["error"]["code"] == "batch_not_final"

    cancelling = conforms(api.post(f"/batches/{batch_id}/cancel"), CANCEL, 200)
    assert cancelling["status"] in {"cancelling", "cancelled"} and cancelling["cancelling_at"] is not None
    cancelled = api.wait_for_status(batch_id, {"cancelled"}, timeout=20)
    component("Batch", cancelled)
    assert cancelled["cancelled_at"] is not None
    lines = results_of(api, batch_id)["data"]
    assert {line["status"] for line in lines} <= {"completed", "cancelled"}
    assert any(line["status"] == "cancelled" for line in lines)
    conforms(api.delete(f"/batches/{batch_id}"), DELETE, 200)


def test_a_failed_batch_conforms(stack):
    # Given an account whose requests cannot start (no concurrency) and two keys of it
    creator = stack.create_key("e2e-openapi-failed", tier="internal", concurrency=0)
    reader = stack.create_key("e2e-openapi-failed", tier="internal", concurrency=0)
    batch = conforms(stack.api(creator).create_batch([request("a"), request("b")]), CREATE, 200)
    # When the key that created it is revoked
    stack.admin("revoke-key", "--hash", hashlib.sha256(creator.encode()).hexdigest())
    # Then the batch fails, and reads as documented (with the account's other key)
    failed = stack.api(reader).wait_for_status(batch["id"], {"failed"}, timeout=30)
    component("Batch", failed)
    assert failed["error"]["code"] == "owner_unauthorized" and failed["failed_at"] is not None
    assert failed["request_counts"] == {"total": 2, "completed": 0, "failed": 2}
    lines = results_of(stack.api(reader), batch["id"])["data"]
    assert [line["error"]["code"] for line in lines] == ["batch_failed", "batch_failed"]


# ---- errors ------------------------------------------------------------------------------


def test_400_answers_conform(stack, key):
    api = stack.api(key)
    cases = [
        (api.post("/batches", data=b"{not json", headers={"Content-Type": "application/json"}), CREATE),
        (api.post("/batches", json={"requests": []}), CREATE),
        (api.post("/batches", json={"nothing": 1}), CREATE),
        (api.create_batch([request("a", model="no-such-model")]), CREATE),
        (api.create_batch([request("a"), request("a")]), CREATE),
        (api.create_batch([request("a")], metadata={"k": "v" * 513}), CREATE),
        (api.post("/batches", data=b"\x00garbage", headers={"Content-Encoding": "gzip"}), CREATE),
        (api.get("/batches", params={"limit": 0}), LIST),
        (api.get("/batches", params={"limit": 101}), LIST),
        (api.get("/batches", params={"limit": "ten"}), LIST),
        (api.get("/batches", params={"after": "not-a-batch"}), LIST),
    ]
    done = api.create_batch([request("x")])
    batch_id = conforms(done, CREATE, 200)["id"]
    cases += [
        (api.get(f"/batches/{batch_id}/results", params={"after": "nope"}), RESULTS),
        (api.get(f"/batches/{batch_id}/results", params={"after": "batch_req_1"}), RESULTS),
        (api.get(f"/batches/{batch_id}/results", params={"limit": 1001}), RESULTS),
        (api.get(f"/batches/{batch_id}/results", params={"limit": 0}), RESULTS),
    ]
    for answer, operation in cases:
        body = conforms(answer, operation, 400)
        assert body["error"]["type"] == "invalid_request_error" and body["error"]["message"]
    model_error = conforms(api.create_batch([request("a"), request("b", model="no-such-model")]), CREATE, 400)
    assert model_error["error"]["message"] == "requests[1] (custom_id 'b'): Model 'no-such-model' not found"


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer hyi-not-a-real-key"}, {"X-API-Key": "wrong"}])
def test_401_answers_conform_on_every_endpoint(stack, headers):
    calls = [
        (CREATE, "POST", "/batches", {"json": {"requests": [request("a")]}}),
        (LIST, "GET", "/batches", {}),
        (RETRIEVE, "GET", f"/batches/{MISSING_ID}", {}),
        (RESULTS, "GET", f"/batches/{MISSING_ID}/results", {}),
        (CANCEL, "POST", f"/batches/{MISSING_ID}/cancel", {}),
        (RETRY, "POST", f"/batches/{MISSING_ID}/retry", {}),
        (DELETE, "DELETE", f"/batches/{MISSING_ID}", {}),
    ]
    for operation, method, path, kwargs in calls:
        answer = requests.request(method, stack.base_url + path, headers=headers, timeout=30, **kwargs)
        body = conforms(answer, operation, 401)
        assert body["error"]["type"] == "authentication_error"


def test_403_for_an_account_that_may_not_create_batches(stack):
    standard = stack.create_key("e2e-openapi-standard", tier="standard")
    body = conforms(stack.api(standard).create_batch([request("a")]), CREATE, 403)
    assert body["error"]["type"] == "permission_error"
    assert conforms(stack.api(standard).post(f"/batches/{MISSING_ID}/retry"), RETRY, 403) == body
    conforms(stack.api(standard).get("/batches"), LIST, 200)  # reading still works


def test_404_answers_conform_on_every_batch_endpoint(stack, key):
    api = stack.api(key)
    other = stack.api(stack.key).create_batch([request("theirs")])  # another account's batch reads as not found
    theirs = conforms(other, CREATE, 200)["id"]
    for batch_id in (MISSING_ID, "nonsense", theirs):
        conforms(api.get(f"/batches/{batch_id}"), RETRIEVE, 404)
        conforms(api.get(f"/batches/{batch_id}/results"), RESULTS, 404)
        conforms(api.post(f"/batches/{batch_id}/cancel"), CANCEL, 404)
        conforms(api.post(f"/batches/{batch_id}/retry"), RETRY, 404)
        body = conforms(api.delete(f"/batches/{batch_id}"), DELETE, 404)
        assert body["error"]["type"] == "not_found_error" and batch_id in body["error"]["message"]


def test_413_for_a_body_over_the_limit(stack, key):
    # 33 MiB of JSON whitespace around a batch, gzipped to a few tens of kilobytes on the wire
    padded = b'{"requests": [' + b" " * (33 * 1024 * 1024) + b"]}"
    answer = stack.api(key).post("/batches", data=gzip.compress(padded, 9),
                                 headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
    body = conforms(answer, CREATE, 413)
    assert "limit" in body["error"]["message"]


def test_429_when_the_daily_quota_is_used_up(stack):
    spent = stack.create_key("e2e-openapi-quota", tier="internal", daily_quota_usd=0)
    api = stack.api(spent)
    for answer, operation in [
        (api.create_batch([request("a")]), CREATE),
        (api.get("/batches"), LIST),
        (api.get(f"/batches/{MISSING_ID}"), RETRIEVE),
        (api.get(f"/batches/{MISSING_ID}/results"), RESULTS),
        (api.post(f"/batches/{MISSING_ID}/cancel"), CANCEL),
        (api.post(f"/batches/{MISSING_ID}/retry"), RETRY),
        (api.delete(f"/batches/{MISSING_ID}"), DELETE),
    ]:
        body = conforms(answer, operation, 429)
        assert body["error"]["code"] == "quota_exceeded"


def test_429_unfinished_limit_and_an_expired_batch_conform(start_stack, tmp_path):
    # Given a stack allowing 1 unfinished batch and a 2 s window, and an account whose requests cannot start
    own = start_stack(tmp_path, BATCH_MAX_UNFINISHED="1", BATCH_COMPLETION_WINDOW_SECONDS="2")
    stuck = own.api(own.create_key("stuck", tier="internal", concurrency=0))
    first = conforms(stuck.create_batch([request("a"), request("b")]), CREATE, 200)
    assert first["completion_window"] == "2s"
    # When a second batch is created while the first is unfinished
    body = conforms(stuck.create_batch([request("c")]), CREATE, 429)
    assert body["error"]["code"] == "too_many_unfinished_batches"
    # Then the first expires with its window, and reads as documented
    expired = stuck.wait_for_status(first["id"], {"expired"}, timeout=30)
    component("Batch", expired)
    assert expired["expired_at"] is not None
    assert expired["request_counts"] == {"total": 2, "completed": 0, "failed": 2}
    lines = results_of(stuck, first["id"])["data"]
    assert [(line["status"], line["error"]["code"]) for line in lines] == [("expired", "batch_expired")] * 2
    # And the limit frees up
    conforms(stuck.create_batch([request("c")]), CREATE, 200)


def test_the_webhook_routes_answer_as_documented(stack, key):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(202)
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    api = stack.api(key)
    try:
        url = f"http://127.0.0.1:{server.server_port}/hook"  # the local stack's loopback setting
        created = conforms(api.post(ENDPOINTS, json={"url": url, "name": "doc", "event_types": ["batch.completed"]}),
                           (ENDPOINTS, "post"), 200)
        path = f"{ENDPOINTS}/{created['id']}"
        conforms(api.get(ENDPOINTS, params={"limit": 5}), (ENDPOINTS, "get"), 200)
        conforms(api.get(path), (ENDPOINT, "get"), 200)
        conforms(api.post(path, json={"name": "renamed", "url": None}), (ENDPOINT, "post"), 200)
        conforms(api.post(f"{path}/rotate_secret", json={"keep_old_secret_active_for_24_hours": True}),
                 (f"{ENDPOINT}/rotate_secret", "post"), 200)
        tested = conforms(api.post(f"{path}/test", json={"event_type": "batch.completed"}),
                          (f"{ENDPOINT}/test", "post"), 200)
        assert tested["status_code"] == 202
        conforms(api.get("/webhook_event_types"), ("/webhook_event_types", "get"), 200)
        refused = conforms(api.post(ENDPOINTS, json={"url": "https://10.0.0.1/", "name": "x",
                                                     "event_types": ["batch.completed"]}), (ENDPOINTS, "post"), 400)
        assert "private" in refused["error"]["message"]
        conforms(api.delete(path), (ENDPOINT, "delete"), 200)
        conforms(api.get(path), (ENDPOINT, "get"), 404)
    finally:
        server.shutdown()
        server.server_close()
