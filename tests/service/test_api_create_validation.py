"""The API's answers to bad input, on moto (the spec's "Errors" table and issue 2's list).

Every bad input gets its status *and* a message that names what is wrong; none of them changes
anything (the account's batches and its unfinished-batch count stay as they were); no 5xx ever.
Also: the batch object's fields, results and list paging, as the spec shows them.

Cases are grouped (one harness per group, every mismatch reported at once) to keep this fast.
"""

from __future__ import annotations

import gzip
import json
import re
from typing import Any

import pytest
from freeinference_batch import accounts
from freeinference_batch.core import clock
from freeinference_batch_local.handlers import load_module, repo_root

from tests.conftest import sample_request

SPEC_EXAMPLE_MESSAGE = "requests[1] (custom_id 'q-2'): Model 'no-such-model' not found"
# The batch object of the spec's "Create a batch" answer: every field, in the spec's order.
SPEC_BATCH_FIELDS = [
    "id",
    "object",
    "endpoint",
    "errors",
    "input_file_id",
    "completion_window",
    "status",
    "output_file_id",
    "error_file_id",
    "created_at",
    "in_progress_at",
    "expires_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
    "request_counts",
    "metadata",
    "cost_usd",
    "error",
]
ALWAYS_NULL = ("errors", "input_file_id", "output_file_id", "error_file_id", "finalizing_at")
TIMESTAMPS = ("in_progress_at", "completed_at", "failed_at", "expired_at", "cancelling_at", "cancelled_at")
RESULT_FIELDS = {"id", "custom_id", "status", "response", "error"}
ERROR_FIELDS = {"message", "type", "code", "param"}


@pytest.fixture(autouse=True)
def _one_worker_thread(monkeypatch):
    """moto in-process is not thread-safe (a cancelled transaction restores a snapshot of the whole
    table, undoing another thread's writes), so the worker runs its records one at a time here."""
    module = load_module(repo_root() / "functions" / "worker" / "app.py")
    monkeypatch.setattr(module, "RECORD_THREADS", 1)


# ---- helpers ------------------------------------------------------------------------------


def req(custom_id: Any = "q-0", **changes: Any) -> dict:
    """A valid request line, with fields replaced (`body=...`) or removed (`field=DROP`)."""
    line = sample_request(custom_id)
    if custom_id is DROP:
        del line["custom_id"]
    for name, value in changes.items():
        if value is DROP:
            line.pop(name, None)
        else:
            line[name] = value
    return line


def body_with(**changes: Any) -> dict:
    body = {"model": "glm-5.3-flash", "messages": [{"role": "user", "content": "Say hello."}]}
    for name, value in changes.items():
        if value is DROP:
            body.pop(name, None)
        else:
            body[name] = value
    return body


DROP = object()


