"""The webhook-endpoint routes of the client (`client.webhooks`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

from freeinference_batch_client.encoding import encode_json, path_segment
from freeinference_batch_client.models import (
    DeletedWebhookEndpoint,
    Page,
    WebhookEndpoint,
    WebhookTestResult,
)


class Transport(Protocol):
    """What the endpoints need of `BatchClient` (named here, not imported: client.py imports this module)."""

    def _request(self, method: str, path: str, *, data: bytes | None = ..., headers: Mapping[str, str] | None = ...,
                 idempotent: bool) -> Any: ...

    def _get(self, path: str, params: Mapping[str, Any] | None = None) -> Any: ...

WEBHOOK_EVENT_TYPES = ("batch.completed", "batch.failed", "batch.expired", "batch.cancelled")


class WebhookEndpoints:
    """The webhook-endpoint routes (`client.webhooks`), named as the OpenAI SDK's `client.webhooks`.

    Reads are retried like the batch reads; create, update, delete, rotate_secret and test are
    retried only when the request certainly never reached the server: none is safe to repeat
    (a second create is a second endpoint, a second rotate another secret, a second test another
    delivery)."""

    def __init__(self, client: Transport) -> None:
        self._client = client

    def _write(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        data = encode_json(body) if body is not None else None
        headers = {"Content-Type": "application/json"} if body is not None else None
        return self._client._request(method, path, data=data, headers=headers, idempotent=False)

    def create(self, url: str, name: str, event_types: Sequence[str] = WEBHOOK_EVENT_TYPES) -> WebhookEndpoint:
        """POST /webhook_endpoints: its answer holds `signing_secret`, which no later call shows."""
        return WebhookEndpoint.model_validate(self._write("POST", "/webhook_endpoints", {
            "url": url, "name": name, "event_types": list(event_types)}))

    def retrieve(self, endpoint_id: str) -> WebhookEndpoint:
        return WebhookEndpoint.model_validate(self._client._get(f"/webhook_endpoints/{path_segment(endpoint_id)}"))

    def list(self, limit: int | None = None, after: str | None = None) -> Page[WebhookEndpoint]:
        """GET /webhook_endpoints: one page, oldest first (limit 1-100, default 20)."""
        return Page[WebhookEndpoint].model_validate(
            self._client._get("/webhook_endpoints", {"limit": limit, "after": after}))

    def iter(self, page_size: int = 100) -> Iterator[WebhookEndpoint]:
        """Every endpoint of yours, paging as needed."""
        after = None
        while True:
            page = self.list(limit=page_size, after=after)
            yield from page.data
            if not page.has_more or not page.last_id:
                return
            after = page.last_id

    def update(self, endpoint_id: str, *, url: str | None = None, name: str | None = None,
               event_types: Sequence[str] | None = None) -> WebhookEndpoint:
        """POST /webhook_endpoints/{id}: only the fields given change."""
        body = {k: v for k, v in {"url": url, "name": name,
                                  "event_types": list(event_types) if event_types is not None else None}.items()
                if v is not None}
        path = f"/webhook_endpoints/{path_segment(endpoint_id)}"
        return WebhookEndpoint.model_validate(self._write("POST", path, body))

    def delete(self, endpoint_id: str) -> DeletedWebhookEndpoint:
        """DELETE /webhook_endpoints/{id}: its pending deliveries stop too."""
        return DeletedWebhookEndpoint.model_validate(
            self._write("DELETE", f"/webhook_endpoints/{path_segment(endpoint_id)}"))

    def rotate_secret(self, endpoint_id: str, *, keep_old_secret_active_for_24_hours: bool = False) -> WebhookEndpoint:
        """A new signing secret (in the answer only); the old one also signs for 24 h if asked."""
        return WebhookEndpoint.model_validate(self._write(
            "POST", f"/webhook_endpoints/{path_segment(endpoint_id)}/rotate_secret",
            {"keep_old_secret_active_for_24_hours": keep_old_secret_active_for_24_hours}))

    def test(self, endpoint_id: str, event_type: str = "batch.completed") -> WebhookTestResult:
        """One signed test delivery now: what the receiver answered."""
        return WebhookTestResult.model_validate(self._write(
            "POST", f"/webhook_endpoints/{path_segment(endpoint_id)}/test", {"event_type": event_type}))

    def event_types(self) -> list[str]:
        """GET /webhook_event_types."""
        return list(self._client._get("/webhook_event_types")["data"])
