"""Webhook endpoints: OpenAI's webhook-endpoint API, so that the `openai` package's
`client.webhooks` manages ours unchanged (create, retrieve, update, list, delete,
rotate_secret, test, event_types.list).

Accounts that may create batches manage endpoints (others get create's 403), at most
`WEBHOOK_MAX_ENDPOINTS` each; another account's endpoint is a 404, as with batches. The URL
rules are urls.py's, the secret signing.py's, the deliveries delivery.py's.
"""

from __future__ import annotations

import math
import re
import secrets

from freeinference_batch import accounts
from freeinference_batch.accounts import Principal
from freeinference_batch.core import clock
from freeinference_batch.core.errors import BadRequest, NotFound, TooManyRequests, busy
from freeinference_batch.core.ids import time_ordered_id
from freeinference_batch.core.schemas import (
    DeletedWebhookEndpoint,
    WebhookCreateBody,
    WebhookEndpoint,
    WebhookEndpointList,
    WebhookEndpointTestResult,
    WebhookEndpointWithSecret,
    WebhookEventType,
    WebhookEventTypeList,
    WebhookRotateSecretBody,
    WebhookTestBody,
    WebhookUpdateBody,
    parse_body,
)
from freeinference_batch.core.settings import Settings
from freeinference_batch.store.dynamo import TransactionConflict
from freeinference_batch.store.webhook_endpoints import EndpointRecord, TooManyEndpoints, WebhookEndpoints
from freeinference_batch.webhooks import delivery, signing, urls

ENDPOINT_ID = re.compile(r"we_[0-9a-f]{32}")
EVENT_TYPES = [member.value for member in WebhookEventType]
# rotate_secret's keep_old_secret_active_for_24_hours.
OLD_SECRET_OVERLAP_SECONDS = 24 * 3600
# The batch id a test delivery names: no batch has it.
TEST_BATCH_ID = "batch_test"


def new_endpoint_id(now: float) -> str:
    """Time-ordered (core/ids.py): listed in creation order by id alone."""
    return time_ordered_id("we_", now)




def _event_types(given: list[str]) -> list[str]:
    unknown = [name for name in given if name not in EVENT_TYPES]
    if unknown:
        raise BadRequest(f"Unsupported event types: {', '.join(unknown)}; this service sends "
                         f"{', '.join(EVENT_TYPES)}", param="event_types")
    return list(dict.fromkeys(given))


def _checked_url(settings: Settings, url: str, resolver: urls.Resolver | None) -> str:
    try:
        delivery.check(settings, url, resolver)
    except urls.UrlRefused as refused:
        raise BadRequest(f"The webhook URL is refused: {refused}", param="url") from None
    return url


def _view(record: EndpointRecord) -> dict:
    return WebhookEndpoint(id=record.id, url=record.url, name=record.name,
                           event_types=[WebhookEventType(t) for t in record.event_types], created_at=record.created_at,
                           updated_at=record.updated_at, signing_secret_hint=record.secret_hint).model_dump(mode="json")


def _with_secret(record: EndpointRecord, secret: str) -> dict:
    return WebhookEndpointWithSecret(**_view(record), signing_secret=secret).model_dump(mode="json")


def _owned(settings: Settings, principal: Principal, endpoint_id: str) -> EndpointRecord:
    accounts.batch_catalog(settings, principal)
    record = None
    if ENDPOINT_ID.fullmatch(endpoint_id):
        record = WebhookEndpoints(settings).get(principal.account_id, endpoint_id)
    if record is None or record.deleted_at is not None:
        raise NotFound(f"No webhook endpoint found with id '{endpoint_id}'")
    return record


def create_endpoint(settings: Settings, principal: Principal, raw: bytes,
                    resolver: urls.Resolver | None = None) -> dict:
    accounts.batch_catalog(settings, principal)
    body = parse_body(raw, WebhookCreateBody)
    event_types = _event_types(body.event_types)
    url = _checked_url(settings, body.url, resolver)
    now = clock.now(settings.clock_offset_file)
    endpoint_id, nonce = new_endpoint_id(now), signing.new_nonce()
    secret = signing.derive_secret(signing.signing_key(settings), endpoint_id, nonce)
    record = EndpointRecord(id=endpoint_id, account_id=principal.account_id, url=url, name=body.name,
                            event_types=event_types, created_at=int(now), updated_at=int(now), secret_nonce=nonce,
                            secret_hint=signing.secret_hint(secret), write_token=secrets.token_hex(8))
    try:
        WebhookEndpoints(settings).create(record, settings.webhook_max_endpoints)
    except TooManyEndpoints:
        raise BadRequest(f"An account may have at most {settings.webhook_max_endpoints} webhook endpoints; "
                         "delete one before adding another", code="too_many_webhook_endpoints") from None
    except TransactionConflict:
        raise busy("creating the webhook endpoint") from None
    return _with_secret(record, secret)


