"""An EventBridge schedule, as it invokes its function, on a thread.

`ScheduleTimer` invokes a schedule handler every `interval` seconds with an EventBridge
"Scheduled Event", asynchronously as EventBridge does: a tick whose previous run still runs
runs beside it (up to the function's concurrency); a failing run is logged and the next tick
comes anyway.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from freeinference_batch_local.cloudformation.resources import truthy
from freeinference_batch_local.handlers import (
    LOCAL_ACCOUNT_ID,
    LOCAL_REGION,
    LOCAL_STACK_NAME,
    LOCAL_UNRESERVED_CONCURRENCY,
    FunctionSpec,
    LambdaContext,
)
from freeinference_batch_local.triggers.event_source import InvocationsInFlight

log = logging.getLogger(__name__)

# How long a schedule's tick may wait for a run to end before it is dropped (ScheduleTimer).
MAX_EVENT_AGE_SECONDS = 60.0


def schedule_timers(functions: Iterable[FunctionSpec], invoker: Callable[[FunctionSpec], Any], *,
                    interval: float, clock: Callable[[], float]) -> Iterator[ScheduleTimer]:
    """A ScheduleTimer (not started) per enabled `Schedule` / `ScheduleV2` event of `functions`,
    ticking every `interval` seconds (locally one interval for every schedule), its events'
    time read from `clock`; `invoker(function)` is what it invokes."""
    for spec in functions:
        schedules = {**spec.events("Schedule"), **spec.events("ScheduleV2")}
        for event_name, properties in schedules.items():
            if not truthy(properties.get("Enabled", True)) or properties.get("State") == "DISABLED":
                continue
            yield ScheduleTimer(
                name=spec.logical_id,
                handler=invoker(spec),
                interval=interval,
                max_concurrency=spec.concurrency,
                context_factory=spec.context,
                rule_name=f"{LOCAL_STACK_NAME}-{spec.logical_id}{event_name}",
                clock=clock,
            )


def scheduled_event(
    rule_name: str, now: float | None = None, region: str = LOCAL_REGION, account_id: str = LOCAL_ACCOUNT_ID
) -> dict[str, Any]:
    """An EventBridge "Scheduled Event", as a schedule rule delivers it."""
    now = time.time() if now is None else now
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": account_id,
        "time": dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": region,
        "resources": [f"arn:aws:events:{region}:{account_id}:rule/{rule_name}"],
        "detail": {},
    }


class ScheduleTimer(InvocationsInFlight):
    """Invokes `handler` every `interval` seconds (fixed rate), each tick asynchronously.

    As EventBridge does: a schedule's target is invoked asynchronously, so a tick whose previous
    run still runs is not skipped but runs beside it (on Lambda, in another execution
    environment), up to `max_concurrency` runs at once (the function's reserved concurrency); a
    tick beyond it waits for a run to end, as Lambda's asynchronous queue holds the event, and is
    dropped once it has waited `max_event_age` seconds (the queue's `MaximumEventAgeInSeconds`:
    locally Lambda's smallest setting, 60 s, not its default of 6 h, so that a loaded machine's
    backlog of ticks does not run on for hours after the load).
    """

    def __init__(
        self,
        *,
        name: str,
        handler: Callable[[dict, Any], Any],
        interval: float,
        context_factory: Callable[[], Any] | None = None,
        rule_name: str | None = None,
        clock: Callable[[], float] = time.time,
        max_concurrency: int = LOCAL_UNRESERVED_CONCURRENCY,
        max_event_age: float = MAX_EVENT_AGE_SECONDS,
    ) -> None:
        self.name = name
        self.handler = handler
        self.interval = float(interval)
        self.context_factory = context_factory or (lambda: LambdaContext(name, 128, 60))
        self.rule_name = rule_name or f"{name}-schedule"
        self.clock = clock
        self.max_concurrency = max(1, int(max_concurrency))
        self.max_event_age = float(max_event_age)
        self.runs = 0
        self.errors = 0
        self.dropped = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        super().__init__()
        # Ticks waiting for a run to end: (when it was queued, monotonic; its event's time).
        self._queued: list[tuple[float, float]] = []

    def start(self) -> ScheduleTimer:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=f"schedule-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop ticking and wait up to `timeout` for running runs; True if they all ended."""
        self._stop.set()
        self._running.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
        with self._lock:
            self._queued.clear()
        return self.wait_idle(timeout)


    def run_once(self) -> Any:
        """One run now, in the calling thread (tests); it may overlap a tick's run."""
        with self._lock:
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)
        try:
            return self._run(self.clock())
        finally:
            self._finished()

    def tick(self) -> None:
        """One tick, as EventBridge delivers it: run beside any run in progress, or wait for one
        to end if `max_concurrency` are running."""
        now = self.clock()
        with self._lock:
            if self._in_flight >= self.max_concurrency:
                self._queued.append((time.monotonic(), now))
                return
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)
        self._spawn(now)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "runs": self.runs,
                "errors": self.errors,
                "interval": self.interval,
                "paused": not self._running.is_set(),
                "in_flight": self._in_flight,
                "max_in_flight": self._max_in_flight,
                "queued": len(self._queued),
                "dropped": self.dropped,
                "max_concurrency": self.max_concurrency,
            }

    def _spawn(self, tick_time: float) -> None:
        # A daemon thread per run: a run that never ends must not keep the process from exiting.
        name = f"schedule-run-{self.name}"
        threading.Thread(target=self._run_tick, args=(tick_time,), name=name, daemon=True).start()

    def _run_tick(self, tick_time: float) -> None:
        try:
            self._run(tick_time)
        finally:
            self._finished()

    def _run(self, tick_time: float) -> Any:
        with self._lock:
            self.runs += 1
        try:
            return self.handler(scheduled_event(self.rule_name, tick_time), self.context_factory())
        except Exception:
            with self._lock:
                self.errors += 1
            log.exception("schedule %s failed; the next tick runs anyway", self.name)
            return None

    def _finished(self) -> None:
        with self._idle:
            while self._queued and not self._stop.is_set():
                queued_at, tick_time = self._queued.pop(0)
                if time.monotonic() - queued_at > self.max_event_age:
                    self.dropped += 1
                    continue
                self._spawn(tick_time)  # the slot passes to the oldest waiting tick
                return
            self._in_flight -= 1
            self._idle.notify_all()

    def _loop(self) -> None:
        next_tick = time.monotonic() + self.interval
        while not self._stop.wait(max(0.0, next_tick - time.monotonic())):
            self._running.wait()
            if self._stop.is_set():
                break
            self.tick()
            next_tick += self.interval
            now = time.monotonic()
            if next_tick < now:  # a pause outlasted ticks: skip them, as a disabled rule would
                next_tick = now + self.interval - (now - next_tick) % self.interval
