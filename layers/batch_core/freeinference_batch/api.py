"""The HTTP API: the batch routes and the webhook-endpoint routes on a Powertools resolver.

Each route authenticates, calls one domain function and shapes the answer; `ApiError`s become
OpenAI-style error bodies with their status.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from botocore.exceptions import BotoCoreError, ClientError

from freeinference_batch import accounts
from freeinference_batch.batches import operations, results, retry
from freeinference_batch.core import aws
from freeinference_batch.core.errors import ApiError, MethodNotAllowed, NotFound, ServiceUnavailable
from freeinference_batch.core.observability import log_status_change, logger
from freeinference_batch.core.settings import get_settings
from freeinference_batch.files import operations as file_operations
from freeinference_batch.files import uploads
from freeinference_batch.webhooks import endpoints


class _Resolver(APIGatewayHttpResolver):
    """Powertools' resolver, which also keeps the methods each path takes: a method the path does
    not take is answered 405 with them as `Allow` (template.yaml routes every method of a path of
    ours here; API Gateway answers paths we do not have)."""

    def __init__(self) -> None:
        super().__init__(strip_prefixes=[])
        self.methods: dict[str, tuple[re.Pattern[str], set[str]]] = {}

    def route(self, rule: str, method: str | list[str] | tuple[str, ...], *args: Any, **kwargs: Any) -> Any:
        # `<batch_id>` in Powertools' rule: one path segment
        pattern = re.compile(re.sub(r"<[^>]+>", "[^/]+", rule))
        self.methods.setdefault(rule, (pattern, set()))[1].update([method] if isinstance(method, str) else method)
        return super().route(rule, method, *args, **kwargs)

    def methods_at(self, path: str) -> list[str]:
        return sorted({m.upper() for pattern, methods in self.methods.values() if pattern.fullmatch(path)
                       for m in methods})


app = _Resolver()


def _within_the_invocations_time(router: APIGatewayHttpResolver, next_middleware: Callable[..., Response]) -> Response:
    """Every route's AWS calls stop retrying in time for the answer to reach the caller before the
    function's timeout (29 s) and API Gateway's 30 s: a 503 with Retry-After (`handle_aws_error`)."""
    context = router.lambda_context
    remaining = context.get_remaining_time_in_millis() / 1000 if context is not None else None
    with aws.deadline(remaining):
        return next_middleware(router)


app.use(middlewares=[_within_the_invocations_time])


# On every answer: a browser must read it as the JSON it says it is, never sniff it into a page.
_EVERY_ANSWER = {"X-Content-Type-Options": "nosniff"}
# On an answer that carries a webhook signing secret: no cache, shared or private, may keep it.
_NOT_STORED = {"Cache-Control": "no-store"}


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(status_code=status, content_type="application/json",
                    body=json.dumps(body, separators=(",", ":")), headers={**_EVERY_ANSWER, **(headers or {})})


def _principal() -> accounts.Principal:
    settings = get_settings()
    if not settings.batch_api_enabled:
        raise NotFound("Batch inference is unavailable at the moment", code="batch_unavailable")
    return accounts.authenticate(settings, app.current_event.headers or {})


def _query(name: str) -> str | None:
    return (app.current_event.query_string_parameters or {}).get(name)


def _raw_body() -> bytes:
    event = app.current_event
    body = event.body or ""
    return base64.b64decode(body) if event.is_base64_encoded else body.encode()


def _headers() -> dict[str, str]:
    return {name.lower(): value for name, value in (app.current_event.headers or {}).items()}


def _created(principal: accounts.Principal, created: operations.Created) -> Response:
    """A create's answer, or a retry's (the same): the new batch, or the replayed one."""
    batch = created.batch
    if created.replayed:
        logger.info("batch create replayed", extra={"batch_id": batch["id"], "account_id": principal.account_id})
        return _json(200, batch, {"Idempotent-Replayed": "true"})
    log_status_change("batch created", batch["id"], batch["status"], None, account_id=principal.account_id,
                      requests=batch["request_counts"]["total"], retry_of=batch["retry_of"])
    return _json(200, batch)


@app.post("/v1/batches")
def create_batch() -> Response:
    principal = _principal()
    headers = _headers()
    return _created(principal, operations.create_batch(get_settings(), principal, _raw_body(),
                                                       headers.get("content-encoding"), headers.get("idempotency-key")))


@app.get("/v1/batches")
def list_batches() -> Response:
    principal = _principal()
    limit = operations.parse_limit(_query("limit"), default=20, maximum=100)
    return _json(200, operations.list_batches(get_settings(), principal, limit, _query("after")))


@app.get("/v1/batches/<batch_id>")
def get_batch(batch_id: str) -> Response:
    return _json(200, operations.get_batch(get_settings(), _principal(), batch_id))


@app.get("/v1/batches/<batch_id>/results")
def get_results(batch_id: str) -> Response:
    principal = _principal()
    limit = operations.parse_limit(_query("limit"), default=100, maximum=1000)
    return _json(200, results.list_results(get_settings(), principal, batch_id, limit, _query("after")))


@app.post("/v1/batches/<batch_id>/cancel")
def cancel_batch(batch_id: str) -> Response:
    principal = _principal()
    batch = operations.cancel_batch(get_settings(), principal, batch_id)
    logger.info("batch cancel", extra={"batch_id": batch_id, "status": batch["status"]})
    return _json(200, batch)


@app.post("/v1/batches/<batch_id>/retry")
def retry_batch(batch_id: str) -> Response:
    principal = _principal()
    headers = _headers()
    return _created(principal, retry.retry_batch(get_settings(), principal, batch_id, _raw_body(),
                                                 headers.get("content-encoding"), headers.get("idempotency-key")))


@app.delete("/v1/batches/<batch_id>")
def delete_batch(batch_id: str) -> Response:
    principal = _principal()
    answer = operations.delete_batch(get_settings(), principal, batch_id)  # logs the change itself
    return _json(200, answer)


# ---- webhook endpoints (OpenAI's paths, so the openai package's client.webhooks works) -----


@app.post("/v1/webhook_endpoints")
def create_webhook_endpoint() -> Response:
    principal = _principal()
    endpoint = endpoints.create_endpoint(get_settings(), principal, _raw_body())
    logger.info("webhook endpoint created", extra={"endpoint_id": endpoint["id"], "account_id": principal.account_id})
    return _json(200, endpoint, _NOT_STORED)


@app.get("/v1/webhook_endpoints")
def list_webhook_endpoints() -> Response:
    principal = _principal()
    limit = operations.parse_limit(_query("limit"), default=20, maximum=100)
    return _json(200, endpoints.list_endpoints(get_settings(), principal, limit, _query("after")))


@app.get("/v1/webhook_endpoints/<endpoint_id>")
def get_webhook_endpoint(endpoint_id: str) -> Response:
    return _json(200, endpoints.get_endpoint(get_settings(), _principal(), endpoint_id))


@app.post("/v1/webhook_endpoints/<endpoint_id>")
def update_webhook_endpoint(endpoint_id: str) -> Response:
    return _json(200, endpoints.update_endpoint(get_settings(), _principal(), endpoint_id, _raw_body()))


@app.delete("/v1/webhook_endpoints/<endpoint_id>")
def delete_webhook_endpoint(endpoint_id: str) -> Response:
    answer = endpoints.delete_endpoint(get_settings(), _principal(), endpoint_id)
    logger.info("webhook endpoint deleted", extra={"endpoint_id": endpoint_id})
    return _json(200, answer)


@app.post("/v1/webhook_endpoints/<endpoint_id>/rotate_secret")
def rotate_webhook_secret(endpoint_id: str) -> Response:
    return _json(200, endpoints.rotate_secret(get_settings(), _principal(), endpoint_id, _raw_body()), _NOT_STORED)


@app.post("/v1/webhook_endpoints/<endpoint_id>/test")
def test_webhook_endpoint(endpoint_id: str) -> Response:
    return _json(200, endpoints.test_endpoint(get_settings(), _principal(), endpoint_id, _raw_body()))


@app.get("/v1/webhook_event_types")
def list_webhook_event_types() -> Response:
    _principal()
    return _json(200, endpoints.event_types())


# ---- files and uploads (OpenAI's paths, so the openai package's client.files and client.uploads work) --


# A content join's share of the call's time: the rest answers (content.py).
_JOIN_MARGIN_SECONDS = 4.0


def _seconds_left() -> float:
    context = app.lambda_context
    remaining = context.get_remaining_time_in_millis() / 1000 if context is not None else 29.0
    return max(0.0, remaining - _JOIN_MARGIN_SECONDS)


@app.post("/v1/files")
def create_file() -> Response:
    principal = _principal()
    answer = file_operations.upload_file(get_settings(), principal, _raw_body(), _headers().get("content-type"))
    logger.info("file created", extra={"file_id": answer["id"], "account_id": principal.account_id,
                                       "bytes": answer["bytes"]})
    return _json(200, answer)


@app.get("/v1/files")
def list_files() -> Response:
    principal = _principal()
    return _json(200, file_operations.list_files(get_settings(), principal, purpose=_query("purpose"),
                                                 limit=_query("limit"), after=_query("after"), order=_query("order")))


@app.get("/v1/files/<file_id>")
def get_file(file_id: str) -> Response:
    return _json(200, file_operations.get_file(get_settings(), _principal(), file_id))


@app.delete("/v1/files/<file_id>")
def delete_file(file_id: str) -> Response:
    principal = _principal()
    answer = file_operations.delete_file(get_settings(), principal, file_id)
    logger.info("file deleted", extra={"file_id": file_id, "account_id": principal.account_id})
    return _json(200, answer)


@app.get("/v1/files/<file_id>/content")
def get_file_content(file_id: str) -> Response:
    # A redirect to a short-lived presigned GET: the content never passes through Lambda's 6 MB
    # answer, and the SDK (httpx) drops Authorization when it follows it to S3's host.
    url = file_operations.content_url(get_settings(), _principal(), file_id, _seconds_left())
    return Response(status_code=307, headers={**_EVERY_ANSWER, "Location": url, "Cache-Control": "no-store"})


@app.post("/v1/uploads")
def create_upload() -> Response:
    return _json(200, uploads.create_upload(get_settings(), _principal(), _raw_body()))


@app.post("/v1/uploads/<upload_id>/parts")
def add_upload_part(upload_id: str) -> Response:
    principal = _principal()
    return _json(200, uploads.add_part(get_settings(), principal, upload_id, _raw_body(),
                                       _headers().get("content-type")))


@app.post("/v1/uploads/<upload_id>/complete")
def complete_upload(upload_id: str) -> Response:
    principal = _principal()
    answer = uploads.complete_upload(get_settings(), principal, upload_id, _raw_body(), _seconds_left())
    logger.info("upload completed", extra={"upload_id": upload_id, "account_id": principal.account_id})
    return _json(200, answer)


@app.post("/v1/uploads/<upload_id>/cancel")
def cancel_upload(upload_id: str) -> Response:
    return _json(200, uploads.cancel_upload(get_settings(), _principal(), upload_id))


@app.exception_handler(ApiError)
def handle_api_error(error: ApiError) -> Response:
    if error.status >= 500:
        logger.error("api error", extra={"status": error.status, "code": error.code})
    if error.retry_after is not None:
        return _json(error.status, error.body(), {"Retry-After": str(error.retry_after)})
    return _json(error.status, error.body())


@app.not_found
def handle_not_found(_: NotFoundError) -> Response:
    event = app.current_event
    method = event.request_context.http.method
    allowed = app.methods_at(event.path)
    if allowed:
        refusal = MethodNotAllowed(f"{method} is not a method of {event.path}; it takes {', '.join(allowed)}")
        return _json(refusal.status, refusal.body(), {"Allow": ", ".join(allowed)})
    return _json(HTTPStatus.NOT_FOUND, NotFound(
        f"No route for {event.request_context.http.method} {event.path}; see /v1/batches",
        code="route_not_found").body())


@app.exception_handler([ClientError, BotoCoreError])
def handle_aws_error(error: Exception) -> Response:
    if not aws.is_passing_failure(error):
        return handle_unexpected(error)
    # botocore has already retried it; the caller may, a moment later. A create retried with the
    # same Idempotency-Key is stored once, whether or not this attempt stored it.
    logger.warning("aws error after retries", exc_info=True)
    return handle_api_error(ServiceUnavailable(
        "The service's storage is busy at the moment; retry after the Retry-After seconds "
        "(a create retried with the same Idempotency-Key is never stored twice)"))


@app.exception_handler(Exception)
def handle_unexpected(error: Exception) -> Response:
    # Never leak internals: log the traceback, answer a bare 500.
    logger.exception("unexpected error")
    return _json(500, {"error": {"message": "Internal error; try again later",
                                 "type": "server_error", "code": "internal_error", "param": None}})
