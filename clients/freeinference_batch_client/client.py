"""A Python client for the FreeInference Batch API (`requests`-based, typed with pydantic).

    from freeinference_batch_client.client import BatchClient

    client = BatchClient()                      # FREEINFERENCE_API_KEY / FREEINFERENCE_BASE_URL
    batch = client.create([{"custom_id": "q-1", "body": {"model": "glm-5.3-flash", "messages": [...]}}])
    batch = client.wait(batch.id)
    for line in client.iter_results(batch.id):
        print(line.custom_id, line.status)

    endpoint = client.webhooks.create("https://example.com/hooks", name="batches")
    print(endpoint.signing_secret)              # shown only by create and rotate_secret

Reads (GET), creates and retries of a batch are retried on 429, 5xx and connection errors with
exponential backoff and jitter, honouring `Retry-After`: every create (and retry) carries one
`Idempotency-Key` (a uuid4, or yours), reused across its retries, so a retried create answers
the batch the first attempt stored instead of creating another. Cancel and delete are retried only when the request
certainly never reached the server (the connection could not be opened); a 5xx or a timeout on
them is raised, since the write may have happened. Create bodies over 1 MiB are sent gzipped
(the server's 32 MiB limit applies to the decompressed body; API Gateway in front of it takes
10 MB at most on the wire).

This is user-side code: it reads its defaults from the environment itself (the server's code
reads the environment only through `settings.py`).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import re
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import requests

from freeinference_batch_client.encoding import encode_json, path_segment
from freeinference_batch_client.errors import (
    BatchApiError,
    BatchClientError,
    BatchConnectionError,
    api_error_from_response,
    redact,
)
from freeinference_batch_client.models import (
    FINAL_STATUSES,
    Batch,
    BatchFailure,
    BatchWaiting,
    DeletedBatch,
    DeletedWebhookEndpoint,
    Page,
    RequestCounts,
    ResultError,
    ResultLine,
    ResultResponse,
    WebhookEndpoint,
    WebhookTestResult,
)
from freeinference_batch_client.webhook_endpoints import WEBHOOK_EVENT_TYPES, WebhookEndpoints

# What users import from here: the client, and the errors it raises and the models it answers
# with (defined in errors.py and models.py).
__all__ = [
    "API_KEY_ENV", "BASE_URL_ENV", "DEFAULT_BASE_URL", "FINAL_STATUSES", "WEBHOOK_EVENT_TYPES",
    "Batch", "BatchApiError", "BatchClient", "BatchClientError", "BatchConnectionError", "BatchFailure",
    "BatchWaiting", "DeletedBatch", "DeletedWebhookEndpoint", "Page", "RequestCounts", "ResultError", "ResultLine",
    "ResultResponse", "WebhookEndpoint", "WebhookEndpoints", "WebhookTestResult", "encode_create_body",
    "encode_json", "redact",
]

DEFAULT_BASE_URL = "https://freeinference.org/v1"
API_KEY_ENV = "FREEINFERENCE_API_KEY"
BASE_URL_ENV = "FREEINFERENCE_BASE_URL"
# Create bodies larger than this are gzipped.
GZIP_THRESHOLD_BYTES = 1024 * 1024
# files.create takes up to 4 MiB (API Gateway hands Lambda the multipart body base64-encoded in its
# 6 MB event); a bigger input file goes through an upload in parts of this size.
FILE_CREATE_MAX_BYTES = 4 * 1024 * 1024
UPLOAD_PART_BYTES = 4 * 1024 * 1024
# The webhook event types the service sends: one per final status.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
# A Retry-After longer than this is not waited for: the error is raised at once.
MAX_RETRY_AFTER_SECONDS = 120.0

try:  # the package version, for the User-Agent
    from importlib.metadata import version as _version

    _USER_AGENT = f"freeinference-batch/{_version('freeinference-batch')}"
except Exception:  # pragma: no cover - not installed as a distribution
    _USER_AGENT = "freeinference-batch"


# ---- encoding -------------------------------------------------------------------------------


def encode_create_body(requests_: Sequence[Mapping[str, Any]], metadata: Mapping[str, str] | None = None) -> bytes:
    """The create body, exactly as `create` sends it (before any gzip)."""
    document: dict[str, Any] = {"requests": list(requests_)}
    if metadata is not None:
        document["metadata"] = dict(metadata)
    return encode_json(document)


def _never_sent(error: requests.RequestException) -> bool:
    """True when the connection could not even be opened, so the request cannot have arrived."""
    if isinstance(error, requests.exceptions.ConnectTimeout):
        return True
    if not isinstance(error, requests.exceptions.ConnectionError) or isinstance(error, requests.exceptions.SSLError):
        return False
    from urllib3.exceptions import MaxRetryError, NewConnectionError

    cause: Any = error.args[0] if error.args else None
    if isinstance(cause, MaxRetryError):
        cause = cause.reason
    return isinstance(cause, NewConnectionError)


# ---- the client -----------------------------------------------------------------------------


class BatchClient:
    """The seven endpoints of the Batch API, plus paging and waiting helpers; the webhook
    endpoints' routes are `client.webhooks` (WebhookEndpoints).

    `api_key` and `base_url` default to FREEINFERENCE_API_KEY and FREEINFERENCE_BASE_URL (then
    https://freeinference.org/v1); the environment is read only for arguments left as None.
    """

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        *,
        timeout: float = 120,
        max_retries: int = 5,
        session: requests.Session | None = None,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
    ) -> None:
        if api_key is None:
            api_key = os.environ.get(API_KEY_ENV)
        if not api_key:
            raise BatchClientError(f"No API key: pass api_key= or set {API_KEY_ENV}")
        if base_url is None:
            base_url = os.environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL
        self.api_key = api_key
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.max_retries = max(0, max_retries)
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.session = session if session is not None else requests.Session()
        self._headers = {"Authorization": f"Bearer {api_key}", "User-Agent": _USER_AGENT, "Accept": "application/json"}
        self._sleep: Callable[[float], None] = time.sleep  # replaced in tests
        self.webhooks = WebhookEndpoints(self)

    # -- plumbing -------------------------------------------------------------------------

    def _backoff(self, attempt: int, retry_after: float | None = None) -> float:
        delay = min(self.backoff_max, self.backoff_base * (2**attempt))
        delay = delay / 2 + random.uniform(0, delay / 2)  # jitter: between half and all of it
        if retry_after is not None:
            delay = max(delay, retry_after)
        return delay

    def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        data: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        idempotent: bool,
    ) -> Any:
        url = f"{self.base_url}{path}"
        all_headers = {**self._headers, **(headers or {})}
        query = {name: value for name, value in (params or {}).items() if value is not None}
        attempt = 0
        while True:
            try:
                response = self.session.request(
                    method, url, params=query or None, data=data, headers=all_headers, timeout=self.timeout
                )
            except requests.RequestException as error:
                if attempt < self.max_retries and (idempotent or _never_sent(error)):
                    self._sleep(self._backoff(attempt))
                    attempt += 1
                    continue
                raise BatchConnectionError(f"{method} {url}: {error}") from error
            if response.status_code < 400:
                try:
                    return response.json()
                except ValueError:
                    raise BatchApiError(
                        response.status_code, None, f"The answer is not JSON: {response.text[:200]!r}"
                    ) from None
            error = api_error_from_response(response)
            retryable = (
                idempotent
                and response.status_code in RETRY_STATUSES
                and error.code != "quota_exceeded"  # lasts until 00:00 UTC: no point retrying
                and error.code != "too_many_unfinished_batches"  # lasts until a batch finishes
                and (error.retry_after is None or error.retry_after <= MAX_RETRY_AFTER_SECONDS)
            )
            if retryable and attempt < self.max_retries:
                self._sleep(self._backoff(attempt, error.retry_after))
                attempt += 1
                continue
            raise error

    def _get(self, path: str, params: Mapping[str, Any] | None = None) -> Any:
        return self._request("GET", path, params=params, idempotent=True)

    # -- endpoints ------------------------------------------------------------------------

    def create(
        self,
        requests: Sequence[Mapping[str, Any]],
        metadata: Mapping[str, str] | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> Batch:
        """POST /batches: `requests` are OpenAI batch-input lines ({custom_id, method, url, body}).

        `idempotency_key` (default: a new uuid4) is sent as Idempotency-Key; pass the same one to
        a later create of the same job to get its batch back instead of a second one (24 hours)."""
        return self.create_encoded(encode_create_body(requests, metadata), idempotency_key=idempotency_key)

    def create_encoded(self, body: bytes, *, idempotency_key: str | None = None) -> Batch:
        """POST /batches with a body already encoded (see `encode_create_body`); gzipped when large."""
        headers = {"Content-Type": "application/json", "Idempotency-Key": idempotency_key or str(uuid.uuid4())}
        if len(body) > GZIP_THRESHOLD_BYTES:
            body = gzip.compress(body, compresslevel=6)
            headers["Content-Encoding"] = "gzip"
        # Safe to retry: the key makes the server answer the batch an earlier attempt stored.
        return Batch.model_validate(self._request("POST", "/batches", data=body, headers=headers, idempotent=True))

    def upload_file(self, content: bytes, filename: str = "batch_input.jsonl") -> str:
        """An OpenAI batch input file uploaded with purpose `batch`: one `POST /files` up to
        FILE_CREATE_MAX_BYTES, else an upload (`/uploads`) in parts of UPLOAD_PART_BYTES, its
        md5 checked by the server. Answers the file's id."""
        if len(content) <= FILE_CREATE_MAX_BYTES:
            body, content_type = _multipart("file", filename, content, purpose="batch")
            answer = self._request("POST", "/files", data=body, headers={"Content-Type": content_type},
                                   idempotent=False)
            return str(answer["id"])
        json_type = {"Content-Type": "application/json"}
        upload = self._request("POST", "/uploads", data=encode_json({
            "filename": filename, "purpose": "batch", "bytes": len(content), "mime_type": "application/jsonl"}),
            headers=json_type, idempotent=False)
        part_ids = []
        for start in range(0, len(content), UPLOAD_PART_BYTES):
            body, content_type = _multipart("data", filename, content[start:start + UPLOAD_PART_BYTES])
            part = self._request("POST", f"/uploads/{path_segment(upload['id'])}/parts", data=body,
                                 headers={"Content-Type": content_type}, idempotent=False)
            part_ids.append(part["id"])
        # MD5 because OpenAI's upload takes it (an integrity check of the parts, not a secret)
        md5 = hashlib.md5(content, usedforsecurity=False).hexdigest()
        done = self._request("POST", f"/uploads/{path_segment(upload['id'])}/complete",
                             data=encode_json({"part_ids": part_ids, "md5": md5}),
                             headers=json_type, idempotent=False)
        return str(done["file"]["id"])

    def create_from_file(self, input_file_id: str, metadata: Mapping[str, str] | None = None, *,
                         idempotency_key: str | None = None) -> Batch:
        """POST /batches in OpenAI's form: a batch of the lines of an uploaded input file. It
        answers `validating` with no requests counted; the server checks the lines, then starts it
        or fails it with `errors` naming the bad lines."""
        body = {"input_file_id": input_file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h",
                **({"metadata": dict(metadata)} if metadata else {})}
        headers = {"Content-Type": "application/json", "Idempotency-Key": idempotency_key or str(uuid.uuid4())}
        return Batch.model_validate(self._request("POST", "/batches", data=encode_json(body), headers=headers,
                                                  idempotent=True))

    def retry(self, batch_id: str, statuses: Sequence[str] | None = None, metadata: Mapping[str, str] | None = None,
              *, idempotency_key: str | None = None) -> Batch:
        """POST /batches/{batch_id}/retry: a new batch of the finished batch's requests whose results
        are in `statuses` (the server's default: failed and expired), their bodies as sent, in its
        order; its `retry_of` names the batch retried. Without `metadata` it carries the retried
        batch's. Sent with an Idempotency-Key and retried as a create is."""
        document: dict[str, Any] = {}
        if statuses is not None:
            document["statuses"] = list(statuses)
        if metadata is not None:
            document["metadata"] = dict(metadata)
        headers = {"Content-Type": "application/json", "Idempotency-Key": idempotency_key or str(uuid.uuid4())}
        return Batch.model_validate(self._request("POST", f"/batches/{path_segment(batch_id)}/retry",
                                                  data=encode_json(document), headers=headers, idempotent=True))

    def retrieve(self, batch_id: str) -> Batch:
        """GET /batches/{batch_id}."""
        return Batch.model_validate(self._get(f"/batches/{path_segment(batch_id)}"))

    def list(self, limit: int | None = None, after: str | None = None) -> Page[Batch]:
        """GET /batches: one page of your batches, newest first (limit 1-100, default 20)."""
        return Page[Batch].model_validate(self._get("/batches", {"limit": limit, "after": after}))

    def iter_batches(self, page_size: int = 100) -> Iterator[Batch]:
        """Every batch of yours, newest first, paging as needed."""
        after = None
        while True:
            page = self.list(limit=page_size, after=after)
            yield from page.data
            if not page.has_more or not page.last_id:
                return
            after = page.last_id

    def cancel(self, batch_id: str) -> Batch:
        """POST /batches/{batch_id}/cancel (a finished batch comes back unchanged)."""
        path = f"/batches/{path_segment(batch_id)}/cancel"
        return Batch.model_validate(self._request("POST", path, idempotent=False))

    def delete(self, batch_id: str) -> DeletedBatch:
        """DELETE /batches/{batch_id}: the batch with its results (409 while a request runs)."""
        path = f"/batches/{path_segment(batch_id)}"
        return DeletedBatch.model_validate(self._request("DELETE", path, idempotent=False))

    def results(self, batch_id: str, limit: int | None = None, after: str | None = None) -> Page[ResultLine]:
        """GET /batches/{batch_id}/results: one page (limit 1-1000, default 100), in submission order.

        A page may hold fewer than `limit` lines (pages are bounded in bytes too). A body too big
        for any page comes as a link, which this fetches: every completed line carries `body`."""
        page = Page[ResultLine].model_validate(
            self._get(f"/batches/{path_segment(batch_id)}/results", {"limit": limit, "after": after})
        )
        for line in page.data:
            if line.response is not None and line.response.body is None and line.response.body_url:
                line.response.body = self._fetch_body(line.response.body_url)
        return page

    def _fetch_body(self, url: str) -> dict[str, Any]:
        """GET a presigned URL of a stored response body: no API key (the URL carries its own
        signature, and S3 refuses a second authorization), retried like a read."""
        attempt = 0
        while True:
            try:
                response = self.session.request("GET", url, headers={"User-Agent": _USER_AGENT},
                                                timeout=self.timeout)
            except requests.RequestException as error:
                if attempt < self.max_retries:
                    self._sleep(self._backoff(attempt))
                    attempt += 1
                    continue
                raise BatchConnectionError(f"GET {url.split('?')[0]}: {error}") from error
            if response.status_code < 400:
                try:
                    stored = response.json()  # the body itself
                except ValueError:
                    raise BatchApiError(response.status_code, None, "The result body is not JSON") from None
                return stored
            if response.status_code in RETRY_STATUSES and attempt < self.max_retries:
                self._sleep(self._backoff(attempt))
                attempt += 1
                continue
            # Only S3's error code: its XML may quote the signed request (credential, token).
            code = re.search(r"<Code>([A-Za-z]+)</Code>", response.text or "")
            raise BatchApiError(response.status_code, None, "Fetching a result body failed"
                                + (f": {code.group(1)}" if code else f" (HTTP {response.status_code})"))

    def iter_results(self, batch_id: str, page_size: int = 1000) -> Iterator[ResultLine]:
        """Every result line of the batch, in submission order, paging as needed."""
        after = None
        while True:
            page = self.results(batch_id, limit=page_size, after=after)
            yield from page.data
            if not page.has_more or not page.last_id:
                return
            after = page.last_id

    def iter_file_lines(self, file_id: str) -> Iterator[dict[str, Any]]:
        """The lines of a file's content (`GET /files/{file_id}/content`), as JSON, streamed: a batch
        created from a file has its results there (`output_file_id`, `error_file_id`). The answer is
        a redirect to a presigned S3 URL, which requests follows without the API key (it drops the
        Authorization header on another host or port)."""
        url = f"{self.base_url}/files/{path_segment(file_id)}/content"
        attempt = 0
        while True:
            try:
                response = self.session.request("GET", url, headers=self._headers, timeout=self.timeout, stream=True)
            except requests.RequestException as error:
                if attempt < self.max_retries:
                    self._sleep(self._backoff(attempt))
                    attempt += 1
                    continue
                raise BatchConnectionError(f"GET {url}: {error}") from error
            if response.status_code < 400:
                break
            error = api_error_from_response(response)
            if response.status_code in RETRY_STATUSES and attempt < self.max_retries:
                self._sleep(self._backoff(attempt, error.retry_after))
                attempt += 1
                continue
            raise error
        with response:
            for line in response.iter_lines():
                if line.strip():
                    yield json.loads(line)

    def wait(
        self,
        batch_id: str,
        poll_interval: float = 10.0,
        timeout: float | None = None,
        on_update: Callable[[Batch], None] | None = None,
    ) -> Batch:
        """Poll the batch until its status is final; answers the final batch object.

        `on_update` is called with every batch object read; TimeoutError after `timeout` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            batch = self.retrieve(batch_id)
            if on_update is not None:
                on_update(batch)
            if batch.is_final:
                return batch
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"batch {batch_id} is still {batch.status} after {timeout} s")
            pause = poll_interval
            if deadline is not None:
                pause = max(0.0, min(pause, deadline - time.monotonic()))
            self._sleep(pause)


def _multipart(name: str, filename: str, content: bytes, **fields: str) -> tuple[bytes, str]:
    """A multipart/form-data body of `fields` and one file part; answers it and its content type."""
    boundary = f"freeinference-{uuid.uuid4().hex}"
    head = b"".join(f'--{boundary}\r\nContent-Disposition: form-data; name="{key}"\r\n\r\n{value}\r\n'.encode()
                    for key, value in fields.items())
    quoted = filename.replace('"', "_").replace("\r", "_").replace("\n", "_")
    part = (f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{quoted}"\r\n'
            "Content-Type: application/jsonl\r\n\r\n").encode()
    return head + part + content + f"\r\n--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"
