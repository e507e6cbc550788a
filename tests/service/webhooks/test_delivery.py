"""Webhook delivery's retry schedule (webhooks/delivery.py), without AWS: delays grow
exponentially with jitter up to the cap.
"""

from __future__ import annotations

from freeinference_batch.core.settings import Settings
from freeinference_batch.webhooks import delivery


def test_retry_delays_grow_exponentially_with_jitter_up_to_the_cap() -> None:
    settings = Settings(WEBHOOK_RETRY_BASE_SECONDS=30, WEBHOOK_RETRY_MAX_SECONDS=3600)
    assert [delivery.retry_delay(settings, n, rng=lambda: 1.0) for n in (1, 2, 3, 8, 20)] == [
        30, 60, 120, 3600, 3600]
    assert delivery.retry_delay(settings, 2, rng=lambda: 0.0) == 30  # half of 60 at least
