"""How long one upstream call may run, and whether a chain has time for another request.

A call may take the per-call timeout (`BATCH_UPSTREAM_TIMEOUT_SECONDS`, what the interactive
endpoint allows), but never more than its worker invocation has left once it keeps
`BATCH_SETTLE_SECONDS` to settle: `min(timeout, left - settle)`. The most any call may run is
what a fresh invocation gives its first request: the timeout, or the invocation's length less
the settle time at its end and as much again at its start (a record's gates and claim before its
call). A call given less than that was cut short by its invocation's end, not by the upstream:
when it runs out, the request runs again in a fresh invocation and the attempt does not count.
A call given the most and still without an answer timed out: it uses an attempt and is retried
with backoff, as a 429 or a 5xx is (the spec's eight attempts in all).

Pure arithmetic on `time.monotonic()` values: unit-tested without AWS (tests/service/worker/test_call_budget.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from freeinference_batch.core.settings import Settings


@dataclass(frozen=True)
class Invocation:
    """A worker invocation's time: when it times out (`time.monotonic()`) and its whole length."""

    deadline: float
    seconds: float


@dataclass(frozen=True)
class CallBudget:
    """How long this call may run (`seconds`), and the most any batch call may run (`longest`)."""

    seconds: float
    longest: float

    @property
    def cut(self) -> bool:
        """The invocation's end, not the timeout, bounds this call."""
        return self.seconds < self.longest


def longest_call(settings: Settings, invocation_seconds: float | None) -> float:
    """The most any batch call may run in invocations of `invocation_seconds` (None: no invocation
    bounds it, only the timeout)."""
    timeout = settings.batch_upstream_timeout_seconds
    if invocation_seconds is None:
        return timeout
    # An invocation too short for the settle time at both ends still gives its calls a third of
    # itself (never nothing, or every call would be cut and run again forever).
    fits = max(invocation_seconds - 2 * settings.batch_settle_seconds, invocation_seconds / 3)
    return min(timeout, fits)


def call_budget(settings: Settings, invocation: Invocation | None, now: float) -> CallBudget:
    """`min(timeout, left - settle)` for a call starting at `now`, beside the most a call may run."""
    if invocation is None:
        timeout = settings.batch_upstream_timeout_seconds
        return CallBudget(timeout, timeout)
    longest = longest_call(settings, invocation.seconds)
    left = invocation.deadline - now - settings.batch_settle_seconds
    return CallBudget(max(0.0, min(longest, left)), longest)


def may_hand_over(settings: Settings, invocation: Invocation | None, now: float) -> bool:
    """Whether a chain runs its next request in this invocation: while that call would get at
    least `BATCH_HANDOVER_MIN_CALL_SECONDS` (or the most a call may run, if that is less). A
    longer answer that the invocation's end cuts runs again in a fresh one; a chain that hands
    over as long as this keeps its invocation's GB-seconds shared by many requests."""
    if invocation is None:
        return False
    least = min(settings.batch_handover_min_call_seconds, longest_call(settings, invocation.seconds))
    return invocation.deadline - now - settings.batch_settle_seconds >= least
