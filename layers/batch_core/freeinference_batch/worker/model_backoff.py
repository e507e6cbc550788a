"""Backing batch traffic off a model that says it is overloaded: additive increase,
multiplicative decrease (AIMD) of the model's batch cap.

An upstream `429` or `503` halves the cap (at most once per `batch_backoff_cooldown_seconds`,
so a burst of them from the requests in flight halves it once); while calls succeed, the cap
grows back by one slot at most once per `batch_recovery_seconds`, up to the catalog's
`batch_concurrency`. Batch requests thus give way within one request time of the first sign of
overload, before interactive users feel it, and come back slowly. The cap is one item per model
(`accounts_table.backoff_item_key`), read with the other gates at no extra call, and written
only when it changes: not per request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

OVERLOAD_CODES = frozenset({"rate_limited", "service_unavailable"})


@dataclass(frozen=True)
class Backoff:
    """A model's lowered batch cap, as stored: `cap` slots since `changed_at`."""

    cap: int
    changed_at: float


def backoff_of(item: dict[str, Any] | None) -> Backoff | None:
    """The backoff the model's backoff item shows, if any (store/accounts_table.py)."""
    if not item or "cap" not in item:
        return None
    return Backoff(cap=int(item["cap"]), changed_at=float(item["changed_at"]))


def capped(capacity: int, backoff: Backoff | None) -> int:
    """The model's batch capacity under its backoff cap, if it has one."""
    return capacity if backoff is None else min(capacity, backoff.cap)


def lowered(capacity: int, backoff: Backoff | None, now: float, cooldown: float) -> int | None:
    """The cap after an overload answer, or None if the cap was lowered within the cooldown
    (that overload is already answered) or cannot go lower."""
    if backoff is not None and now - backoff.changed_at < cooldown:
        return None
    current = capped(capacity, backoff)
    new = max(1, current // 2)
    return new if new < current else None


def raised(configured: int, backoff: Backoff | None, now: float, interval: float) -> int | None:
    """The cap after a success, or None if it is not due to grow (no backoff, or grown within the
    interval). A result of `configured` or more means the backoff is over."""
    if backoff is None or now - backoff.changed_at < interval:
        return None
    return min(configured, backoff.cap + 1)
