"""The client and CLI never print a presigned link's query (issue 21): urllib3's error text
carries the full URL, signature and credential included; S3's error XML quotes the signed
request. Every error the client raises, and so every one the CLI prints, has them redacted."""

from __future__ import annotations

import time

import pytest
import requests
from click.testing import CliRunner
from freeinference_batch_client import client as client_module
from freeinference_batch_client.cli import main, results
from freeinference_batch_client.client import BatchApiError, BatchClientError, redact
from urllib3.exceptions import MaxRetryError, NewConnectionError

from tests.client.helpers import BATCH_ID, make, page, response, result_json

SECRET = "SiGnAtUrE0123456789abcdef"
LINK = ("https://bucket.s3.amazonaws.com/batch_x/responses/000000001/t.json.gz?X-Amz-Algorithm=AWS4-HMAC-SHA256"
        f"&X-Amz-Credential=ASIAEXAMPLE%2F20261204%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Security-Token=TOKEN{SECRET}"
        f"&X-Amz-Signature={SECRET}")


def unreachable() -> requests.ConnectionError:
    """What requests raises when S3 cannot be reached: urllib3's text holds the path and query."""
    path = LINK.split(".com", 1)[1]
    reason = NewConnectionError(None, "Failed to establish a new connection")  # type: ignore[arg-type]
    return requests.ConnectionError(MaxRetryError(None, path, reason))  # type: ignore[arg-type]


def linked_page() -> dict:
    linked = result_json(1001)
    linked["response"] = {"status_code": 200, "request_id": "r", "body": None, "body_url": LINK}
    return page([linked])


def test_redact_removes_query_strings_and_signing_parameters_only():
    plain = LINK.split("?")[0]
    assert redact(f"GET {LINK} failed") == f"GET {plain}?<redacted> failed"
    assert SECRET not in redact(f"X-Amz-Signature={SECRET} and Signature={SECRET}")
    # Plain prose is left alone
    assert redact("Is the batch done? Not yet.") == "Is the batch done? Not yet."


def test_redact_is_linear_on_text_of_many_question_marks_or_signing_prefixes():
    # Text a server may echo back: 20,000 `?` with no `=` after them, and a run of 5,000 `X-Amz-`
    # (each regex start rescanned to the end: 3 to 4 s each before, 60 s at 4 times the size)
    for text, kept in (("?" * 20_000, True), ("X-Amz-" * 5_000, True), ("X-Amz-" * 5_000 + "=v", False)):
        started = time.monotonic()
        redacted = redact(text)
        assert time.monotonic() - started < 1, text[:20]
        assert (redacted == text) is kept
    # And it redacts what it did: a query after a run of `?`, a name after many hyphens
    assert redact("?" * 1000 + "a=b c") == "?<redacted> c"
    assert redact("x" + "-" * 1000 + f"Signature={SECRET}&y=1") == "x" + "-" * 1000 + "Signature=<redacted>&y=1"


def test_a_result_link_that_cannot_be_fetched_raises_an_error_without_its_signature():
    client, _, _ = make(response(200, linked_page()), *[unreachable()] * 6)
    with pytest.raises(BatchClientError) as caught:
        client.results(BATCH_ID)
    text = str(caught.value)
    assert SECRET not in text and "X-Amz-Credential" not in text and "Max retries exceeded" in text


def test_an_s3_refusal_shows_its_code_not_the_signed_request_it_quotes():
    xml = (f"<Error><Code>AccessDenied</Code><Message>Request has expired</Message><X-Amz-Expires>3600"
           "</X-Amz-Expires><CanonicalRequest>GET /x X-Amz-Credential=ASIAEXAMPLE"
           f"&amp;X-Amz-Security-Token=TOKEN{SECRET}"
           "</CanonicalRequest></Error>").encode()
    refused = response(403, raw=xml, headers={"Content-Type": "application/xml"})
    client, _, _ = make(response(200, linked_page()), refused)
    with pytest.raises(BatchApiError) as caught:
        client.results(BATCH_ID)
    assert caught.value.message == "Fetching a result body failed: AccessDenied"
    assert SECRET not in str(caught.value) and "ASIA" not in str(caught.value)


def test_an_api_error_quoting_a_url_is_redacted_too():
    error = BatchApiError(502, None, f"Bad gateway for {LINK}")
    assert SECRET not in error.message and SECRET not in str(error)


def test_the_cli_prints_the_error_without_the_links_signature(monkeypatch, tmp_path):
    # Given a batch whose result is a link that cannot be fetched
    client, _, _ = make(response(200, {"id": BATCH_ID, "object": "batch", "status": "completed",
                                       "request_counts": {"total": 1, "completed": 1, "failed": 0},
                                       "created_at": 1, "endpoint": "/v1/chat/completions",
                                       "completion_window": "24h"}),
                        response(200, linked_page()), *[unreachable()] * 6)
    monkeypatch.setattr(results, "make_client", lambda: client)
    monkeypatch.setenv(client_module.API_KEY_ENV, "hyi-test")
    # When `results` writes the output file
    result = CliRunner().invoke(main, ["results", BATCH_ID, "-o", str(tmp_path / "out.jsonl")])
    # Then it fails with one line that names what failed, and no signature or credential
    assert result.exit_code != 0
    assert "Max retries exceeded" in result.output
    assert SECRET not in result.output and "X-Amz-Credential" not in result.output
