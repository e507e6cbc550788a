"""The Files and Uploads APIs through the API handler on moto: shapes, ownership, limits, joins."""

from __future__ import annotations

import hashlib
import os
from urllib.parse import parse_qs, urlsplit

import pytest
from botocore.exceptions import ClientError
from freeinference_batch import accounts
from freeinference_batch.core import aws
from freeinference_batch.files import content
from freeinference_batch.ops import schedules
from freeinference_batch.store import files, objects, uploads
from freeinference_batch.store.accounts_table import account_item_key

BOUNDARY = "----test-boundary"


def form(**fields: bytes | tuple[str, bytes]) -> bytes:
    out = b""
    for name, value in fields.items():
        if isinstance(value, tuple):
            head = f'Content-Disposition: form-data; name="{name}"; filename="{value[0]}"\r\n' \
                   "Content-Type: application/octet-stream"
            data = value[1]
        else:
            head, data = f'Content-Disposition: form-data; name="{name}"', value
        out += f"--{BOUNDARY}\r\n{head}\r\n\r\n".encode() + data + b"\r\n"
    return out + f"--{BOUNDARY}--\r\n".encode()


def post_form(harness, path: str, key: str | None = None, **fields) -> tuple[int, dict]:
    return harness.call("POST", path, raw=form(**fields), key=key,
                        headers={"content-type": f"multipart/form-data; boundary={BOUNDARY}"})


def upload(harness, content: bytes, key: str | None = None) -> dict:
    status, body = post_form(harness, "/v1/files", key, purpose=b"batch", file=("in.jsonl", content))
    assert status == 200, body
    return body


def content_of(harness, file_id: str, key: str | None = None) -> bytes:
    status, _ = harness.call("GET", f"/v1/files/{file_id}/content", key=key)
    assert status == 307
    location = harness.last_location
    url = urlsplit(location)
    bucket = harness.settings.payload_bucket_name
    object_key = url.path[1:] if url.hostname.startswith(bucket) else url.path.split("/", 2)[-1]
    assert "X-Amz-Signature" in parse_qs(urlsplit(location).query) or "Signature" in location
    return aws.s3().get_object(Bucket=harness.settings.payload_bucket_name, Key=object_key)["Body"].read()


@pytest.fixture
def harness(harness, monkeypatch):
    """The harness, keeping the Location of a redirect (its call answers the body only)."""
    from freeinference_batch_local.api_gateway import integration

    original = integration.http_response

    def keep(result):
        status, headers, body = original(result)
        harness.last_location = dict(headers).get("location") or dict(headers).get("Location")
        return status, headers, body

    monkeypatch.setattr(integration, "http_response", keep)
    return harness


def test_a_file_is_uploaded_retrieved_listed_downloaded_and_deleted(harness) -> None:
    content = b'{"custom_id":"a"}\n{"custom_id":"b"}\n'
    made = upload(harness, content)
    assert made["object"] == "file" and made["purpose"] == "batch" and made["status"] == "processed"
    assert (made["bytes"], made["filename"]) == (len(content), "in.jsonl")
    assert made["expires_at"] == made["created_at"] + harness.settings.file_lifetime_seconds
    assert harness.call("GET", f"/v1/files/{made['id']}") == (200, made)
    status, listed = harness.call("GET", "/v1/files?purpose=batch&limit=5")
    assert status == 200 and [f["id"] for f in listed["data"]] == [made["id"]] and not listed["has_more"]
    assert content_of(harness, made["id"]) == content
    assert harness.call("DELETE", f"/v1/files/{made['id']}") == (200, {"id": made["id"], "object": "file",
                                                                      "deleted": True})
    assert harness.call("GET", f"/v1/files/{made['id']}/content")[0] == 404


