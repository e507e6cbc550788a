"""Progress people can plan by (issue 33): a running batch's rate and estimated finish, from what
one read of the batch gives, and the `waiting` message when the server sends one.

    estimate = progress(batch, now=time.time())
    if estimate is None: ...                     # final, cancelling, or nothing finished yet
    estimate.per_minute, estimate.finish_at      # requests a minute; Unix seconds

One read has no history, so the rate is the batch's over its whole running time (since
`in_progress_at`), not a recent one; the console, which refreshes, also keeps readings (its
`progress.js`). `now` is this machine's clock against the server's `in_progress_at`: a clock that
is off by a minute shifts the rate of a batch that has run for a few minutes, not of a long one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from freeinference_batch_client.models import Batch

# Neither runs its requests any further: a cancelling batch's unstarted requests never start, a
# finalizing one (created from a file) has them all finished.
NOT_RUNNING = frozenset({"completed", "failed", "expired", "cancelled", "cancelling", "finalizing"})


@dataclass(frozen=True)
class Estimate:
    per_minute: float  # requests finished (completed or failed) a minute, over the running time
    running_seconds: float  # since in_progress_at
    remaining: int  # requests not finished yet
    finish_at: float  # Unix seconds, if the rate holds

    def after_window(self, expires_at: int | None) -> bool:
        """Whether, at this rate, the completion window closes first (the rest would expire)."""
        return expires_at is not None and self.finish_at > expires_at


def finished(batch: Batch) -> int:
    counts = batch.request_counts
    return counts.completed + counts.failed


def progress(batch: Batch, now: float) -> Estimate | None:
    """The estimate of a batch still running, or None while it cannot be told: the batch is final or
    cancelling (nothing to plan), or has not started, or no request has finished yet."""
    if batch.status in NOT_RUNNING or batch.in_progress_at is None:
        return None
    done, running_seconds = finished(batch), now - batch.in_progress_at
    if done <= 0 or running_seconds <= 0:
        return None
    per_second = done / running_seconds
    remaining = max(batch.request_counts.total - done, 0)
    return Estimate(per_second * 60, running_seconds, remaining, now + remaining / per_second)


def waiting_message(batch: Batch) -> str | None:
    """The message of the batch's `waiting` field, when the server sends one (a server without it
    sends no field, and a batch that is not waiting has `null`)."""
    # A dict while the client's model has no field of its own for it (an extra field), an object after.
    waiting: Any = getattr(batch, "waiting", None)
    message = waiting.get("message") if isinstance(waiting, dict) else getattr(waiting, "message", None)
    return message if isinstance(message, str) and message else None


def duration(seconds: float) -> str:
    """A duration as a person reads it: `45 s`, `12 min`, `3 h 05 min`, `2 d 4 h`."""
    seconds = max(round(seconds), 0)
    if seconds < 90:
        return f"{seconds} s"
    minutes = round(seconds / 60)
    if minutes < 90:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def rate_text(per_minute: float) -> str:
    """Requests a minute: a decimal below 10, where it matters, whole numbers above."""
    return f"{per_minute:.1f}" if per_minute < 10 else f"{per_minute:.0f}"

