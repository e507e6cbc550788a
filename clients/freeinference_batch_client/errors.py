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
# A query string is a `?` with an `=` after it before the next space, quote or angle bracket; it
# ends there or at a `)`. Matched as the stretch from the first `?` to that end and read in one
# pass (`_redact_queries`): a lookahead from every `?` rescanned the stretch from each of them,
# quadratic on text of many `?`.
_STRETCH = re.compile(r"\?[^\s'\"<>]*+")
# Signing parameters that slipped out of a URL (percent-decoded, or quoted in S3's error XML): a
# name (`X-Amz-...`, `Signature`, `AWSAccessKeyId`, any case) at a word boundary, then `=` and its
# value. Found from each whole run of letters and hyphens before an `=` (the lookbehind makes an
# attempt inside a run fail at once), the name then sought in the run (`_signing_name`): a regex
# starting at each `X-Amz-` of a long run rescanned it from each (quadratic).
_NAME_BEFORE_EQUALS = re.compile(r"(?<![A-Za-z-])[A-Za-z-]++(?==)")
_VALUE = re.compile(r"[^&\s'\"<>)]*+")
_WORD = re.compile(r"\w")
_EXACT_NAMES = ("signature", "awsaccesskeyid")


def _redact_queries(stretch: re.Match[str]) -> str:
    """A stretch (from a `?` to a space, quote or angle bracket) with its query strings replaced:
    from each `?` that an `=` follows in the stretch up to the next `)`, and on from the next `?`."""
    text = stretch.group()
    last_equals = text.rfind("=")
    out: list[str] = []
    start = 0  # text[start] is a `?`
    while start <= last_equals:  # an `=` follows this `?`
        out.append("?<redacted>")
        closing = text.find(")", start)
        following = text.find("?", closing) if closing >= 0 else -1
        if following < 0:
            out.append(text[closing:] if closing >= 0 else "")
            return "".join(out)
        out.append(text[closing:following])
        start = following
    out.append(text[start:])
    return "".join(out)


def _signing_name(text: str, run: re.Match[str]) -> int | None:
    """Where in `run` (letters and hyphens just before an `=`) a signing parameter's name begins,
    the leftmost, or None. It begins at a word boundary: the run's start after a character that is
    not a word character, or just after one of its hyphens."""
    name = run.group().lower()
    starts = ([0] if run.start() == 0 or not _WORD.match(text, run.start() - 1) else [])
    starts += [index + 1 for index, char in enumerate(name) if char == "-"]
    for start in starts:
        rest = len(name) - start
        if (rest > 6 and name.startswith("x-amz-", start)) or any(
                rest == len(exact) and name.startswith(exact, start) for exact in _EXACT_NAMES):
            return start
    return None


def _redact_signing(text: str) -> str:
    out: list[str] = []
    done = 0  # text before this is out (a value redacted may hold more `name=`: it is gone)
    for run in _NAME_BEFORE_EQUALS.finditer(text):
        if run.start() < done:
            continue
        start = _signing_name(text, run)
        if start is None:
            continue
        out.append(text[done:run.start() + start])
        out.append(f"{run.group()[start:]}=<redacted>")
        done = _VALUE.match(text, run.end() + 1).end()
    out.append(text[done:])
    return "".join(out)


def redact(text: str) -> str:
    """`text` with every query string and signing parameter replaced, for printing."""
    return _redact_signing(_STRETCH.sub(_redact_queries, text))


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