def test_another_accounts_file_is_not_found(harness) -> None:
    made = upload(harness, b"{}\n")
    other = accounts.create_key(harness.settings, "acct-2", tier="internal")
    for method, path in (("GET", ""), ("GET", "/content"), ("DELETE", "")):
        status, body = harness.call(method, f"/v1/files/{made['id']}{path}", key=other)
        assert status == 404 and body["error"]["code"] == "not_found"
    assert harness.call("GET", "/v1/files", key=other)[1]["data"] == []


def test_only_purpose_batch_is_accepted(harness) -> None:
    status, body = post_form(harness, "/v1/files", purpose=b"fine-tune", file=("in.jsonl", b"{}\n"))
    assert status == 400 and body["error"]["param"] == "purpose" and "'batch'" in body["error"]["message"]


def test_a_file_over_the_create_limit_is_a_413_naming_the_chunked_upload(harness) -> None:
    harness.configure(FILE_CREATE_MAX_BYTES=1000)
    status, body = post_form(harness, "/v1/files", purpose=b"batch", file=("in.jsonl", b"x" * 1001))
    assert status == 413 and body["error"]["code"] == "payload_too_large"
    assert "client.uploads.upload_file_chunked(" in body["error"]["message"]
    assert "part_size=4 * 1024 * 1024" in body["error"]["message"]


def test_uploading_needs_batch_access(harness) -> None:
    outsider = accounts.create_key(harness.settings, "acct-3", tier="free")
    assert post_form(harness, "/v1/files", outsider, purpose=b"batch", file=("a", b"{}"))[0] == 403
    assert harness.call("POST", "/v1/uploads", {"filename": "a", "purpose": "batch", "bytes": 3,
                                                "mime_type": "application/jsonl"}, key=outsider)[0] == 403
    assert harness.call("GET", "/v1/files", key=outsider)[0] == 200


def test_the_caps_hold_as_files_come_go_and_expire(harness) -> None:
    harness.configure(FILE_MAX_STORED=2)
    first = upload(harness, b"{}\n")
    upload(harness, b"{}\n")
    status, body = post_form(harness, "/v1/files", purpose=b"batch", file=("a", b"{}\n"))
    assert status == 409 and body["error"]["code"] == "file_limit_reached"
    harness.call("DELETE", f"/v1/files/{first['id']}")
    upload(harness, b"{}\n")
    harness.advance_clock(harness.settings.file_lifetime_seconds + 1)
    assert harness.call("GET", "/v1/files")[1]["data"] == []
    result = schedules.purge(harness.settings)
    assert result["expired_files"] == 2
    upload(harness, b"{}\n")
    upload(harness, b"{}\n")


def _create_upload(harness, size: int) -> tuple[int, dict]:
    return harness.call("POST", "/v1/uploads", {"filename": "in.jsonl", "purpose": "batch", "bytes": size,
                                                "mime_type": "application/jsonl"})


def test_pending_uploads_hold_their_place_within_the_caps(harness) -> None:
    # Given caps of two files and 100 bytes, and a file of 10 bytes
    harness.configure(FILE_MAX_STORED=2, FILE_MAX_STORED_BYTES=100)
    stored = upload(harness, b'{"a":"b"}\n')
    # An upload whose declared bytes would pass the bytes cap is refused at its create, naming both caps
    status, refused = _create_upload(harness, 91)
    assert status == 409 and refused["error"]["code"] == "file_limit_reached", refused
    assert "2 files, 100 bytes" in refused["error"]["message"] and "pending uploads" in refused["error"]["message"]
    # A pending upload takes the second file's place: neither a file nor another upload fits now
    status, pending = _create_upload(harness, 20)
    assert status == 200, pending
    for status, body in (post_form(harness, "/v1/files", purpose=b"batch", file=("a", b"{}\n")),
                         _create_upload(harness, 1)):
        assert status == 409 and body["error"]["code"] == "file_limit_reached", body
    # Its cancel gives the place back; a completed upload hands it to its file (counted once)
    status, _ = harness.call("POST", f"/v1/uploads/{pending['id']}/cancel")
    assert status == 200
    status, made = _create_upload(harness, 20)
    assert status == 200, made
    status, part = post_form(harness, f"/v1/uploads/{made['id']}/parts", data=("blob", b"x" * 20))
    status, done = harness.call("POST", f"/v1/uploads/{made['id']}/complete", {"part_ids": [part["id"]]})
    assert status == 200 and done["status"] == "completed", done
    account = aws.dynamodb().get_item(TableName=harness.settings.accounts_table_name,
                                      Key=account_item_key("acct-1"), ConsistentRead=True)["Item"]
    assert (account["input_files"], account["input_file_bytes"]) == ({"N": "2"}, {"N": str(10 + 20)})
    # And an upload left pending is given back when the purge expires it
    harness.call("DELETE", f"/v1/files/{stored['id']}")
    status, left = _create_upload(harness, 50)
    assert status == 200, left
    assert _create_upload(harness, 1)[0] == 409
    harness.advance_clock(harness.settings.upload_lifetime_seconds + 1)
    assert schedules.purge(harness.settings)["expired_uploads"] == 1
    assert _create_upload(harness, 1)[0] == 200


