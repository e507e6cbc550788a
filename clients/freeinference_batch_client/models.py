"""The API's objects as the client reads them (pydantic models, lenient about fields a newer
server adds)."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict

FINAL_STATUSES = frozenset({"completed", "failed", "expired", "cancelled"})


class _Model(BaseModel):
    # Lenient: fields a newer server adds are kept, not refused.
    model_config = ConfigDict(extra="allow")


class RequestCounts(_Model):
    total: int
    completed: int
    failed: int


class BatchFailure(_Model):
    """Why a whole batch failed (`Batch.error`)."""

    code: str
    message: str


class BatchWaiting(_Model):
    """Why none of a batch's requests can start now (`Batch.waiting`): `reason` is one of
    batch_access, concurrency, model_busy, daily_quota (a newer server may add others)."""

    reason: str
    message: str
    since: int


class Batch(_Model):
    id: str
    object: str = "batch"
    endpoint: str = "/v1/chat/completions"
    errors: Any = None
    input_file_id: str | None = None
    completion_window: str
    status: str
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts
    metadata: dict[str, str] | None = None
    cost_usd: float = 0.0
    error: BatchFailure | None = None
    # The batch this one retries (its parent), else None; a server before retries sends none.
    retry_of: str | None = None
    # Why its requests cannot start now, else None; a server before it sends none.
    waiting: BatchWaiting | None = None

    @property
    def is_final(self) -> bool:
        return self.status in FINAL_STATUSES


class ResultResponse(_Model):
    status_code: int
    request_id: str
    # The API gives a body too big for any page as `body: null` plus `body_url`; the client
    # fetches it, so lines it returns always carry `body`.
    body: dict[str, Any] | None = None
    body_url: str | None = None


class ResultError(_Model):
    code: str
    message: str
    status: int | None = None


class ResultLine(_Model):
    id: str
    custom_id: str
    status: str
    response: ResultResponse | None = None
    error: ResultError | None = None


T = TypeVar("T")


class Page(_Model, Generic[T]):
    object: str = "list"
    data: list[T]
    has_more: bool
    first_id: str | None = None
    last_id: str | None = None


class DeletedBatch(_Model):
    id: str
    object: str = "batch.deleted"
    deleted: bool


class WebhookEndpoint(_Model):
    id: str
    object: str = "webhook_endpoint"
    url: str
    name: str
    event_types: list[str]
    created_at: int
    updated_at: int
    signing_secret_hint: str
    # Only in the answers of create and rotate_secret: no other call shows it again.
    signing_secret: str | None = None


class DeletedWebhookEndpoint(_Model):
    id: str
    object: str = "webhook_endpoint.deleted"
    deleted: bool


class WebhookTestResult(_Model):
    object: str = "webhook_endpoint.test"
    webhook_endpoint_id: str
    event_type: str
    # What the receiver answered (a delivery that got no answer at all is a 400 webhook_test_failed).
    status_code: int
    success: bool = True
