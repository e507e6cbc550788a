"""What the client raises: API and connection errors, their text redacted of presigned links'
signatures (`redact`), and the error answer of the API read into a `BatchApiError`."""

from __future__ import annotations

import datetime as dt
import email.utils
import re
from typing import Any

import requests

# A URL's query string wherever a message holds one: a result's presigned link carries its
# signature (and the signer's credential) there, and urllib3's error text repeats the full URL.
_QUERY = re.compile(r"\?(?=[^\s'\"<>]*=)[^\s'\"<>)]*")
# Signing parameters that slipped out of a URL (percent-decoded, or quoted in S3's error XML).
_SIGNING = re.compile(r"(?i)\b(X-Amz-[A-Za-z-]+|Signature|AWSAccessKeyId)=[^&\s'\"<>)]*")


def redact(text: str) -> str:
    """`text` with every query string and signing parameter replaced, for printing."""
    return _SIGNING.sub(r"\1=<redacted>", _QUERY.sub("?<redacted>", text))


class BatchClientError(Exception):
    """Anything the client raises about talking to the API. Its text never holds a query string
    (a presigned link's signature would be a credential for anyone reading the error)."""

    def __init__(self, message: str = "", *args: Any) -> None:
        super().__init__(redact(str(message)), *args)


class BatchApiError(BatchClientError):
    """An error answer of the API: its HTTP `status`, the error `code` and `message`."""

    def __init__(
        self,
        status: int,
        code: str | None,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        body: Any = None,
        retry_after: float | None = None,
    ) -> None:
        message = redact(message)
        super().__init__(f"{status} {code or 'error'}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.type = type
        self.param = param
        self.body = body
        self.retry_after = retry_after


class BatchConnectionError(BatchClientError):
    """The API could not be reached (after the retries allowed), or did not answer in time."""


def _retry_after_seconds(value: str | None) -> float | None:
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return max(0.0, (when - dt.datetime.now(dt.UTC)).total_seconds())


def api_error_from_response(response: requests.Response) -> BatchApiError:
    """A BatchApiError from an error answer: the API's `{"error": {...}}` body, API Gateway's
    `{"message": ...}`, or the plain text of anything else."""
    retry_after = _retry_after_seconds(response.headers.get("Retry-After"))
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        error = body["error"]
        return BatchApiError(
            response.status_code,
            error.get("code"),
            str(error.get("message") or response.reason or "error"),
            type=error.get("type"),
            param=error.get("param"),
            body=body,
            retry_after=retry_after,
        )
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return BatchApiError(response.status_code, None, body["message"], body=body, retry_after=retry_after)
    text = (response.text or "").strip()[:500] or str(response.reason or "error")
    return BatchApiError(response.status_code, None, text, body=body, retry_after=retry_after)
