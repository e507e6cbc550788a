"""Webhook signing (webhooks/signing.py), without AWS: each endpoint's secret is derived from the
service's key, and every delivery is verified by the `openai` package itself, with either secret
during a rotation and with no other.
"""

from __future__ import annotations

import time

import openai
import pytest
from freeinference_batch.webhooks import delivery, signing


def test_every_delivery_is_verified_by_the_openai_package_with_either_secret_during_a_rotation() -> None:
    key = b"k" * 64
    old = signing.derive_secret(key, "we_1", "n1")
    new = signing.derive_secret(key, "we_1", "n2")
    assert old != new and old.startswith("whsec_") and signing.derive_secret(key, "we_1", "n1") == old
    body = delivery.event_body("evt_1", "batch.completed", "batch_x", 1_700_000_000)
    headers = signing.signed_headers([new, old], "evt_1", int(time.time()), body)
    for secret in (old, new):
        event = openai.OpenAI(api_key="x", webhook_secret=secret).webhooks.unwrap(body, headers)
        assert (event.type, event.id, event.data.id, event.object) == ("batch.completed", "evt_1", "batch_x", "event")
    other = signing.derive_secret(b"another key", "we_1", "n2")
    with pytest.raises(openai.InvalidWebhookSignatureError):
        openai.OpenAI(api_key="x", webhook_secret=other).webhooks.unwrap(body, headers)
