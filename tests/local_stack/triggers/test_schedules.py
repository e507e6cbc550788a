"""The local EventBridge schedules: ticks at a fixed rate with EventBridge's Scheduled Event, each
run asynchronous, up to the function's concurrency, the rest waiting (and dropped when too old)."""

from __future__ import annotations

import threading
import time

from freeinference_batch_local.triggers.schedules import ScheduleTimer

from tests.local_stack.waiting import wait_for


def test_schedule_timer_fires_repeatedly_with_a_scheduled_event_and_survives_errors():
    # Given a schedule handler that fails on its first run
    events = []

    def handler(event, context):
        events.append(event)
        if len(events) == 1:
            raise RuntimeError("first run fails")

    # When the timer runs with a short interval
    timer = ScheduleTimer(name="SweepFunction", handler=handler, interval=0.05, rule_name="rule-x").start()
    try:
        wait_for(lambda: len(events) >= 3, what="three ticks")
    finally:
        timer.stop()
    # Then it kept ticking, with EventBridge's Scheduled Event payload
    event = events[0]
    assert event["detail-type"] == "Scheduled Event" and event["source"] == "aws.events"
    assert event["resources"] == ["arn:aws:events:us-east-1:123456789012:rule/rule-x"]
    assert event["detail"] == {} and event["version"] == "0" and event["time"].endswith("Z")
    assert timer.errors == 1 and timer.runs >= 3


def test_a_schedule_tick_beyond_the_concurrency_waits_and_then_runs():
    # Given a schedule handler that blocks until released, and a timer of concurrency 2
    release = threading.Event()
    started: list[float] = []
    lock = threading.Lock()

    def handler(event, context):
        with lock:
            started.append(time.monotonic())
        release.wait(10)

    timer = ScheduleTimer(name="SweepFunction", handler=handler, interval=0.02, max_concurrency=2).start()
    try:
        # When ticks keep coming while two runs are blocked
        wait_for(lambda: timer.stats()["queued"] >= 3, what="ticks queued beyond the concurrency")
        # Then two run side by side, no more, and the others wait (Lambda's asynchronous queue)
        assert timer.stats()["in_flight"] == 2 and len(started) == 2
        timer.pause()
        queued = timer.stats()["queued"]
        release.set()
        # And when the runs end, the waiting ticks run
        wait_for(lambda: timer.stats()["runs"] >= 2 + queued, what="the queued ticks to run")
    finally:
        release.set()
        timer.stop(timeout=5)


def test_a_tick_that_waited_longer_than_the_event_age_is_dropped():
    # Given a schedule whose one run blocks, and ticks that may not wait at all for it
    release = threading.Event()

    def handler(event, context):
        release.wait(10)

    timer = ScheduleTimer(name="SweepFunction", handler=handler, interval=0.02, max_concurrency=1,
                          max_event_age=0.0).start()
    try:
        wait_for(lambda: timer.stats()["queued"] >= 3, what="ticks queued")
        timer.pause()
        release.set()
        # Then when the run ends, the stale ticks are dropped instead of run, as Lambda's
        # asynchronous queue drops events past MaximumEventAgeInSeconds
        wait_for(lambda: timer.stats()["in_flight"] == 0, what="the run to end")
        stats = timer.stats()
        assert stats["dropped"] >= 3 and stats["queued"] == 0 and stats["runs"] == 1
    finally:
        release.set()
        timer.stop(timeout=5)
