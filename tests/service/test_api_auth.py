"""Who may call the API, on moto: a missing, unknown, revoked or expired key, or one of a
suspended account, is 401 on every endpoint (as a bearer token or an `x-api-key`), naming what is
wrong; an account outside the internal tier is 403 on create but still reads, lists, cancels and
deletes its batches.

Cases are grouped (one harness per group, every mismatch reported at once) to keep this fast.
"""

from __future__ import annotations

import pytest
from freeinference_batch import accounts
from freeinference_batch.core import clock

from tests.service.helpers import Checker, other_key, req


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
        ("POST", f"/v1/batches/batch_{'0' * 32}/retry", None),
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