def _chunked(harness, content: bytes, part_size: int, md5: str | None = None) -> tuple[int, dict]:
    status, made = harness.call("POST", "/v1/uploads", {"filename": "big.jsonl", "purpose": "batch",
                                                        "bytes": len(content), "mime_type": "application/jsonl"})
    assert status == 200 and made["object"] == "upload" and made["status"] == "pending", made
    part_ids = []
    for start in range(0, len(content), part_size):
        chunk = content[start : start + part_size]
        status, part = post_form(harness, f"/v1/uploads/{made['id']}/parts", data=("blob", chunk))
        assert status == 200 and part["object"] == "upload.part" and part["upload_id"] == made["id"], part
        part_ids.append(part["id"])
    body = {"part_ids": part_ids, **({"md5": md5} if md5 else {})}
    return harness.call("POST", f"/v1/uploads/{made['id']}/complete", body)


def test_an_upload_of_parts_completes_as_one_file_and_downloads_joined(harness) -> None:
    lines = b"".join(b'{"custom_id":"%d","pad":"%s"}\n' % (n, os.urandom(300).hex().encode()) for n in range(20_000))
    status, done = _chunked(harness, lines, 3 * 1024 * 1024, md5=hashlib.md5(lines).hexdigest())
    assert status == 200, done
    assert done["status"] == "completed" and done["file"]["bytes"] == len(lines)
    record = files.get_file(harness.settings, "acct-1", done["file"]["id"])
    assert len(record.objects) == -(-len(lines) // (3 * 1024 * 1024))
    assert b"".join(line + b"\n" for line in files.iter_lines(harness.settings, record)) == lines
    assert content_of(harness, done["file"]["id"]) == lines
    assert files.get_file(harness.settings, "acct-1", done["file"]["id"]).objects == [
        files.input_object_key(done["file"]["id"])]
    assert content_of(harness, done["file"]["id"]) == lines  # joined once


class DownloadDied(BaseException):
    """The API invocation joining a file's parts is killed: nothing cleans up."""


def test_a_join_that_dies_after_completing_its_object_is_finished_by_the_next_download(harness, monkeypatch):
    # Given an upload of parts whose first download completes the joined object, then dies before
    # pointing the file at it
    lines = b"".join(b'{"custom_id":"%d","pad":"%s"}\n' % (n, os.urandom(300).hex().encode()) for n in range(12_000))
    status, done = _chunked(harness, lines, 3 * 1024 * 1024)
    assert status == 200, done
    file_id = done["file"]["id"]
    record = files.get_file(harness.settings, "acct-1", file_id)
    set_objects = files.set_objects

    def dies(*args, **kwargs):
        raise DownloadDied

    monkeypatch.setattr(files, "set_objects", dies)
    with pytest.raises(DownloadDied):
        content.single_object(harness.settings, record, 30)
    monkeypatch.setattr(files, "set_objects", set_objects)
    assert files.get_file(harness.settings, "acct-1", file_id).objects == record.objects

    def forgotten(*args, **kwargs):  # S3 once it no longer keeps the completed upload (moto keeps it)
        raise ClientError({"Error": {"Code": "NoSuchUpload", "Message": "The specified upload does not exist"}},
                          "CompleteMultipartUpload")

    monkeypatch.setattr(objects, "complete_multipart", forgotten)
    # When the file is downloaded again, then it gets the content, from the one joined object
    assert content_of(harness, file_id) == lines
    assert files.get_file(harness.settings, "acct-1", file_id).objects == [files.input_object_key(file_id)]
    assert files.get_join(harness.settings, file_id) is None


def test_a_part_whose_call_dies_before_it_is_stored_is_not_counted(harness, monkeypatch) -> None:
    # Given an upload of exactly two parts' bytes, whose first part's call dies as it stores the
    # object (an API invocation killed mid-call: nothing cleans up)
    content = b'{"custom_id":"a"}\n{"custom_id":"b"}\n'
    first, second = content[:18], content[18:]
    status, made = harness.call("POST", "/v1/uploads", {"filename": "in.jsonl", "purpose": "batch",
                                                        "bytes": len(content), "mime_type": "application/jsonl"})
    assert status == 200, made
    put = objects.put

    def dies(*args, **kwargs):
        raise DownloadDied

    monkeypatch.setattr(objects, "put", dies)
    with pytest.raises(DownloadDied):
        uploads.add_part(harness.settings, uploads.get_upload(harness.settings, made["id"]), first, 0, 10)
    monkeypatch.setattr(objects, "put", put)
    # When the client sends both parts again, then both fit the declared bytes (and no more does),
    # and the upload completes as the file
    part_ids = []
    for data in (first, second):
        status, part = post_form(harness, f"/v1/uploads/{made['id']}/parts", data=("blob", data))
        assert status == 200, part
        part_ids.append(part["id"])
    status, refused = post_form(harness, f"/v1/uploads/{made['id']}/parts", data=("blob", b"x"))
    assert status == 400 and refused["error"]["param"] == "data", refused  # a byte past them is not
    status, done = harness.call("POST", f"/v1/uploads/{made['id']}/complete", {"part_ids": part_ids})
    assert status == 200 and done["status"] == "completed", done
    assert content_of(harness, done["file"]["id"]) == content


def test_an_upload_checks_bytes_and_md5(harness) -> None:
    status, body = _chunked(harness, b"x" * 100, 40, md5="0" * 32)
    assert status == 400 and body["error"]["param"] == "md5"
    status, made = harness.call("POST", "/v1/uploads", {"filename": "a", "purpose": "batch", "bytes": 10,
                                                        "mime_type": "application/jsonl"})
    status, body = post_form(harness, f"/v1/uploads/{made['id']}/parts", data=("blob", b"x" * 11))
    assert status == 400 and body["error"]["param"] == "data"
    status, part = post_form(harness, f"/v1/uploads/{made['id']}/parts", data=("blob", b"x" * 4))
    status, body = harness.call("POST", f"/v1/uploads/{made['id']}/complete", {"part_ids": [part["id"]]})
    assert status == 400 and body["error"]["param"] == "bytes"
    status, body = harness.call("POST", f"/v1/uploads/{made['id']}/cancel")
    assert status == 200 and body["status"] == "cancelled"
    status, body = harness.call("POST", f"/v1/uploads/{made['id']}/complete", {"part_ids": [part["id"]]})
    assert status == 409 and body["error"]["code"] == "upload_not_pending"


def test_an_unknown_method_of_a_files_path_is_405_with_allow(harness) -> None:
    status, body = harness.call("PUT", "/v1/files")
    assert status == 405 and body["error"]["code"] == "method_not_allowed"
