"""The API's answers to bad reads, on moto (the spec's "Errors" table): a bad `limit` or `after`
is 400, a batch that does not exist or is another account's is 404 on every endpoint (the same
answer for both, and never listed), and batch inference switched off is 404 saying so. Every
answer names what is wrong; none is a 5xx.

Cases are grouped (one harness per group, every mismatch reported at once) to keep this fast.
"""

from __future__ import annotations

from tests.service.helpers import Checker, list_all, other_key, req


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
            ("POST", f"/v1/batches/{batch_id}/retry"),
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
    for method, suffix in (("GET", ""), ("GET", "/results"), ("POST", "/cancel"), ("POST", "/retry"), ("DELETE", "")):
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