def list_endpoints(settings: Settings, principal: Principal, limit: int, after: str | None) -> dict:
    accounts.batch_catalog(settings, principal)
    if after is not None and not ENDPOINT_ID.fullmatch(after):
        raise BadRequest(f"after must be a webhook endpoint id such as a page's last_id (got '{after}')",
                         param="after")
    records = WebhookEndpoints(settings).list(principal.account_id)
    if after is not None:
        records = [r for r in records if r.id > after]
    page = records[:limit]
    return WebhookEndpointList(data=[WebhookEndpoint.model_validate(_view(r)) for r in page],
                               first_id=page[0].id if page else None, last_id=page[-1].id if page else None,
                               has_more=len(records) > limit).model_dump(mode="json")


def get_endpoint(settings: Settings, principal: Principal, endpoint_id: str) -> dict:
    return _view(_owned(settings, principal, endpoint_id))


def update_endpoint(settings: Settings, principal: Principal, endpoint_id: str, raw: bytes,
                    resolver: urls.Resolver | None = None) -> dict:
    record = _owned(settings, principal, endpoint_id)
    body = parse_body(raw, WebhookUpdateBody)
    fields: dict[str, object] = {}
    if body.url is not None:
        fields["url"] = _checked_url(settings, body.url, resolver)
    if body.name is not None:
        fields["name"] = body.name
    if body.event_types is not None:
        fields["event_types"] = _event_types(body.event_types)
    if not fields:
        return _view(record)
    updated = WebhookEndpoints(settings).update(principal.account_id, endpoint_id, fields,
                                                int(clock.now(settings.clock_offset_file)))
    if updated is None:
        raise NotFound(f"No webhook endpoint found with id '{endpoint_id}'")
    return _view(updated)


def delete_endpoint(settings: Settings, principal: Principal, endpoint_id: str) -> dict:
    _owned(settings, principal, endpoint_id)
    try:
        deleted = WebhookEndpoints(settings).delete(principal.account_id, endpoint_id, secrets.token_hex(8),
                                                    int(clock.now(settings.clock_offset_file)))
    except TransactionConflict:
        raise busy("deleting the webhook endpoint") from None
    if not deleted:
        raise NotFound(f"No webhook endpoint found with id '{endpoint_id}'")
    return DeletedWebhookEndpoint(id=endpoint_id).model_dump(mode="json")


def rotate_secret(settings: Settings, principal: Principal, endpoint_id: str, raw: bytes) -> dict:
    record = _owned(settings, principal, endpoint_id)
    body = parse_body(raw, WebhookRotateSecretBody)
    now = clock.now(settings.clock_offset_file)
    nonce = signing.new_nonce()
    secret = signing.derive_secret(signing.signing_key(settings), endpoint_id, nonce)
    until = now + OLD_SECRET_OVERLAP_SECONDS if body.keep_old_secret_active_for_24_hours else None
    rotated = WebhookEndpoints(settings).rotate(principal.account_id, endpoint_id, record.secret_nonce, nonce,
                                                signing.secret_hint(secret), until, int(now))
    if rotated is None:
        # Gone meanwhile, or another rotation won: only the first is not found.
        _owned(settings, principal, endpoint_id)
        raise busy("rotating the endpoint's secret")
    return _with_secret(rotated, secret)


def test_endpoint(settings: Settings, principal: Principal, endpoint_id: str, raw: bytes,
                  resolver: urls.Resolver | None = None) -> dict:
    """Send one signed test event now and answer the receiver's status code, within the attempt's
    deadline (WEBHOOK_TIMEOUT_SECONDS in all). A delivery that got no HTTP answer (a refused
    connection, no answer in time, a URL refused now) is a 400 saying which: OpenAI's test result
    has no place for "no status". At most one per endpoint per WEBHOOK_TEST_INTERVAL_SECONDS (429)."""
    record = _owned(settings, principal, endpoint_id)
    body = parse_body(raw, WebhookTestBody)
    event_type = _event_types([body.event_type])[0]
    now = int(clock.now(settings.clock_offset_file))
    # One test delivery per endpoint per interval: the route is otherwise a POST source at the
    # API's rate that tells its caller the status code.
    interval = settings.webhook_test_interval_seconds
    wait = WebhookEndpoints(settings).claim_test(principal.account_id, endpoint_id,
                                                 clock.now(settings.clock_offset_file), interval, secrets.token_hex(8))
    if wait > 0:
        retry_after = max(1, math.ceil(wait))
        raise TooManyRequests(f"This endpoint was tested less than {interval:g} s ago; try again in {retry_after} s",
                              code="webhook_test_rate_limited", retry_after=retry_after)
    event_id = "evt_test_" + secrets.token_hex(12)
    answer = delivery.attempt(settings, record, event_id,
                                      delivery.event_body(event_id, event_type, TEST_BATCH_ID, now), resolver)
    if answer.status is None:
        raise BadRequest(f"The test delivery got no answer: {answer.failure}", code="webhook_test_failed")
    return WebhookEndpointTestResult(webhook_endpoint_id=endpoint_id, event_type=WebhookEventType(event_type),
                                     status_code=answer.status).model_dump(mode="json")


def event_types() -> dict:
    return WebhookEventTypeList(data=[WebhookEventType(t) for t in EVENT_TYPES]).model_dump(mode="json")