class Checker:
    """Calls the API through the harness, never accepting a 5xx, and collects every mismatch."""

    def __init__(self, harness) -> None:
        self.harness = harness
        self.problems: list[str] = []

    def call(self, method: str, path: str, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
        status, answer = self.harness.call(method, path, body, **kwargs)
        assert status < 500, f"{method} {path} -> {status} {answer}"
        return status, answer

    def expect(
        self,
        label: str,
        status: int,
        method: str,
        path: str,
        body: Any = None,
        *,
        contains: tuple[str, ...] = (),
        equals: str | None = None,
        **kwargs: Any,
    ) -> dict | None:
        got, answer = self.call(method, path, body, **kwargs)
        if got != status:
            self.problems.append(f"{label}: expected {status}, got {got}: {answer}")
            return None
        error = answer.get("error") if isinstance(answer, dict) else None
        if not isinstance(error, dict) or set(error) != ERROR_FIELDS or not isinstance(error["message"], str):
            self.problems.append(f"{label}: error body is not {{'error': {sorted(ERROR_FIELDS)}}}: {answer}")
            return None
        message = error["message"]
        if equals is not None and message != equals:
            self.problems.append(f"{label}: message {message!r} != {equals!r}")
        missing = [fragment for fragment in contains if fragment.lower() not in message.lower()]
        if missing:
            self.problems.append(f"{label}: message {message!r} does not mention {missing}")
        return error

    def create_error(
        self, label: str, status: int, document: Any = None, *, raw: bytes | None = None, **kwargs: Any
    ) -> dict | None:
        return self.expect(label, status, "POST", "/v1/batches", document, raw=raw, **kwargs)

    def done(self) -> None:
        assert not self.problems, "\n".join(self.problems)


def list_all(harness, key: str | None = None) -> list[dict]:
    status, page = harness.call("GET", "/v1/batches?limit=100", key=key)
    assert status == 200, page
    return page["data"]


def other_key(harness, account: str, tier: str = "internal", **kwargs: Any) -> str:
    return accounts.create_key(harness.settings, account, tier=tier, **kwargs)


# The bad request lines: (label, requests, status, fragments the message must contain).
BAD_REQUEST_LINES: list[tuple[str, list, tuple[str, ...]]] = [
    ("custom_id empty", [req("")], ("requests[0]", "custom_id", "512")),
    ("custom_id of 513 characters", [req("x" * 513)], ("requests[0]", "custom_id", "512")),
    ("custom_id missing", [req(DROP)], ("requests[0]", "custom_id")),
    ("custom_id not a string", [req(42)], ("requests[0]", "custom_id")),
    ("custom_id repeated", [req("a"), req("b"), req("a")], ("requests[2]", "custom_id 'a'", "unique")),
    ("method GET", [req(method="GET")], ("requests[0] (custom_id 'q-0')", "method", "POST")),
    ("method lowercase post", [req(method="post")], ("requests[0] (custom_id 'q-0')", "method", "POST")),
    (
        "url another endpoint",
        [req(url="/v1/embeddings")],
        ("requests[0] (custom_id 'q-0')", "url", "/v1/chat/completions"),
    ),
    ("url without /v1", [req(url="/chat/completions")], ("requests[0] (custom_id 'q-0')", "url")),
    ("body missing", [req(body=DROP)], ("requests[0] (custom_id 'q-0')", "body")),
    ("body a string", [req(body="Say hello.")], ("requests[0] (custom_id 'q-0')", "body")),
    ("body an array", [req(body=[body_with()])], ("requests[0] (custom_id 'q-0')", "body")),
    ("body.model missing", [req(body=body_with(model=DROP))], ("requests[0] (custom_id 'q-0')", "model")),
    ("body.model not a string", [req(body=body_with(model=7))], ("requests[0] (custom_id 'q-0')", "model")),
    (
        "unknown model",
        [req(body=body_with(model="no-such-model"))],
        ("requests[0] (custom_id 'q-0')", "Model 'no-such-model' not found"),
    ),
    ("model auto", [req(body=body_with(model="auto"))], ("requests[0] (custom_id 'q-0')", "'auto'", "batch")),
    (
        "model auto-<tier>",
        [req(body=body_with(model="auto-fast"))],
        ("requests[0] (custom_id 'q-0')", "'auto-fast'", "batch"),
    ),
    (
        "model auto-internal",
        [req(body=body_with(model="auto-internal"))],
        ("requests[0] (custom_id 'q-0')", "'auto-internal'"),
    ),
    ("messages empty", [req(body=body_with(messages=[]))], ("requests[0] (custom_id 'q-0')", "messages")),
    ("messages missing", [req(body=body_with(messages=DROP))], ("requests[0] (custom_id 'q-0')", "messages")),
    ("messages not an array", [req(body=body_with(messages="hi"))], ("requests[0] (custom_id 'q-0')", "messages")),
    ("stream true", [req(body=body_with(stream=True))], ("requests[0] (custom_id 'q-0')", "stream")),
    ("stream not a boolean", [req(body=body_with(stream="yes"))], ("requests[0] (custom_id 'q-0')", "stream")),
    ("request not an object", ["q-0"], ("requests[0]",)),
    ("request with an unknown field", [req(extra=1)], ("requests[0] (custom_id 'q-0')", "extra")),
    (
        "the fault is in the fourth request",
        [req("a"), req("b"), req("c"), req("d", url="/v1/x")],
        ("requests[3] (custom_id 'd')", "url"),
    ),
]

# Bad envelopes: (label, document, fragments).
BAD_ENVELOPES: list[tuple[str, Any, tuple[str, ...]]] = [
    ("zero requests", {"requests": []}, ("at least one",)),
    ("requests missing", {"metadata": {"a": "b"}}, ("requests",)),
    ("requests not an array", {"requests": {"custom_id": "q-0"}}, ("requests", "array")),
    ("requests null", {"requests": None}, ("requests",)),
    ("body a JSON array", [req()], ("object",)),
    ("body a JSON string", "requests", ("object",)),
    ("body JSON null", None, ("object",)),
    ("metadata of 17 pairs", {"requests": [req()], "metadata": {f"k{i}": "v" for i in range(17)}}, ("metadata", "16")),
    ("metadata key of 65 characters", {"requests": [req()], "metadata": {"k" * 65: "v"}}, ("metadata", "64")),
    ("metadata value of 513 characters", {"requests": [req()], "metadata": {"k": "v" * 513}}, ("metadata", "512")),
    ("metadata value a number", {"requests": [req()], "metadata": {"k": 5}}, ("metadata", "string")),
    ("metadata value null", {"requests": [req()], "metadata": {"k": None}}, ("metadata", "string")),
    ("metadata an array", {"requests": [req()], "metadata": ["k", "v"]}, ("metadata",)),
]

NOT_JSON_BODIES: list[tuple[str, bytes]] = [
    ("truncated JSON", b'{"requests": ['),
    ("not JSON at all", b"requests=q-1"),
    ("empty body", b""),
    ("not UTF-8", b'{"requests": "\xff\xfe"}'),
]


# ---- authentication ------------------------------------------------------------------------


@pytest.mark.parametrize("style", ["bearer", "x-api-key"])
def test_missing_unknown_revoked_and_expired_keys_are_401(harness, style):
    settings = harness.settings
    revoked = other_key(harness, "acct-revoked")
    accounts.revoke_key(settings, revoked)
    expired = other_key(harness, "acct-expired", expires_at=clock.now(settings.clock_offset_file) - 1)
    suspended = other_key(harness, "acct-suspended")
    accounts.set_account(settings, "acct-suspended", status="suspended")

    def headers(key: str) -> dict:
        return {"authorization": f"Bearer {key}"} if style == "bearer" else {"x-api-key": key}

    check = Checker(harness)
    cases = [
        ("missing", {}, ("missing", "api key")),
        ("unknown", headers("hyi-" + "u" * 43), ("invalid",)),
        ("not a FreeInference key", headers("sk-not-a-key"), ("invalid",)),
        ("revoked", headers(revoked), ("revoked",)),
        ("expired", headers(expired), ("expired",)),
        ("suspended account", headers(suspended), ("suspended",)),
    ]
    endpoints = [
        ("POST", "/v1/batches", {"requests": [req()]}),
        ("GET", "/v1/batches", None),
        ("GET", f"/v1/batches/batch_{'0' * 32}", None),
        ("GET", f"/v1/batches/batch_{'0' * 32}/results", None),
        ("POST", f"/v1/batches/batch_{'0' * 32}/cancel", None),
        ("DELETE", f"/v1/batches/batch_{'0' * 32}", None),
    ]
    for label, sent, fragments in cases:
        for method, path, body in endpoints:
            error = check.expect(
                f"{style} {label} {method} {path}", 401, method, path, body, key=False, headers=sent, contains=fragments
            )
            if error and error["type"] != "authentication_error":
                check.problems.append(f"{label}: error type {error['type']!r}")
    check.done()
    # The valid key works with this header style.
    status, answer = harness.call("GET", "/v1/batches", key=False, headers=headers(harness.key))
    assert status == 200, answer


def test_authorization_without_bearer_is_401(harness):
    check = Checker(harness)
    check.expect(
        "Basic scheme",
        401,
        "GET",
        "/v1/batches",
        key=False,
        headers={"authorization": f"Basic {harness.key}"},
        contains=("api key",),
    )
    check.expect(
        "Bearer without a key",
        401,
        "GET",
        "/v1/batches",
        key=False,
        headers={"authorization": "Bearer "},
        contains=("api key",),
    )
    check.done()


def test_non_internal_account_gets_403_on_create_but_reads_lists_cancels_and_deletes(harness):
    # Given an internal account with two batches, later moved to the standard tier
    key = other_key(harness, "acct-downgraded")
    kept = harness.call("POST", "/v1/batches", {"requests": [req()]}, key=key)[1]
    doomed = harness.call("POST", "/v1/batches", {"requests": [req()]}, key=key)[1]
    accounts.set_account(harness.settings, "acct-downgraded", tier="standard")
    standard = other_key(harness, "acct-standard", tier="standard")
    check = Checker(harness)
    # Then creating is 403 for both standard keys, with a message saying why
    for label, who in (("standard account", standard), ("downgraded account", key)):
        error = check.create_error(label, 403, {"requests": [req()]}, key=who, contains=("internal",))
        if error and error["type"] != "permission_error":
            check.problems.append(f"{label}: error type {error['type']!r}")
    check.done()
    # And reading, listing, cancelling and deleting still work
    status, page = harness.call("GET", "/v1/batches", key=standard)
    assert status == 200 and page["data"] == [], page
    status, page = harness.call("GET", "/v1/batches", key=key)
    assert status == 200 and {b["id"] for b in page["data"]} == {kept["id"], doomed["id"]}, page
    status, batch = harness.call("GET", f"/v1/batches/{kept['id']}", key=key)
    assert status == 200 and batch["id"] == kept["id"], batch
    status, results = harness.call("GET", f"/v1/batches/{kept['id']}/results", key=key)
    assert status == 200 and [r["custom_id"] for r in results["data"]] == ["q-0"], results
    status, cancelled = harness.call("POST", f"/v1/batches/{kept['id']}/cancel", key=key)
    assert status == 200 and cancelled["status"] == "cancelled", cancelled
    status, deleted = harness.call("DELETE", f"/v1/batches/{doomed['id']}", key=key)
    assert status == 200 and deleted == {"id": doomed["id"], "object": "batch.deleted", "deleted": True}, deleted


# ---- validation of the create body -----------------------------------------------------------


def test_every_bad_request_line_is_400_naming_the_request_at_fault(harness):
    check = Checker(harness)
    for label, lines, fragments in BAD_REQUEST_LINES:
        error = check.create_error(label, 400, {"requests": lines}, contains=fragments)
        if error and error["type"] != "invalid_request_error":
            check.problems.append(f"{label}: error type {error['type']!r}")
    check.done()


def test_spec_example_message_for_an_unknown_model(harness):
    # The spec's own example: the second request names a model that does not exist.
    document = {
        "requests": [
            req("q-1"),
            req("q-2", body={"model": "no-such-model", "messages": [{"role": "user", "content": "Hi"}]}),
        ]
    }
    check = Checker(harness)
    check.create_error("spec example", 400, document, equals=SPEC_EXAMPLE_MESSAGE)
    check.done()


def test_every_bad_envelope_is_400_naming_what_is_wrong(harness):
    check = Checker(harness)
    for label, document, fragments in BAD_ENVELOPES:
        check.create_error(label, 400, raw=json.dumps(document).encode(), contains=fragments)
    for label, raw in NOT_JSON_BODIES:
        check.create_error(label, 400, raw=raw, contains=("JSON",))
    check.done()


def test_valid_edge_values_are_accepted(harness):
    # The limits themselves are allowed; method and url may be left out; stream false is fine.
    document = {
        "requests": [
            req("x" * 512),
            req("a"),
            {"custom_id": "defaults", "body": body_with()},
            req("no-stream", body=body_with(stream=False)),
            req("other-model", body=body_with(model="qwen3.6-35b", max_tokens=50)),
        ],
        "metadata": {**{f"k{i}": "v" for i in range(15)}, "k" * 64: "v" * 512},
    }
    status, batch = harness.call("POST", "/v1/batches", document)
    assert status == 200, batch
    assert batch["request_counts"]["total"] == 5
    assert batch["metadata"] == document["metadata"]


def test_a_model_the_tier_may_not_use_reads_exactly_like_an_unknown_one(harness, tmp_path):
    # Given a catalog with a model only the standard tier may use
    catalog = json.loads((repo_root() / "layers/batch_core/freeinference_batch/core/models.json").read_text())
    catalog["models"]["hidden-model-x"] = {**catalog["models"]["glm-5.3-flash"], "tiers": ["standard"]}
    path = tmp_path / "models.json"
    path.write_text(json.dumps(catalog))
    harness.configure(MODEL_CATALOG_PATH=str(path))

    def attempt(model: str) -> tuple[int, dict]:
        return harness.call("POST", "/v1/batches", {"requests": [req("q-1"), req("q-2", body=body_with(model=model))]})

    # When the internal key names it, and a model that does not exist (same length of name)
    hidden_status, hidden = attempt("hidden-model-x")
    unknown_status, unknown = attempt("absent-model-x")
    # Then both answers are the same but for the name
    assert hidden_status == unknown_status == 400, (hidden, unknown)
    assert hidden["error"]["message"] == "requests[1] (custom_id 'q-2'): Model 'hidden-model-x' not found"
    assert json.dumps(hidden).replace("hidden-model-x", "M") == json.dumps(unknown).replace("absent-model-x", "M")
    # And the catalog really is in use: its other models still work
    status, batch = harness.call("POST", "/v1/batches", {"requests": [req("q-1")]})
    assert status == 200, batch


def test_more_requests_than_the_limit_is_400(harness):
    harness.configure(BATCH_MAX_REQUESTS=3)
    check = Checker(harness)
    check.create_error("4 requests, limit 3", 400, {"requests": [req(f"q-{i}") for i in range(4)]}, contains=("3", "4"))
    check.done()
    status, batch = harness.call("POST", "/v1/batches", {"requests": [req(f"q-{i}") for i in range(3)]})
    assert status == 200 and batch["request_counts"]["total"] == 3, batch


def test_body_over_the_size_limit_is_413_plain_or_gzipped(harness):
    harness.configure(BATCH_MAX_BODY_BYTES=4096)
    small = json.dumps({"requests": [req(f"q-{i}") for i in range(3)]}).encode()
    large = json.dumps(
        {
            "requests": [
                req(f"q-{i}", body=body_with(messages=[{"role": "user", "content": "a" * 200}])) for i in range(30)
            ]
        }
    ).encode()
    assert len(small) < 4096 < len(large)
    packed = gzip.compress(large)
    assert len(packed) < 4096  # small on the wire; the limit applies decompressed
    check = Checker(harness)
    check.create_error("plain body over the limit", 413, raw=large, contains=("4096",))
    check.create_error(
        "gzip body over the limit once decompressed",
        413,
        raw=packed,
        headers={"content-encoding": "gzip"},
        contains=("4096",),
    )
    check.create_error(
        "gzip header on data that is not gzip", 400, raw=small, headers={"content-encoding": "gzip"}, contains=("gzip",)
    )
    check.done()
    # A gzipped body within the limit is accepted like a plain one
    status, batch = harness.call("POST", "/v1/batches", raw=gzip.compress(small), headers={"content-encoding": "gzip"})
    assert status == 200 and batch["request_counts"]["total"] == 3, batch
    status, results = harness.call("GET", f"/v1/batches/{batch['id']}/results")
    assert [r["custom_id"] for r in results["data"]] == ["q-0", "q-1", "q-2"]


def test_a_large_gzipped_batch_is_accepted(harness):
    # Default limit: ~2 MB of JSON travels as a small gzip body.
    document = {
        "requests": [
            req(f"q-{i}", body=body_with(messages=[{"role": "user", "content": "word " * 40}])) for i in range(5000)
        ]
    }
    raw = json.dumps(document).encode()
    status, batch = harness.call("POST", "/v1/batches", raw=gzip.compress(raw), headers={"content-encoding": "gzip"})
    assert status == 200 and batch["request_counts"]["total"] == 5000, batch


def test_too_many_unfinished_batches_is_429_until_one_finishes(harness):
    harness.configure(BATCH_MAX_UNFINISHED=2)
    first = harness.create([req()])
    harness.create([req()])
    check = Checker(harness)
    error = check.create_error("third unfinished batch", 429, {"requests": [req()]}, contains=("unfinished", "2"))
    check.done()
    assert error["type"] == "rate_limit_error"
    # The refused create left nothing behind
    assert len(list_all(harness)) == 2
    # Once one is cancelled there is room again
    status, cancelled = harness.call("POST", f"/v1/batches/{first['id']}/cancel")
    assert status == 200 and cancelled["status"] == "cancelled", cancelled
    status, third = harness.call("POST", "/v1/batches", {"requests": [req()]})
    assert status == 200, third
    assert harness.call("POST", "/v1/batches", {"requests": [req()]})[0] == 429


def test_completion_window_sent_is_ignored(harness):
    batch = harness.create([req()], completion_window="1h")
    assert batch["completion_window"] == "24h"
    assert batch["expires_at"] == batch["created_at"] + 86400
    harness.configure(BATCH_COMPLETION_WINDOW_SECONDS=7200)
    batch = harness.create([req()], completion_window="24h")
    assert batch["completion_window"] == "2h"
    assert batch["expires_at"] == batch["created_at"] + 7200


# ---- reading: limits, after, not found ---------------------------------------------------------


def test_bad_limit_and_after_are_400_and_unknown_batches_404(harness):
    batch = harness.create([req("q-0"), req("q-1")])
    results = f"/v1/batches/{batch['id']}/results"
    check = Checker(harness)
    for value in ("0", "1001", "-1", "abc", "1.5"):
        check.expect(f"results limit={value}", 400, "GET", f"{results}?limit={value}", contains=("limit", "1000"))
    for value in ("0", "101", "x"):
        check.expect(f"list limit={value}", 400, "GET", f"/v1/batches?limit={value}", contains=("limit", "100"))
    for value in ("garbage", "batch_req_", "batch_req_abc", "42", "req_1000", batch["id"]):
        check.expect(f"results after={value}", 400, "GET", f"{results}?after={value}", contains=("after",))
    check.expect("list after=garbage", 400, "GET", "/v1/batches?after=garbage", contains=("after",))
    for batch_id in (f"batch_{'0' * 32}", "batch_nope", "nothing", batch["id"] + "0"):
        for method, path in (
            ("GET", f"/v1/batches/{batch_id}"),
            ("GET", f"/v1/batches/{batch_id}/results"),
            ("POST", f"/v1/batches/{batch_id}/cancel"),
            ("DELETE", f"/v1/batches/{batch_id}"),
        ):
            error = check.expect(f"{method} {path}", 404, method, path, contains=("not found",))
            if error and error["type"] != "not_found_error":
                check.problems.append(f"{method} {path}: error type {error['type']!r}")
    check.done()
    # The bounds themselves are fine
    assert harness.call("GET", f"{results}?limit=1000")[0] == 200
    assert harness.call("GET", f"{results}?limit=1")[0] == 200
    assert harness.call("GET", "/v1/batches?limit=100")[0] == 200
    assert harness.call("GET", "/v1/batches?limit=1")[0] == 200


def test_another_accounts_batch_is_not_found_everywhere_and_not_listed(harness):
    # Given a batch of acct-1 and a key of another account
    mine = harness.create([req("q-0"), req("q-1")])
    stranger = other_key(harness, "acct-stranger")
    own = harness.call("POST", "/v1/batches", {"requests": [req()]}, key=stranger)[1]
    check = Checker(harness)
    nowhere = f"batch_{'0' * 32}"
    # Then every endpoint answers 404 to the stranger, as for a batch that does not exist
    for method, suffix in (("GET", ""), ("GET", "/results"), ("POST", "/cancel"), ("DELETE", "")):
        error = check.expect(
            f"stranger {method} {suffix}",
            404,
            method,
            f"/v1/batches/{mine['id']}{suffix}",
            key=stranger,
            contains=("not found",),
        )
        _, absent = harness.call(method, f"/v1/batches/{nowhere}{suffix}", key=stranger)
        if error and error["message"].replace(mine["id"], "X") != absent["error"]["message"].replace(nowhere, "X"):
            check.problems.append(f"{method} {suffix}: {error} differs from a missing batch's {absent}")
    check.done()
    # And the stranger's list holds only its own batch; the owner's batch is untouched
    assert [b["id"] for b in list_all(harness, stranger)] == [own["id"]]
    assert mine["id"] not in {b["id"] for b in list_all(harness, stranger)}
    status, after = harness.call("GET", f"/v1/batches/{mine['id']}")
    assert status == 200 and after == mine, after
    # The owner cannot reach the stranger's batch either
    assert harness.call("GET", f"/v1/batches/{own['id']}")[0] == 404
    assert own["id"] not in {b["id"] for b in list_all(harness)}


def test_no_bad_input_changes_anything(harness):
    # Given an account with one batch and room for exactly one more unfinished batch
    harness.configure(BATCH_MAX_UNFINISHED=2, BATCH_MAX_REQUESTS=5, BATCH_MAX_BODY_BYTES=50_000)
    existing = harness.create([req("q-0")], metadata={"who": "me"})
    before = list_all(harness)
    results_before = harness.results(existing["id"])
    # When every bad create of this module is sent
    check = Checker(harness)
    for label, lines, _ in BAD_REQUEST_LINES:
        check.create_error(label, 400, {"requests": lines})
    for label, document, _ in BAD_ENVELOPES:
        check.create_error(label, 400, raw=json.dumps(document).encode())
    for label, raw in NOT_JSON_BODIES:
        check.create_error(label, 400, raw=raw)
    check.create_error("too many requests", 400, {"requests": [req(f"q-{i}") for i in range(6)]})
    check.create_error("too large", 413, raw=b'{"requests": [' + b" " * 50_000 + b"]}")
    check.create_error("too large gzipped", 413, raw=gzip.compress(b" " * 60_000), headers={"content-encoding": "gzip"})
    check.create_error(
        "spec example", 400, {"requests": [req("q-1"), req("q-2", body=body_with(model="no-such-model"))]}
    )
    check.expect("bad after", 400, "GET", f"/v1/batches/{existing['id']}/results?after=nope")
    check.expect("bad limit", 400, "GET", "/v1/batches?limit=0")
    check.expect("no key", 401, "POST", "/v1/batches", {"requests": [req()]}, key=False)
    check.done()
    # Then the account's batches read exactly as before
    assert list_all(harness) == before
    assert harness.results(existing["id"]) == results_before
    # And its unfinished count did not move: exactly one more batch fits
    status, batch = harness.call("POST", "/v1/batches", {"requests": [req()]})
    assert status == 200, batch
    assert harness.call("POST", "/v1/batches", {"requests": [req()]})[0] == 429


# ---- the batch object and paging ---------------------------------------------------------------


def assert_batch_object(batch: dict) -> None:
    assert list(batch) == SPEC_BATCH_FIELDS or set(batch) == set(SPEC_BATCH_FIELDS), sorted(batch)
    assert re.fullmatch(r"batch_[0-9a-f]{32}", batch["id"]), batch["id"]
    assert batch["object"] == "batch"
    assert batch["endpoint"] == "/v1/chat/completions"
    for name in ALWAYS_NULL:
        assert batch[name] is None, name
    assert isinstance(batch["created_at"], int) and isinstance(batch["expires_at"], int)
    for name in TIMESTAMPS:
        assert batch[name] is None or isinstance(batch[name], int), (name, batch[name])
    assert set(batch["request_counts"]) == {"total", "completed", "failed"}
    assert all(isinstance(v, int) for v in batch["request_counts"].values())
    assert isinstance(batch["cost_usd"], float)
    assert batch["metadata"] is None or all(isinstance(v, str) for v in batch["metadata"].values())


def test_batch_object_has_every_field_of_the_spec(harness):
    before = int(clock.now(harness.settings.clock_offset_file))
    batch = harness.create(
        [req("q-1"), req("q-2", body=body_with(model="qwen3.6-35b", max_tokens=50))], metadata={"project": "eval-42"}
    )
    after = int(clock.now(harness.settings.clock_offset_file))
    assert_batch_object(batch)
    assert batch["status"] == "validating"
    assert before <= batch["created_at"] <= after
    assert batch["expires_at"] == batch["created_at"] + 86400
    assert batch["completion_window"] == "24h"
    for name in TIMESTAMPS:
        assert batch[name] is None, name
    assert batch["request_counts"] == {"total": 2, "completed": 0, "failed": 0}
    assert batch["metadata"] == {"project": "eval-42"}
    assert batch["cost_usd"] == 0.0 and batch["error"] is None
    # GET answers the same object
    assert harness.batch(batch["id"]) == batch
    # Once it has run: its timestamps and cost
    final = harness.run_to_final(batch["id"])
    assert_batch_object(final)
    assert final["status"] == "completed"
    assert final["created_at"] <= final["in_progress_at"] <= final["completed_at"]
    assert final["failed_at"] is final["expired_at"] is final["cancelling_at"] is final["cancelled_at"] is None
    assert final["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
    assert final["cost_usd"] > 0 and final["error"] is None
    assert final["expires_at"] == batch["expires_at"] and final["metadata"] == batch["metadata"]
    # A batch without metadata reads metadata null
    assert harness.create([req()])["metadata"] is None


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


def test_batch_inference_unavailable_is_404_saying_so(harness):
    batch = harness.create([req()])
    harness.configure(BATCH_API_ENABLED="false")
    check = Checker(harness)
    for method, path in (("GET", "/v1/batches"), ("GET", f"/v1/batches/{batch['id']}"), ("POST", "/v1/batches")):
        check.expect(
            f"{method} {path} while unavailable", 404, method, path, {"requests": [req()]}, contains=("unavailable",)
        )
    check.done()
    harness.configure(BATCH_API_ENABLED="true")
    assert harness.batch(batch["id"]) == batch
