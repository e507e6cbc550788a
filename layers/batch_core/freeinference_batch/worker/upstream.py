"""Calling the OpenAI-compatible upstream and classifying what comes back."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import requests
import urllib3

from freeinference_batch.core import aws
from freeinference_batch.core.observability import logger
from freeinference_batch.core.settings import Settings
from freeinference_batch.worker.call_budget import CallBudget

_local = threading.local()

# "cut": the call ran out of the time its invocation had left, short of the most a call may run
# (call_budget.py): not the upstream's fault, and not an attempt; the request runs again.
Kind = Literal["completed", "retry", "failed", "cut"]
# Reaching the model's server is quick, or it is down: a connection that takes longer is retried.
CONNECT_TIMEOUT_SECONDS = 10.0
# A completion of the longest answer a model writes is a few MB of JSON; more is not a completion,
# and reading it whole could take the worker's memory (and every other request it runs) down.
MAX_RESPONSE_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class Outcome:
    kind: Kind
    response: dict[str, Any] | None = None  # {status_code, request_id, body} when completed
    error: dict[str, Any] | None = None  # {code, message, status}
    retry_after: float | None = None
    # Tokens the upstream reports having served, (prompt, completion), for an answer we cannot
    # keep: charged once all the same, as the model did the work.
    usage: tuple[int, int] | None = None
    # A metric to emit for an answer that is the service's fault (its alarm pages the on-call).
    alert: str | None = None


class _TooLarge(Exception):
    pass


class _BodyReadTimeout(Exception):
    """A read timeout while the body streams in (requests reports it as a ConnectionError)."""


def _session() -> requests.Session:
    session = getattr(_local, "session", None)
    if session is None:
        session = _local.session = requests.Session()
        adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=16)
        session.mount("http://", adapter)
        session.mount("https://", adapter)
    return session


# The upstream refused the service's own credential: our fault, never the user's request's.
CREDENTIAL_REJECTED_METRIC = "UpstreamCredentialRejected"
# What users read for a server-side failure: the upstream's own text (stack traces, hostnames,
# its view of our credential) goes to our logs only.
_SERVER_MESSAGES = {
    401: "The model's server could not serve the request (a fault on FreeInference's side, not in your request)",
    503: "No provider could serve the request (HTTP 503)",
    504: "The model's server timed out (HTTP 504)",
}


def classify(status: int, message: str) -> tuple[Kind, dict]:
    """The spec's error codes: timeouts, 429 and 5xx are retried; any other 4xx fails at once.
    A 401 means the upstream refused our service credential (users' keys never go upstream): a
    service fault, retried like a 5xx and reported `upstream_error`. The text users see of a
    401 or a 5xx is ours, not the upstream's (`call` logs the upstream's)."""
    if status in (400, 422):
        return "failed", {"code": "invalid_request", "message": message, "status": status}
    if status == 404:
        return "failed", {"code": "model_not_found", "message": message, "status": status}
    if status == 401:
        return "retry", {"code": "upstream_error", "message": _SERVER_MESSAGES[401], "status": 502}
    if status == 403:
        return "failed", {"code": "forbidden", "message": message, "status": status}
    if status == 408:
        return "retry", {"code": "timeout", "message": message, "status": status}
    if status == 429:
        return "retry", {"code": "rate_limited", "message": message, "status": status}
    if status == 504:
        return "retry", {"code": "timeout", "message": _SERVER_MESSAGES[504], "status": status}
    if status == 503:
        return "retry", {"code": "service_unavailable", "message": _SERVER_MESSAGES[503], "status": status}
    if status >= 500:
        return "retry", {"code": "upstream_error", "message": f"The model's server failed (HTTP {status})",
                         "status": status}
    return "failed", {"code": "invalid_request", "message": message, "status": status}


def _error_message(response: requests.Response) -> str:
    try:
        # An error body worth reading is small: look at its first 64 KB only.
        detail = json.loads(next(response.iter_content(chunk_size=64 * 1024), b"")).get("error", {})
        message = detail.get("message") if isinstance(detail, dict) else str(detail)
    except (ValueError, AttributeError, RecursionError, requests.RequestException):
        message = None
    return str(message or f"Upstream answered HTTP {response.status_code}")[:1000]


def _retry_after(response: requests.Response) -> float | None:
    try:
        return float(response.headers.get("retry-after", ""))
    except ValueError:
        return None


def _read_body(response: requests.Response, holding: Callable[[int], None] | None, until: float) -> bytes:
    """The response body, refusing to hold more than MAX_RESPONSE_BYTES of it. `holding` hears
    how much is read so far before each chunk is kept (and may make the read wait). `until`
    (time.monotonic()): the call's budget, which a body trickling in must not outlast (the read
    timeout bounds each read, not the whole body)."""
    chunks, size = [], 0
    for chunk in response.iter_content(chunk_size=256 * 1024):
        if time.monotonic() > until:
            raise requests.ReadTimeout("the answer outlasted the call's budget")
        size += len(chunk)
        if size > MAX_RESPONSE_BYTES:
            raise _TooLarge
        if holding is not None:
            holding(size)
        chunks.append(chunk)
    return b"".join(chunks)


# How much of an upstream's error text our logs keep: enough to tell what it said, too little to
# carry a prompt or a credential it may quote back.
LOGGED_TEXT_CHARS = 200


def _for_log(text: str) -> str:
    return text if len(text) <= LOGGED_TEXT_CHARS else text[:LOGGED_TEXT_CHARS] + "..."


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _completion(response: requests.Response, text: bytes) -> Outcome:
    """A 200 answer: completed if it is a JSON object. Anything else is not a chat completion but
    a server error behind the 200 (a proxy's error page, a truncated or corrupted answer), so it is
    retried like a 5xx and reported `upstream_error` after every retry; the last attempt is charged
    for the usage it reports, if any (retried attempts are not, as a 5xx is not)."""
    try:
        completion = json.loads(text, parse_constant=_refuse_constant)
        if not isinstance(completion, dict):
            raise ValueError(f"a JSON {type(completion).__name__}, not an object")
    except (ValueError, RecursionError) as error:
        try:  # Python's own reading forgives NaN and Infinity: enough to learn the usage, maybe
            lenient = json.loads(text)
            usage = usage_of(lenient) if isinstance(lenient, dict) else None
        except (ValueError, RecursionError):
            usage = None
        return Outcome("retry", usage=usage, error={
            "code": "upstream_error", "status": 502,
            "message": f"The model's answer is not valid JSON ({str(error)[:200]}); it was not kept"})
    request_id = response.headers.get("x-request-id") or f"req_{uuid.uuid4().hex}"
    return Outcome("completed", response={"status_code": 200, "request_id": request_id, "body": completion})


def api_key(settings: Settings) -> str:
    """The service credential in force now: the secret's current value when one is configured
    (cached a few minutes, so rotating it needs no deploy), else the plain setting (local stack)."""
    if settings.upstream_api_key_secret:
        return aws.secret_string(settings.upstream_api_key_secret, settings.upstream_api_key_max_age_seconds)
    return settings.upstream_api_key


def call(settings: Settings, body: bytes, *, account_id: str, request_ref: str,
         holding: Callable[[int], None] | None = None, budget: CallBudget | None = None) -> Outcome:
    """Send one chat completion (its body as the JSON bytes stored at create) as the owner's
    account, with the service credential (we keep only hashes of users' keys, never the keys).
    `holding`: told the response's size as it is read (see worker/memory.py). `budget`: how long
    the call may run (call_budget.py; the timeout when not given)."""
    headers = {"X-FreeInference-Account": account_id, "X-FreeInference-Request-Id": request_ref,
               "X-FreeInference-Source": "batch", "Content-Type": "application/json"}
    key = api_key(settings)
    if key:
        headers["Authorization"] = f"Bearer {key}"
    url = settings.upstream_base_url.rstrip("/") + "/chat/completions"
    if budget is None:
        budget = CallBudget(settings.batch_upstream_timeout_seconds, settings.batch_upstream_timeout_seconds)
    until = time.monotonic() + budget.seconds
    timeout = (min(CONNECT_TIMEOUT_SECONDS, budget.seconds), budget.seconds)
    try:
        with _session().post(url, data=body, headers=headers, timeout=timeout, stream=True) as response:
            if response.status_code != 200:
                text = _error_message(response)
                kind, error = classify(response.status_code, text)
                alert = None
                if response.status_code == 401:
                    alert = CREDENTIAL_REJECTED_METRIC
                    logger.error("the upstream refused the service credential", extra={
                        "request_ref": request_ref, "status": 401, "upstream_message": _for_log(text)})
                elif response.status_code >= 500:
                    logger.warning("the upstream answered a server error", extra={
                        "request_ref": request_ref, "status": response.status_code,
                        "upstream_message": _for_log(text)})
                return Outcome(kind, error=error, retry_after=_retry_after(response), alert=alert)
            try:
                text = _read_body(response, holding, until)
            except requests.ConnectionError as error:
                if isinstance(error.args[0] if error.args else None, urllib3.exceptions.ReadTimeoutError):
                    raise _BodyReadTimeout from error
                raise
            return _completion(response, text)
    except _TooLarge:  # not a completion a worker can hold: a server error, as above
        return Outcome("retry", error={"code": "upstream_error", "status": 502,
                                        "message": f"The model's answer is larger than {MAX_RESPONSE_BYTES} bytes; "
                                                   "it was not kept"})
    except requests.ConnectTimeout:
        return Outcome("retry", error={"code": "timeout", "status": 504,
                                       "message": f"Could not reach the model within {timeout[0]:g} s"})
    except (requests.Timeout, _BodyReadTimeout):
        if budget.cut:  # the invocation's end, not the answer's length: run it again in a fresh one
            return Outcome("cut")
        # The call had the most a batch request may run: a timeout, retried as the spec promises
        # (up to eight attempts in all: each holds its slots this long, see README "Sizing a model").
        return Outcome("retry", error={"code": "timeout", "status": 504, "message": (
            f"The answer took longer than the {budget.longest:g} s a batch request may run")})
    except requests.RequestException as error:
        return Outcome("retry", error={"code": "service_unavailable", "status": 503,
                                       "message": f"Could not reach the model: {type(error).__name__}"})


def after_last_attempt(error: dict[str, Any] | None, attempts: int) -> dict[str, Any] | None:
    """The error a retried outcome reports once its request has had its last attempt: a timeout
    says it was still timing out after every attempt (the spec's `timeout`), so a user reading it
    knows retrying the same request as is would most likely time out again."""
    if error is None or error.get("code") != "timeout":
        return error
    return {**error, "message": f"{error['message']}; still timing out after {attempts} attempts, "
                               "it is not tried again"}


def usage_of(completion: dict) -> tuple[int, int]:
    usage = completion.get("usage") or {}
    try:
        return max(0, int(usage.get("prompt_tokens") or 0)), max(0, int(usage.get("completion_tokens") or 0))
    except (TypeError, ValueError):
        return 0, 0
