"""Delivering webhook events: one SQS message per (event, endpoint), retried until delivered.

An attempt reads the endpoint (consistently: a deleted endpoint's pending deliveries stop at
their next attempt, a rotation applies at once), checks its URL again (urls.py: the
address it resolves to now, which is the one called), signs the body with a fresh timestamp
and the same `webhook-id` as every other attempt, and posts it with a timeout and no redirects.

Anything but a 2xx (a timeout, a refused connection, a refused address) is retried: the message
is made visible again after `retry_delay` (exponential backoff with jitter, capped), until the
event's retry window (24 h by default) has passed since it was queued; then it goes to the
dead-letter queue, whose alarm says so. The attempt number is the message's receive count, so
the backoff needs no write; a duplicate message (SQS delivers at least once) is another
attempt of the same event, with the same `webhook-id`.

An endpoint that does not answer at all (timeout, refused connection) is marked unreachable for
the next retry delay: other deliveries to it then wait without connecting, so one dead endpoint
holds at most about one invocation's thread for its timeout at a time, not every one of them.
The records of one invocation are delivered concurrently (functions/webhook_delivery/app.py), so a
slow endpoint does not hold up another account's event in the same batch either.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from freeinference_batch.core import clock
from freeinference_batch.core.observability import logger
from freeinference_batch.core.schemas import WebhookDeliveryMessage, WebhookEvent, WebhookEventData, WebhookEventType
from freeinference_batch.core.settings import SQS_MAX_VISIBILITY_SECONDS, Settings
from freeinference_batch.store import queues
from freeinference_batch.store.webhook_endpoints import EndpointRecord, WebhookEndpoints
from freeinference_batch.webhooks import signing, urls


def event_body(event_id: str, event_type: str, batch_id: str, created_at: int) -> bytes:
    event = WebhookEvent(id=event_id, type=WebhookEventType(event_type), created_at=created_at,
                         data=WebhookEventData(id=batch_id))
    return event.model_dump_json().encode()


def signing_secrets(settings: Settings, endpoint: EndpointRecord, now: float) -> list[str]:
    """The secrets an attempt is signed with now: the current one, and the previous one while a
    rotation's overlap lasts."""
    key = signing.signing_key(settings)
    secrets = [signing.derive_secret(key, endpoint.id, endpoint.secret_nonce)]
    if endpoint.previous_secret_nonce and (endpoint.previous_secret_until or 0) > now:
        secrets.append(signing.derive_secret(key, endpoint.id, endpoint.previous_secret_nonce))
    return secrets


def attempt(settings: Settings, endpoint: EndpointRecord, event_id: str, body: bytes,
            resolver: urls.Resolver = urls.system_resolver) -> urls.Answer:
    """One signed POST of `body` to the endpoint, its URL checked again first."""
    now = clock.now(settings.clock_offset_file)
    try:
        checked = urls.check_url(endpoint.url, allow_loopback_http=settings.webhook_allow_loopback_http,
                                         resolver=resolver)
    except urls.UrlRefused as refused:
        return urls.Answer(status=None, failure=f"the URL is refused: {refused}")
    headers = signing.signed_headers(signing_secrets(settings, endpoint, now), event_id, int(now), body)
    return urls.post(checked, body, headers, settings.webhook_timeout_seconds)


def retry_delay(settings: Settings, attempts: int, rng: Callable[[], float] = random.random) -> float:
    """The wait after the `attempts`-th failed attempt: base * 2^(attempts-1), at most the cap,
    then "equal jitter" (between half and all of it), so that the retries of many events that
    failed together spread out instead of arriving together again."""
    ceiling = min(settings.webhook_retry_max_seconds, settings.webhook_retry_base_seconds * 2 ** max(0, attempts - 1))
    return ceiling / 2 + rng() * ceiling / 2


@dataclass(frozen=True)
class Verdict:
    """What to do with a message after an attempt: done (delete it), retry after `delay`, or give
    it to the dead-letter queue."""

    done: bool = False
    delay: float | None = None
    dead_letter: bool = False
    why: str = ""


def deliver(settings: Settings, message: WebhookDeliveryMessage, receive_count: int,
            resolver: urls.Resolver = urls.system_resolver) -> Verdict:
    """One attempt of one event to one endpoint, and what follows from it."""
    endpoints = WebhookEndpoints(settings)
    endpoint = endpoints.get(message.account_id, message.endpoint_id)
    if endpoint is None or endpoint.deleted_at is not None:
        return Verdict(done=True, why="endpoint deleted")
    if message.event_type not in endpoint.event_types:
        return Verdict(done=True, why="endpoint no longer subscribed")
    now = clock.now(settings.clock_offset_file)
    deadline = message.queued_at + settings.webhook_retry_window_seconds
    if endpoint.unreachable_until and endpoint.unreachable_until > now:
        # Another delivery just found it down: wait with it, without connecting. Not an attempt.
        wait = endpoint.unreachable_until - now + random.random() * settings.webhook_retry_base_seconds
        return Verdict(delay=wait, why="endpoint unreachable") if now + wait <= deadline else \
            Verdict(dead_letter=True, why="retry window over")
    body = event_body(message.event_id, message.event_type, message.batch_id, message.created_at)
    answer = attempt(settings, endpoint, message.event_id, body, resolver)
    if answer.delivered:
        return Verdict(done=True, why=f"delivered ({answer.status})")
    why = f"answered {answer.status}" if answer.status is not None else answer.failure
    delay = retry_delay(settings, receive_count)
    if answer.unreachable:
        endpoints.mark_unreachable(message.account_id, message.endpoint_id, now + delay)
    if clock.now(settings.clock_offset_file) + delay > deadline:
        return Verdict(dead_letter=True, why=f"{why}; retry window over")
    return Verdict(delay=delay, why=why)


def handle_record(settings: Settings, record: dict,
                  resolver: urls.Resolver = urls.system_resolver) -> bool:
    """One SQS record of the delivery queue: True when it is done with (delivered, dropped or
    dead-lettered), False when it waits on the queue for its next attempt (its visibility is set)."""
    message = WebhookDeliveryMessage.model_validate_json(record["body"])
    receive_count = int((record.get("attributes") or {}).get("ApproximateReceiveCount", "1"))
    try:
        verdict = deliver(settings, message, receive_count, resolver)
    except Exception:
        # Our own failure (AWS, the secret): not the receiver's. Retried after the visibility timeout.
        logger.exception("webhook delivery failed", extra={"event_id": message.event_id,
                                                           "endpoint_id": message.endpoint_id})
        return False
    log = {"event_id": message.event_id, "endpoint_id": message.endpoint_id, "attempt": receive_count,
           "why": verdict.why}
    if verdict.done:
        logger.info("webhook delivery done", extra=log)
        return True
    if verdict.dead_letter:
        queues.send_message(settings.webhook_dead_letter_queue_url, record["body"])
        logger.warning("webhook delivery given up", extra=log)
        return True
    assert verdict.delay is not None
    queues.change_visibility(settings.webhook_delivery_queue_url, record["receiptHandle"],
                             max(1, min(SQS_MAX_VISIBILITY_SECONDS, round(verdict.delay))))
    logger.info("webhook delivery retried later", extra={**log, "delay": verdict.delay})
    return False
