"""Requests and answers between the fault injector and moto's WSGI app: a request's body read once
(and replaced, when a fault changes it), moto's answer captured whole, JSON answers written as
AWS's JSON protocol carries them, and which account and region's moto backend a request meets."""

from __future__ import annotations

import io
import json
import os
import re
import uuid
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from moto.iam.models import get_account_id_from

from freeinference_batch_local.aws_faults.config import FAULT_NAMES, FAULTS_PATH

_CREDENTIAL_SCOPE = re.compile(r"Credential=([^/,\s]+)/\d{8}/([^/]+)/([^/]+)/aws4_request")
_JSON_1_0 = "application/x-amz-json-1.0"

WsgiApp = Callable[..., Iterable[bytes]]


@dataclass
class Answer:
    status: str
    headers: list[tuple[str, str]]
    body: bytes

    @property
    def code(self) -> int:
        return int(self.status.split(" ", 1)[0])

    @property
    def ok(self) -> bool:
        return 200 <= self.code < 300

    def json(self) -> Any:
        return json.loads(self.body or b"{}")

    def with_json(self, document: Any) -> Answer:
        body = json.dumps(document, separators=(",", ":")).encode("utf-8")
        replaced = {"content-length": str(len(body)), "x-amz-crc32": str(zlib.crc32(body) & 0xFFFFFFFF)}
        headers = [(name, replaced.get(name.lower(), value)) for name, value in self.headers]
        return Answer(self.status, headers, body)


def json_answer(status: str, document: Any, extra_headers: Iterable[tuple[str, str]] = ()) -> Answer:
    body = json.dumps(document, separators=(",", ":")).encode("utf-8")
    headers = [
        ("Content-Type", _JSON_1_0),
        ("Content-Length", str(len(body))),
        ("x-amzn-RequestId", str(uuid.uuid4())),
        ("x-amz-crc32", str(zlib.crc32(body) & 0xFFFFFFFF)),
        *extra_headers,
    ]
    return Answer(status, headers, body)


def counts_answer(counts: Mapping[str, int], start_response: Callable[..., Any]) -> list[bytes]:
    body = json.dumps({name: counts.get(name, 0) for name in FAULT_NAMES}).encode("utf-8")
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]


class CountsOnly:
    """No fault on: moto as it is, plus the counts' path (all 0)."""

    def __init__(self, app: WsgiApp) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == FAULTS_PATH:
            return counts_answer({}, start_response)
        return self.app(environ, start_response)


@dataclass
class Request:
    environ: dict[str, Any]
    body: bytes
    marked: bool
    modified: bool = False  # `document` was changed: it, not `body`, is what moto must get
    _document: Any = None

    @property
    def document(self) -> Any:
        if self._document is None:
            self._document = json.loads(self.body or b"{}")
        return self._document

    def replaced(self, document: Any) -> dict[str, Any]:
        """This request's environ with another JSON body."""
        body = json.dumps(document).encode("utf-8")
        environ = dict(self.environ)
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        return environ

    def fresh(self) -> dict[str, Any]:
        """This request's environ with its body readable again."""
        self.environ["wsgi.input"] = io.BytesIO(self.body)
        return self.environ

    def current(self) -> dict[str, Any]:
        """The environ of the request as it is now (`document`, if it was changed)."""
        return self.replaced(self.document) if self.modified else self.fresh()


def read_request(environ: dict[str, Any], marked: bool) -> Request:
    stream = environ["wsgi.input"]
    body = stream.getvalue() if isinstance(stream, io.BytesIO) else stream.read()
    return Request(environ, body, marked)


def forward(app: WsgiApp, environ: dict[str, Any]) -> Answer:
    """`app`'s answer to `environ`, whole."""
    captured: dict[str, Any] = {}
    written: list[bytes] = []

    def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], Any]:
        captured["status"], captured["headers"] = status, headers
        return written.append

    result = app(environ, capture)
    try:
        body = b"".join([*written, *result])
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    return Answer(captured["status"], list(captured["headers"]), body)


def scope(environ: Mapping[str, Any]) -> tuple[str, str, str]:
    """(access key, region, service) of a SigV4-signed request; empty strings if unsigned."""
    found = _CREDENTIAL_SCOPE.search(environ.get("HTTP_AUTHORIZATION") or "")
    return (found.group(1), found.group(2), found.group(3)) if found else ("", "", "")


def moto_backend(backends: Any, environ: Mapping[str, Any]) -> Any:
    """The backend of `backends` (one service's, moto's `<service>_backends`) that serves a request:
    its account picked as moto's BaseResponse.get_current_account picks it, and its region."""
    access_key, region, _ = scope(environ)
    account = os.environ.get("MOTO_ACCOUNT_ID") or environ.get("HTTP_X_MOTO_ACCOUNT_ID") or get_account_id_from(
        access_key or "AKIAEXAMPLE"
    )
    return backends[account][region or "us-east-1"]
