"""`results` of a batch created from a file (issue 32): the output and error files' content is
what the CLI writes, merged back into input order; an inline batch's results still come from its
pages."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
from click.testing import CliRunner
from freeinference_batch_client.cli import main
from freeinference_batch_client.cli import results as result_commands
from freeinference_batch_client.client import BatchClient

from tests.client.helpers import BATCH_ID, batch_json, page, response, result_json

OUTPUT, ERRORS = "file-out", "file-err"


def ok(number: int) -> dict:
    return {"id": f"batch_req_{number}", "custom_id": f"q-{number}", "error": None,
            "response": {"status_code": 200, "request_id": f"req_{number}", "body": {"n": number}}}


def bad(number: int) -> dict:
    return {"id": f"batch_req_{number}", "custom_id": f"q-{number}", "response": None,
            "error": {"code": "batch_expired", "message": "Not run: the completion window closed first"}}


def refused(number: int) -> dict:
    """An error file's line for a request the model's API refused: OpenAI's form, a response."""
    body = {"error": {"message": "bad", "type": "invalid_request", "param": None, "code": "invalid_request"}}
    return {"id": f"batch_req_{number}", "custom_id": f"q-{number}",
            "response": {"status_code": 400, "request_id": None, "body": body}, "error": None}


def content(lines: list[dict]) -> requests.Response:
    answer = response(200, raw=b"".join(json.dumps(line).encode() + b"\n" for line in lines),
                      headers={"Content-Type": "application/jsonl"})
    answer._content_consumed = True  # a body already read: iter_lines serves it from memory
    return answer


class FakeApi:
    """GET /batches/{id}, its results pages, and GET /files/{id}/content (the redirect already followed)."""

    def __init__(self, batch: dict, files: dict[str, list[dict]], results: list[dict] | None = None) -> None:
        self.batch, self.files, self.results = batch, files, results or []
        self.calls: list[str] = []

    def request(self, method: str, url: str, **_: Any) -> requests.Response:
        path = urlsplit(url).path.removeprefix("/v1")
        self.calls.append(f"{method} {path}")
        if path.startswith("/files/"):
            return content(self.files[path.split("/")[2]])
        if path.endswith("/results"):
            return response(200, page(self.results))
        return response(200, self.batch)


@pytest.fixture
def cli(monkeypatch):
    def run(api: FakeApi, *args: str):
        client = BatchClient("hyi-test", "http://api.test/v1", session=api)  # type: ignore[arg-type]
        monkeypatch.setattr(result_commands, "make_client", lambda: client)
        return CliRunner().invoke(main, list(args))

    return run


def file_batch() -> dict:
    return batch_json("expired", input_file_id="file-in", output_file_id=OUTPUT, error_file_id=ERRORS)


def test_results_of_a_file_batch_write_its_output_and_error_files(cli, tmp_path):
    api = FakeApi(file_batch(), {OUTPUT: [ok(10), ok(12)], ERRORS: [bad(11), bad(13), refused(14)]})
    out, errors = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    ran = cli(api, "results", BATCH_ID, "-o", str(out), "--errors", str(errors))
    assert ran.exit_code == 0, ran.output
    assert [json.loads(line) for line in out.read_text().splitlines()] == [ok(10), ok(12)]
    assert [json.loads(line) for line in errors.read_text().splitlines()] == [bad(11), bad(13), refused(14)]
    assert not any(call.endswith("/results") for call in api.calls)


def test_without_errors_both_files_go_to_the_output_in_input_order(cli, tmp_path):
    api = FakeApi(file_batch(), {OUTPUT: [ok(10), ok(12)], ERRORS: [bad(11), bad(13)]})
    out = tmp_path / "out.jsonl"
    assert cli(api, "results", BATCH_ID, "-o", str(out)).exit_code == 0
    assert [json.loads(line) for line in out.read_text().splitlines()] == [ok(10), bad(11), ok(12), bad(13)]


def test_a_null_file_is_skipped_and_an_inline_batch_reads_its_pages(cli, tmp_path):
    only_output = FakeApi(batch_json("completed", input_file_id="file-in", output_file_id=OUTPUT),
                          {OUTPUT: [ok(1)]})
    out = tmp_path / "out.jsonl"
    assert cli(only_output, "results", BATCH_ID, "-o", str(out)).exit_code == 0
    assert [json.loads(line) for line in out.read_text().splitlines()] == [ok(1)]

    inline = FakeApi(batch_json("completed"), {}, results=[result_json(1)])
    assert cli(inline, "results", BATCH_ID, "-o", str(out)).exit_code == 0
    assert [json.loads(line)["custom_id"] for line in out.read_text().splitlines()] == ["q-1"]
    assert any(call.endswith("/results") for call in inline.calls)
