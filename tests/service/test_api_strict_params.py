"""`limit` and `after` take exactly what the spec and openapi.yaml say, nothing a lenient parser
would also read: ASCII digits for `limit` and a result id's number, no padding, signs,
underscores, other scripts' digits or trailing newlines, and no empty value. Each refusal is a
400 `invalid_request` naming the parameter, and changes nothing."""

from __future__ import annotations

from urllib.parse import quote

import pytest

from tests.conftest import sample_request

LIMITS = ["1_0", " +5 ", "+5", "5 ", "\u0661\u0660", "\uff15", "", "5\n", "0x10", "1e2", "-1"]


@pytest.fixture
def finished(harness) -> dict:
    batch = harness.create([sample_request("q-1"), sample_request("q-2")])
    return harness.run_to_final(batch["id"])


def refused(harness, path: str, name: str, value: str) -> dict:
    status, body = harness.call("GET", f"{path}?{name}={quote(value, safe='')}")
    assert status == 400, (value, body)
    assert body["error"]["code"] == "invalid_request" and body["error"]["param"] == name, body
    assert name in body["error"]["message"]
    return body


@pytest.mark.parametrize("value", LIMITS)
def test_limit_is_ascii_digits_only(harness, finished, value):
    refused(harness, "/v1/batches", "limit", value)
    refused(harness, f"/v1/batches/{finished['id']}/results", "limit", value)


def test_limit_in_ascii_digits_is_taken_leading_zeros_and_all(harness, finished):
    status, page = harness.call("GET", "/v1/batches?limit=001")
    assert status == 200 and len(page["data"]) == 1, page
    status, page = harness.call("GET", f"/v1/batches/{finished['id']}/results?limit=0001")
    assert status == 200 and len(page["data"]) == 1 and page["has_more"], page
    # A number too long for any limit is out of range, not a server error
    body = refused(harness, "/v1/batches", "limit", "9" * 5000)
    assert "from 1 to 100" in body["error"]["message"]


def test_after_of_the_results_is_a_result_id_in_ascii_digits(harness, finished):
    first = harness.results(finished["id"])[0]["id"]
    number = first.removeprefix("batch_req_")
    path = f"/v1/batches/{finished['id']}/results"
    for value in ["", first + "\n", "batch_req_" + number.translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")),
                  " " + first, first + " "]:
        refused(harness, path, "after", value)
    status, page = harness.call("GET", f"{path}?after={first}")
    assert status == 200 and page["data"][0]["custom_id"] == "q-2", page


def test_after_of_the_list_is_a_batch_id(harness, finished):
    for value in ["", finished["id"] + "\n", " " + finished["id"]]:
        refused(harness, "/v1/batches", "after", value)
    status, page = harness.call("GET", f"/v1/batches?after={finished['id']}")
    assert status == 200 and page["data"] == [], page
