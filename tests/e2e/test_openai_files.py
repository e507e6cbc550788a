"""OpenAI's own Files and Uploads calls, unchanged, against the local stack: what a user of the
openai package does after changing base_url and api_key."""

from __future__ import annotations

import io
import os
from pathlib import Path

import openai
import pytest
from conftest import StackProcess


def _client(stack: StackProcess, key: str | None = None, sent: list | None = None) -> openai.OpenAI:
    """The SDK as users make it; `sent` collects (url, headers) of every request its HTTP client
    sends, redirects followed included."""
    hooks = {"request": [lambda request: sent.append((str(request.url), dict(request.headers)))]} if sent is not None \
        else {}
    return openai.OpenAI(base_url=stack.base_url, api_key=key or stack.key, max_retries=0, timeout=60,
                         http_client=openai.DefaultHttpxClient(event_hooks=hooks))


def _lines(size: int) -> bytes:
    """About `size` bytes of batch input lines (random hex: as incompressible as real prompts)."""
    line = 0
    out = io.BytesIO()
    while out.tell() < size:
        out.write(b'{"custom_id":"r-%d","method":"POST","url":"/v1/chat/completions","body":{"model":"glm-5.3-flash",'
                  b'"messages":[{"role":"user","content":"%s"}]}}\n' % (line, os.urandom(200).hex().encode()))
        line += 1
    return out.getvalue()


def test_files_and_uploads_through_the_openai_sdk(stack: StackProcess, tmp_path: Path) -> None:
    sent: list[tuple[str, dict]] = []
    client = _client(stack, sent=sent)
    small = _lines(10_000)
    made = client.files.create(file=("small.jsonl", small), purpose="batch")
    assert (made.object, made.purpose, made.status, made.bytes, made.filename) == (
        "file", "batch", "processed", len(small), "small.jsonl")
    assert made.expires_at is not None and made.expires_at > made.created_at

    big_path = tmp_path / "big.jsonl"
    big = _lines(20 * 1024 * 1024)
    big_path.write_bytes(big)
    upload = client.uploads.upload_file_chunked(file=big_path, mime_type="application/jsonl", purpose="batch",
                                                part_size=4 * 1024 * 1024)
    assert upload.status == "completed" and upload.file is not None and upload.file.bytes == len(big)

    listed = [f.id for f in client.files.list(purpose="batch")]
    assert upload.file.id in listed and made.id in listed
    assert listed.index(upload.file.id) < listed.index(made.id)  # newest first
    assert client.files.retrieve(made.id) == made

    # A redirect to a presigned S3 GET, followed by the SDK (without our Authorization)
    sent.clear()
    assert client.files.content(made.id).content == small
    (api_url, api_headers), (s3_url, s3_headers) = sent
    assert api_url.startswith(stack.base_url) and "authorization" in api_headers
    assert not s3_url.startswith(stack.base_url) and "Signature=" in s3_url
    assert "authorization" not in s3_headers  # httpx keeps it off another host
    assert client.files.content(upload.file.id).content == big  # its five parts joined into one object

    other = _client(stack, stack.create_key("acct-files-other", tier="internal"))
    for call in (lambda: other.files.retrieve(made.id), lambda: other.files.content(made.id),
                 lambda: other.files.delete(made.id)):
        with pytest.raises(openai.NotFoundError):
            call()

    assert client.files.delete(made.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.content(made.id)
    assert made.id not in [f.id for f in client.files.list()]


def test_a_file_too_big_for_one_call_names_the_chunked_upload(stack: StackProcess) -> None:
    client = _client(stack)
    # Past files.create's 4 MiB but inside Lambda's 6 MB event: our 413, naming the way that works
    with pytest.raises(openai.APIStatusError) as refused:
        client.files.create(file=("big.jsonl", b"x" * (4 * 1024 * 1024 + 1)), purpose="batch")
    assert refused.value.status_code == 413
    error = refused.value.body
    assert error["code"] == "payload_too_large" and error["param"] == "file"
    assert "client.uploads.upload_file_chunked(" in error["message"] and "part_size=4 * 1024 * 1024" in error["message"]
    # Past the 6 MB event: refused before the function runs, in AWS's own shape
    with pytest.raises(openai.APIStatusError) as refused:
        client.files.create(file=("big.jsonl", b"x" * (5 * 1024 * 1024)), purpose="batch")
    assert refused.value.status_code == 413
    assert refused.value.response.json() == {"message": "Request Entity Too Large"}
