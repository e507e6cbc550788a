"""Delivering webhook events: one SQS message per (event, endpoint), retried until delivered.

An attempt reads the endpoint (consistently: a deleted endpoint's pending deliveries stop at
their next attempt, a rotation applies at once), checks its URL again (urls.py: the
address it resolves to now, which is the one called), signs the body with a fresh timestamp
and the same `webhook-id` as every other attempt, and posts it (sender.py) within one total
deadline, `WEBHOOK_TIMEOUT_SECONDS` (10 s) or what the invocation has left if less, resolving the
name included: no attempt outlives its invocation, whatever the receiver trickles.

Anything but a 2xx (a timeout, a refused connection, a refused address) is retried: the message
is made visible again after `retry_delay` (exponential backoff with jitter, capped), until the
event's retry window (24 h by default) has passed since it was queued; then it goes to the
dead-letter queue, whose alarm says so. The attempt number is the message's receive count, so
the backoff needs no write; a duplicate message (SQS delivers at least once) is another
attempt of the same event, with the same `webhook-id`. An attempt cut short by the invocation's
end is a failed attempt like any other: it backs off, with a visibility of its own.

Fair between accounts:
- An endpoint that does not answer (timeout, refused connection) or answers slowly and not with a
  2xx (more than half the deadline: a 500 after 9.9 s) is marked unreachable for the next retry
  delay: other deliveries to it then wait without connecting.
- An account has at most `WEBHOOK_ACCOUNT_MAX_IN_FLIGHT` (3) attempts in flight over every
  environment (leased slots on its `WEBHOOKS` item); a delivery that finds them taken waits about
  one attempt, without connecting. So one account's endpoints, however slow, hold at most 3 of the
  10 delivery environments (an environment is held until its slowest record is done).
- The records of one invocation are delivered concurrently (functions/webhook_delivery/app.py),
  so a slow endpoint does not hold up another account's event in the same batch either.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from freeinference_batch.core import clock
from freeinference_batch.core.observability import logger
from freeinference_batch.core.schemas import WebhookDeliveryMessage, WebhookEvent, WebhookEventData, WebhookEventType
from freeinference_batch.core.settings import SQS_MAX_VISIBILITY_SECONDS, Settings
from freeinference_batch.store import queues
from freeinference_batch.store.webhook_endpoints import EndpointRecord, WebhookEndpoints
from freeinference_batch.webhooks import sender, signing, urls

# Time kept, after an attempt, to free its slot (one DynamoDB write).
SLOT_RELEASE_SECONDS = 1.0


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


def check(settings: Settings, url: str, resolver: urls.Resolver | None = None,
          seconds: float | None = None) -> urls.CheckedUrl:
    """`url` checked by the rules of `settings`, its name resolved within the resolver's deadline
    (and within `seconds`, when the attempt has less left)."""
    lifetime = settings.webhook_resolve_timeout_seconds
    lifetime = lifetime if seconds is None else max(0.0, min(lifetime, seconds))
    return urls.check_url(url, allow_loopback_http=settings.webhook_allow_loopback_http,
                          resolver=resolver or urls.dns_resolver(lifetime),
                          loopback_ports=urls.parse_ports(settings.webhook_loopback_ports))


def attempt(settings: Settings, endpoint: EndpointRecord, event_id: str, body: bytes,
            resolver: urls.Resolver | None = None, seconds: float | None = None) -> sender.Answer:
    """One signed POST of `body` to the endpoint, its URL checked again first: `seconds` in all
    (WEBHOOK_TIMEOUT_SECONDS unless less is left), resolving the name included."""
    seconds = settings.webhook_timeout_seconds if seconds is None else min(seconds, settings.webhook_timeout_seconds)
    started = time.monotonic()
    now = clock.now(settings.clock_offset_file)
    try:
        checked = check(settings, endpoint.url, resolver, seconds)
    except urls.UrlRefused as refused:
        return sender.Answer(status=None, failure=f"the URL is refused: {refused}")
    headers = signing.signed_headers(signing_secrets(settings, endpoint, now), event_id, int(now), body)
    return sender.post(checked, body, headers, seconds - (time.monotonic() - started))


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


def _busy_wait(settings: Settings) -> float:
    """How long a delivery waits when its account's slots are all taken: about one attempt."""
    return settings.webhook_timeout_seconds * (0.5 + random.random())


def deliver(settings: Settings, message: WebhookDeliveryMessage, receive_count: int,
            resolver: urls.Resolver | None = None, budget: float | None = None) -> Verdict:
    """One attempt of one event to one endpoint, within `budget` seconds (what the invocation has
    left), and what follows from it."""
    started = time.monotonic()
    endpoints = WebhookEndpoints(settings)
    endpoint = endpoints.get(message.account_id, message.endpoint_id)
    if endpoint is None or endpoint.deleted_at is not None:
        return Verdict(done=True, why="endpoint deleted")
    if message.event_type not in endpoint.event_types:
        return Verdict(done=True, why="endpoint no longer subscribed")
    now = clock.now(settings.clock_offset_file)
    deadline = message.queued_at + settings.webhook_retry_window_seconds

    def wait(delay: float, why: str) -> Verdict:
        return Verdict(delay=delay, why=why) if clock.now(settings.clock_offset_file) + delay <= deadline else \
            Verdict(dead_letter=True, why=f"{why}; retry window over")

    if endpoint.unreachable_until and endpoint.unreachable_until > now:
        # Another delivery just found it down: wait with it, without connecting. Not an attempt.
        return wait(endpoint.unreachable_until - now + random.random() * settings.webhook_retry_base_seconds,
                    "endpoint unreachable")
    seconds = settings.webhook_timeout_seconds
    if budget is not None:
        seconds = min(seconds, budget - (time.monotonic() - started) - SLOT_RELEASE_SECONDS)
    # The slot's lease outlasts the attempt (and its release) whatever happens to this environment.
    lease_until = now + max(seconds, 0) + SLOT_RELEASE_SECONDS
    slot = endpoints.claim_slot(message.account_id, settings.webhook_account_max_in_flight, now, lease_until)
    if slot is None:
        # The account has as many attempts in flight as it may: its slow endpoints take a bounded
        # share of the deliveries, not all of them. Not an attempt.
        return wait(_busy_wait(settings), "account busy")
    try:
        body = event_body(message.event_id, message.event_type, message.batch_id, message.created_at)
        answer = attempt(settings, endpoint, message.event_id, body, resolver, seconds) if seconds > 0 else \
            sender.Answer(status=None, failure="no time left in this invocation")
    finally:
        endpoints.release_slot(message.account_id, slot, lease_until)
    if answer.delivered:
        return Verdict(done=True, why=f"delivered ({answer.status})")
    why = f"answered {answer.status}" if answer.status is not None else answer.failure
    delay = retry_delay(settings, receive_count)
    if answer.unreachable:
        endpoints.mark_unreachable(message.account_id, message.endpoint_id, now + delay)
    return wait(delay, why)


def handle_record(settings: Settings, record: dict, resolver: urls.Resolver | None = None,
                  budget: float | None = None) -> bool:
    """One SQS record of the delivery queue: True when it is done with (delivered, dropped or
    dead-lettered), False when it waits on the queue for its next attempt (its visibility is set)."""
    message = WebhookDeliveryMessage.model_validate_json(record["body"])
    receive_count = int((record.get("attributes") or {}).get("ApproximateReceiveCount", "1"))
    try:
        verdict = deliver(settings, message, receive_count, resolver, budget)
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
