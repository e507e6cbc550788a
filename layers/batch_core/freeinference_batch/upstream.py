"""Calling the OpenAI-compatible upstream and classifying what comes back."""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass
from typing import Any, Literal

import requests

from freeinference_batch.settings import Settings

_local = threading.local()

Kind = Literal["completed", "retry", "failed"]


@dataclass(frozen=True)
class Outcome:
    kind: Kind
    response: dict[str, Any] | None = None  # {status_code, request_id, body} when completed
    error: dict[str, Any] | None = None  # {code, message, status}
    retry_after: float | None = None


def _session() -> requests.Session:
    session = getattr(_local, "session", None)
    if session is None:
        session = _local.session = requests.Session()
        adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=16)
        session.mount("http://", adapter)
        session.mount("https://", adapter)
    return session


def classify(status: int, message: str) -> tuple[Kind, dict]:
    """The spec's error codes: timeouts, 429 and 5xx are retried; any other 4xx fails at once."""
    if status in (400, 422):
        return "failed", {"code": "invalid_request", "message": message, "status": status}
    if status == 404:
        return "failed", {"code": "model_not_found", "message": message, "status": status}
    if status in (401, 403):
        return "failed", {"code": "forbidden", "message": message, "status": status}
    if status == 408:
        return "retry", {"code": "timeout", "message": message, "status": status}
    if status == 429:
        return "retry", {"code": "rate_limited", "message": message, "status": status}
    if status == 504:
        return "retry", {"code": "timeout", "message": message, "status": status}
    if status == 503:
        return "retry", {"code": "service_unavailable", "message": message, "status": status}
    if status >= 500:
        return "retry", {"code": "upstream_error", "message": message, "status": status}
    return "failed", {"code": "invalid_request", "message": message, "status": status}


def _error_message(response: requests.Response) -> str:
    try:
        detail = response.json().get("error", {})
        message = detail.get("message") if isinstance(detail, dict) else str(detail)
    except (ValueError, AttributeError):
        message = None
    return str(message or f"Upstream answered HTTP {response.status_code}")[:1000]


def _retry_after(response: requests.Response) -> float | None:
    try:
        return float(response.headers.get("retry-after", ""))
    except ValueError:
        return None


def call(settings: Settings, body: dict, *, account_id: str, request_ref: str) -> Outcome:
    """Send one chat completion as the owner's account, with the service credential (we keep
    only hashes of users' keys, never the keys)."""
    headers = {"X-FreeInference-Account": account_id, "X-FreeInference-Request-Id": request_ref,
               "X-FreeInference-Source": "batch"}
    if settings.upstream_api_key:
        headers["Authorization"] = f"Bearer {settings.upstream_api_key}"
    url = settings.upstream_base_url.rstrip("/") + "/chat/completions"
    try:
        response = _session().post(url, json=body, headers=headers, timeout=settings.batch_upstream_timeout_seconds)
    except requests.Timeout:
        return Outcome("retry", error={"code": "timeout", "status": 504,
                                       "message": f"No answer within {settings.batch_upstream_timeout_seconds:g} s"})
    except requests.RequestException as error:
        return Outcome("retry", error={"code": "service_unavailable", "status": 503,
                                       "message": f"Could not reach the model: {type(error).__name__}"})
    if response.status_code == 200:
        try:
            completion = response.json()
            if not isinstance(completion, dict):
                raise ValueError("not an object")
        except ValueError:
            return Outcome("retry", error={"code": "upstream_error", "status": 502,
                                           "message": "The model answered with a body that is not a JSON object"})
        request_id = response.headers.get("x-request-id") or f"req_{uuid.uuid4().hex}"
        return Outcome("completed", response={"status_code": 200, "request_id": request_id, "body": completion})
    kind, error = classify(response.status_code, _error_message(response))
    return Outcome(kind, error=error, retry_after=_retry_after(response))


def usage_of(completion: dict) -> tuple[int, int]:
    usage = completion.get("usage") or {}
    try:
        return max(0, int(usage.get("prompt_tokens") or 0)), max(0, int(usage.get("completion_tokens") or 0))
    except (TypeError, ValueError):
        return 0, 0
