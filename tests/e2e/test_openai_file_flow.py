"""OpenAI's batch flow, unchanged (issue 32): the `openai` SDK's own calls against the local stack,
with nothing but `base_url`, `api_key` and, for a big input, `part_size` changed.

`files.create` of a small input and `uploads.upload_file_chunked` of a ~20 MB one, `batches.create`
from each file, `retrieve` until final, `files.content` of the output and error files compared
line by line with the results pages, `files.list`, `files.delete`, and another account's 404.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import openai
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL = "qwen3.6-35b"
FINAL = ("completed", "failed", "expired", "cancelled")
PART_SIZE = 4 * 1024 * 1024


def input_line(custom_id: str, content: str) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": content}]}}


def write_jsonl(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def wait_final(sdk: openai.OpenAI, batch_id: str, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    batch = sdk.batches.retrieve(batch_id)
    while batch.status not in FINAL:
        assert time.monotonic() < deadline, f"batch {batch_id} still {batch.status}"
        time.sleep(0.5)
        batch = sdk.batches.retrieve(batch_id)
    return batch


def as_file_line(result: dict) -> dict:
    """What OpenAI's output or error file says of a results-page line: a completed request's
    response; a failed request with an HTTP error, a response of that status with the error as
    its body, as OpenAI writes it; any other, its error (code and message)."""
    if result["status"] == "completed":
        response = result["response"]
        return {"id": result["id"], "custom_id": result["custom_id"], "error": None,
                "response": {key: response[key] for key in ("status_code", "request_id", "body")}}
    error = result["error"]
    if result["status"] != "failed" or error.get("status") is None:
        return {"id": result["id"], "custom_id": result["custom_id"], "response": None,
                "error": {key: error[key] for key in ("code", "message")}}
    body = {"error": {"message": error["message"], "type": error["code"], "param": None, "code": error["code"]}}
    return {"id": result["id"], "custom_id": result["custom_id"], "error": None,
            "response": {"status_code": error["status"], "request_id": None, "body": body}}


def test_the_openai_sdks_file_flow_runs_unchanged(stack, tmp_path):
    key = stack.create_key("e2e-file-flow", tier="internal")
    sdk = openai.OpenAI(base_url=stack.base_url, api_key=key, max_retries=2, timeout=60)

    # A small input through files.create: every fifth request fails for good upstream
    small_lines = [input_line(f"q-{n}", f"Small {n}" + (" [sim:status=400]" if n % 5 == 4 else ""))
                   for n in range(20)]
    small = sdk.files.create(file=write_jsonl(tmp_path / "small.jsonl", small_lines).open("rb"), purpose="batch")
    assert (small.object, small.purpose, small.bytes) == ("file", "batch", (tmp_path / "small.jsonl").stat().st_size)

    # A ~20 MB input through the SDK's chunked upload, in 4 MiB parts
    padding = "x" * 210_000
    big_lines = [input_line(f"big-{n}", f"Big {n} {padding}") for n in range(100)]
    big_path = write_jsonl(tmp_path / "big.jsonl", big_lines)
    assert big_path.stat().st_size > 20_000_000
    upload = sdk.uploads.upload_file_chunked(file=big_path, mime_type="application/jsonl", purpose="batch",
                                             part_size=PART_SIZE)
    assert upload.status == "completed" and upload.file is not None
    assert upload.file.bytes == big_path.stat().st_size

    # Both run as batches made from their files
    runs = {}
    for name, file_id, lines in (("small", small.id, small_lines), ("big", upload.file.id, big_lines)):
        created = sdk.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
        assert created.status == "validating" and created.input_file_id == file_id
        runs[name] = (wait_final(sdk, created.id), lines)

    api = stack.api(key)
    for name, (batch, lines) in runs.items():
        assert batch.status == "completed", (name, batch)
        results = api.results(batch.id)
        assert [r["custom_id"] for r in results] == [line["custom_id"] for line in lines]
        # The output and error files are the results pages' lines, in input order, split by outcome
        outputs = [as_file_line(r) for r in results if r["status"] == "completed"]
        errors = [as_file_line(r) for r in results if r["status"] != "completed"]
        assert batch.output_file_id is not None
        got = [json.loads(line) for line in sdk.files.content(batch.output_file_id).text.splitlines()]
        assert got == outputs, name
        if errors:
            got = [json.loads(line) for line in sdk.files.content(batch.error_file_id).text.splitlines()]
            assert got == errors, name
        else:
            assert batch.error_file_id is None
    assert runs["small"][0].request_counts.failed == 4
    # The model's 400s read as OpenAI's do: a response of that status, its body the error
    refused = [json.loads(line) for line in sdk.files.content(runs["small"][0].error_file_id).text.splitlines()]
    assert [(r["custom_id"], r["response"]["status_code"], r["error"]) for r in refused] == [
        (f"q-{n}", 400, None) for n in (4, 9, 14, 19)]
    assert all(r["response"]["body"]["error"]["message"] for r in refused)

    # files.list shows the inputs and the outputs; delete takes a file and its content at once
    listed = {f.id for f in sdk.files.list()}
    assert {small.id, upload.file.id, runs["small"][0].output_file_id} <= listed
    assert {f.id for f in sdk.files.list(purpose="batch")} >= {small.id, upload.file.id}
    deleted = sdk.files.delete(small.id)
    assert deleted.deleted is True and deleted.id == small.id
    with pytest.raises(openai.NotFoundError):
        sdk.files.content(small.id)
    with pytest.raises(openai.NotFoundError):
        sdk.files.retrieve(small.id)
    # The batch made from it keeps its input_file_id and its results
    assert sdk.batches.retrieve(runs["small"][0].id).input_file_id == small.id

    # Another account sees none of it
    other = openai.OpenAI(base_url=stack.base_url, api_key=stack.create_key("e2e-file-flow-other", tier="internal"),
                          max_retries=0, timeout=30)
    for file_id in (upload.file.id, runs["big"][0].output_file_id):
        with pytest.raises(openai.NotFoundError):
            other.files.retrieve(file_id)
        with pytest.raises(openai.NotFoundError):
            other.files.content(file_id)
    with pytest.raises(openai.BadRequestError):
        other.batches.create(input_file_id=upload.file.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert upload.file.id not in {f.id for f in other.files.list()}
