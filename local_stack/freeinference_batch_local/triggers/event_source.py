"""What every event source shares: pausing, counting the invocations it has in flight, and how
often it looks again when there was nothing to do or its call to AWS failed."""

from __future__ import annotations

import threading
import time

# An idle queue or stream is polled this often; a message sent from this process wakes its poller
# at once (see QueuePoller.wake), which is what SQS long polling gives a Lambda event source mapping.
IDLE_SLEEP_SECONDS = 0.25
ERROR_SLEEP_SECONDS = 0.5


class Pausable:
    """An event source that can stop taking events for a while (running invocations finish;
    messages and records wait where they are): `_running` is set while it polls or ticks."""

    def __init__(self) -> None:
        self._running = threading.Event()
        self._running.set()

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    @property
    def paused(self) -> bool:
        return not self._running.is_set()


class InvocationsInFlight(Pausable):
    """What an event source counts of the invocations it has started: how many run now (under
    `_lock`, whose condition `_idle` is told when one ends) and the most that ran at once."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._in_flight = 0
        self._max_in_flight = 0

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no invocation is running."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._idle:
            while self._in_flight:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True
