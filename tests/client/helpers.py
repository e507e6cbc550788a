"""What the client's tests share: a fake HTTP session answering queued responses, and the API's
answers as the server writes them (a batch, a result line, a page, an error)."""

from __future__ import annotations

import json
from typing import Any

import requests
from freeinference_batch_client.client import BatchClient

KEY = "hyi-test-key"
BATCH_ID = "batch_" + "a" * 32


def batch_json(status: str = "validating", **fields: Any) -> dict:
    return {
        "id": BATCH_ID, "object": "batch", "endpoint": "/v1/chat/completions", "errors": None,
        "input_file_id": None, "completion_window": "24h", "status": status, "output_file_id": None,
        "error_file_id": None, "created_at": 100, "in_progress_at": None, "expires_at": 86500,
        "finalizing_at": None, "completed_at": None, "failed_at": None, "expired_at": None,
        "cancelling_at": None, "cancelled_at": None, "request_counts": {"total": 2, "completed": 0, "failed": 0},
        "metadata": None, "cost_usd": 0.0, "error": None, "retry_of": None, "waiting": None,
        **fields,
    }


def result_json(number: int, status: str = "completed") -> dict:
    return {"id": f"batch_req_{number}", "custom_id": f"q-{number}", "status": status,
            "response": {"status_code": 200, "request_id": f"req_{number}", "body": {"id": "c"}}
            if status == "completed" else None,
            "error": None if status == "completed" else {"code": "timeout", "message": "slow", "status": 504}}


def page(data: list, has_more: bool = False) -> dict:
    return {"object": "list", "data": data, "has_more": has_more,
            "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None}


def error_json(message: str, code: str, type_: str = "invalid_request_error", param: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "code": code, "param": param}}


def response(status: int, body: Any = None, headers: dict | None = None, raw: bytes | None = None) -> requests.Response:
    answer = requests.Response()
    answer.status_code = status
    answer._content = raw if raw is not None else json.dumps(body).encode()
    answer.headers.update(headers or {})
    answer.headers.setdefault("Content-Type", "application/json")
    return answer


class FakeSession:
    """Answers queued responses (or raises queued exceptions) and records every call."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.calls: list[dict] = []

    def request(self, method: str, url: str, **kwargs: Any) -> requests.Response:
        self.calls.append({"method": method, "url": url, **kwargs})
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


def make(*answers: Any, **options: Any) -> tuple[BatchClient, FakeSession, list[float]]:
    session = FakeSession(*answers)
    client = BatchClient(KEY, "http://api.test/v1/", session=session, **options)  # type: ignore[arg-type]
    sleeps: list[float] = []
    client._sleep = sleeps.append
    return client, session, sleeps
