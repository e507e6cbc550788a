"""What Lambda's event source mappings and EventBridge schedules do, on threads.

`QueuePoller` is one SQS event mapping: it receives up to `BatchSize` messages, builds the SQS
event exactly as Lambda does, invokes the worker with at most `ScalingConfig.MaximumConcurrency`
invocations at once (it stops receiving while all are busy), and deletes every record the
invocation did not report in `batchItemFailures`; an invocation that raises deletes nothing, so
its messages come back after the visibility timeout, as on AWS.

As Lambda does, it gathers a batch for at most the mapping's `MaximumBatchingWindowInSeconds`
(0 or absent: it invokes at once with what one receive got; with a window, `BatchSize` may go
up to 10,000 and it receives again until the batch is full or the window is over), and it never
builds an event over Lambda's 6 MB invoke payload: the messages that do not fit are made visible
again at once (Lambda keeps them for its next batch; here they are received again, so their
receive count goes up by one).

Polls never wait (`WaitTimeSeconds=0`): every moto request holds the moto server's one lock, so
a long poll would stall every other AWS call of the stack. An empty receive sleeps a few tens of
milliseconds instead.

`ScheduleTimer` invokes a schedule handler every `interval` seconds with an EventBridge
"Scheduled Event", asynchronously as EventBridge does: a tick whose previous run still runs
runs beside it (up to the function's concurrency); a failing run is logged and the next tick
comes anyway.

Either takes as `handler` a function's `EnvironmentPool` (environments.py: each invocation in an
execution environment of its own, as Lambda runs it) or, in-process, the handler itself.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from freeinference_batch_local.handlers import (
    LAMBDA_INVOKE_PAYLOAD_BYTES,
    LOCAL_ACCOUNT_ID,
    LOCAL_REGION,
    LOCAL_UNRESERVED_CONCURRENCY,
    LambdaContext,
    invoke_payload_bytes,
)

log = logging.getLogger(__name__)

# An idle queue is polled this often; a message sent from this process wakes its poller at once
# (see QueuePoller.wake), which is what SQS long polling gives a Lambda event source mapping.
IDLE_SLEEP_SECONDS = 0.25
ERROR_SLEEP_SECONDS = 0.5
# How long a schedule's tick may wait for a run to end before it is dropped (ScheduleTimer).
MAX_EVENT_AGE_SECONDS = 60.0
# One ReceiveMessage returns at most 10 messages; Lambda's SQS batch may be bigger with a window.
RECEIVE_MAX_MESSAGES = 10
MAX_BATCH_SIZE_WITH_WINDOW = 10_000
# The JSON around the records of an SQS event: {"Records": [...]}, and ", " between records.
_EVENT_ENVELOPE_BYTES = invoke_payload_bytes({"Records": []})
_RECORD_SEPARATOR_BYTES = len(", ")


def sqs_record(message: dict[str, Any], queue_arn: str, region: str = LOCAL_REGION) -> dict[str, Any]:
    """One record of Lambda's SQS event, from one message of a ReceiveMessage answer."""
    record: dict[str, Any] = {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": message.get("Body", ""),
        "attributes": {name: str(value) for name, value in (message.get("Attributes") or {}).items()},
        "messageAttributes": {
            name: _message_attribute(value) for name, value in (message.get("MessageAttributes") or {}).items()
        },
        "md5OfBody": message.get("MD5OfBody") or hashlib.md5(message.get("Body", "").encode()).hexdigest(),
    }
    if message.get("MD5OfMessageAttributes"):
        record["md5OfMessageAttributes"] = message["MD5OfMessageAttributes"]
    record.update(eventSource="aws:sqs", eventSourceARN=queue_arn, awsRegion=region)
    return record


def _message_attribute(value: dict[str, Any]) -> dict[str, Any]:
    # Lambda's shape: camelCase, binary as base64 text, both list fields always present.
    attribute: dict[str, Any] = {}
    if "StringValue" in value:
        attribute["stringValue"] = value["StringValue"]
    if "BinaryValue" in value:
        attribute["binaryValue"] = _b64(value["BinaryValue"])
    attribute["stringListValues"] = list(value.get("StringListValues") or [])
    attribute["binaryListValues"] = [_b64(item) for item in value.get("BinaryListValues") or []]
    attribute["dataType"] = value.get("DataType", "String")
    return attribute


def _b64(value: bytes | str) -> str:
    return base64.b64encode(value if isinstance(value, bytes) else value.encode()).decode("ascii")


def records_within_invoke_payload(records: list[dict[str, Any]]) -> int:
    """How many of `records`, from the first, make an SQS event within Lambda's invoke payload
    (at least one: a single message is far under it, SQS's own limit is 1 MiB)."""
    size = _EVENT_ENVELOPE_BYTES
    for count, record in enumerate(records):
        size += invoke_payload_bytes(record) + (_RECORD_SEPARATOR_BYTES if count else 0)
        if size > LAMBDA_INVOKE_PAYLOAD_BYTES:
            return max(count, 1)
    return len(records)


def failed_message_ids(response: Any, message_ids: list[str]) -> set[str] | None:
    """The message ids a `ReportBatchItemFailures` answer keeps, or None if the whole batch failed.

    As Lambda does: no answer or no `batchItemFailures` means all succeeded; a failure without a
    valid `itemIdentifier` (empty, or not a message of this batch) fails the whole batch.
    """
    if not isinstance(response, dict):
        return set()
    failures = response.get("batchItemFailures")
    if not failures:
        return set()
    known = set(message_ids)
    failed = set()
    for failure in failures:
        identifier = failure.get("itemIdentifier") if isinstance(failure, dict) else None
        if not identifier or identifier not in known:
            return None
        failed.add(identifier)
    return failed


class _Pausable:
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


class _InvocationsInFlight(_Pausable):
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


class QueuePoller(_InvocationsInFlight):
    """One SQS event mapping: a queue, a worker handler, a batch size and a concurrency cap."""

    def __init__(
        self,
        *,
        name: str,
        sqs: Any,
        queue_url: str,
        queue_arn: str,
        handler: Callable[[dict, Any], Any],
        batch_size: int = 10,
        max_batching_window: float = 0.0,
        max_concurrency: int = 2,
        report_batch_item_failures: bool = True,
        context_factory: Callable[[], Any] | None = None,
        idle_sleep: float = IDLE_SLEEP_SECONDS,
        region: str = LOCAL_REGION,
    ) -> None:
        self.name = name
        self.sqs = sqs
        self.queue_url = queue_url
        self.queue_arn = queue_arn
        self.handler = handler
        self.max_batching_window = max(0.0, float(max_batching_window))
        # Lambda takes a BatchSize over 10 only with a batching window.
        ceiling = MAX_BATCH_SIZE_WITH_WINDOW if self.max_batching_window > 0 else RECEIVE_MAX_MESSAGES
        self.batch_size = max(1, min(int(batch_size), ceiling))
        self.max_concurrency = max(1, int(max_concurrency))
        self.report_batch_item_failures = report_batch_item_failures
        self.context_factory = context_factory or (lambda: LambdaContext(name, 128, 60))
        self.idle_sleep = idle_sleep
        self.region = region
        self._slots = threading.Semaphore(self.max_concurrency)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        super().__init__()
        self._counts = dict.fromkeys(
            (
                "receives",
                "empty_receives",
                "invocations",
                "errors",
                "messages",
                "deleted",
                "reported_failures",
                "released_over_payload",
            ),
            0,
        )

    # ---------------------------------------------------------------- control

    def start(self) -> QueuePoller:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=f"poller-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop receiving and wait up to `timeout` for running invocations; True if they all ended."""
        self._stop.set()
        self._running.set()  # a paused loop must wake up to see the stop
        if self._thread is not None:
            self._thread.join(timeout=timeout)
        return self.wait_idle(timeout)

    def wake(self) -> None:
        """A message may have arrived: receive now instead of at the next idle poll."""
        self._wake.set()


    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                **self._counts,
                "in_flight": self._in_flight,
                "max_in_flight": self._max_in_flight,
                "paused": self.paused,
                "max_concurrency": self.max_concurrency,
                "batch_size": self.batch_size,
                "max_batching_window": self.max_batching_window,
            }

    # ---------------------------------------------------------------- loop

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._running.wait()
            if self._stop.is_set():
                break
            # Receive only with a free invocation slot, as Lambda's poller scales to the cap.
            if not self._slots.acquire(timeout=0.2):
                continue
            if self._stop.is_set() or self.paused:
                self._slots.release()
                continue
            try:
                messages = self._gather()
            except Exception:
                self._slots.release()
                if not self._stop.is_set():
                    log.exception("%s: ReceiveMessage failed", self.name)
                    self._stop.wait(ERROR_SLEEP_SECONDS)
                continue
            if not messages:
                self._slots.release()
                self._wake.wait(self.idle_sleep)
                self._wake.clear()
                continue
            records = [sqs_record(message, self.queue_arn, self.region) for message in messages]
            fitting = records_within_invoke_payload(records)
            if fitting < len(records):
                try:
                    self._release(records[fitting:])
                except Exception:  # they come back after their visibility timeout instead
                    log.exception("%s: could not make the messages over the invoke payload visible", self.name)
                records = records[:fitting]
            with self._lock:
                self._in_flight += 1
                self._max_in_flight = max(self._max_in_flight, self._in_flight)
                self._counts["messages"] += len(records)
            # A daemon thread per invocation (not an executor): a hung invocation must not keep
            # the process from exiting when the stack stops.
            threading.Thread(target=self._invoke, args=(records,), name=f"invoke-{self.name}", daemon=True).start()

    def _gather(self) -> list[dict[str, Any]]:
        """One batch: what one receive gets, or with a batching window, up to `batch_size`
        messages received until the window (started by the first message) is over."""
        messages = self._receive(min(self.batch_size, RECEIVE_MAX_MESSAGES))
        if not messages or self.max_batching_window <= 0:
            return messages
        deadline = time.monotonic() + self.max_batching_window
        while len(messages) < self.batch_size and not self._stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            more = self._receive(min(self.batch_size - len(messages), RECEIVE_MAX_MESSAGES))
            if more:
                messages.extend(more)
                continue
            self._wake.wait(min(self.idle_sleep, remaining))
            self._wake.clear()
        return messages

    def _release(self, records: list[dict[str, Any]]) -> None:
        """Make received messages visible again at once: they did not fit in this event."""
        for start in range(0, len(records), RECEIVE_MAX_MESSAGES):
            chunk = records[start : start + RECEIVE_MAX_MESSAGES]
            self.sqs.change_message_visibility_batch(
                QueueUrl=self.queue_url,
                Entries=[
                    {"Id": str(index), "ReceiptHandle": record["receiptHandle"], "VisibilityTimeout": 0}
                    for index, record in enumerate(chunk)
                ],
            )
        with self._lock:
            self._counts["released_over_payload"] += len(records)
        log.info("%s: %d message(s) over the 6 MB invoke payload wait for the next batch", self.name, len(records))

    def _receive(self, max_messages: int) -> list[dict[str, Any]]:
        answer = self.sqs.receive_message(
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=max_messages,
            WaitTimeSeconds=0,
            AttributeNames=["All"],
            MessageSystemAttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        messages = answer.get("Messages") or []
        with self._lock:
            self._counts["receives"] += 1
            if not messages:
                self._counts["empty_receives"] += 1
        return messages

    def _invoke(self, records: list[dict[str, Any]]) -> None:
        try:
            event = {"Records": records}
            ids = [record["messageId"] for record in event["Records"]]
            with self._lock:
                self._counts["invocations"] += 1
            try:
                response = self.handler(event, self.context_factory())
            except Exception:
                with self._lock:
                    self._counts["errors"] += 1
                log.exception(
                    "%s: the worker raised; its %d message(s) return after the visibility timeout",
                    self.name,
                    len(records),
                )
                return
            failed = failed_message_ids(response, ids) if self.report_batch_item_failures else set()
            if failed is None:
                with self._lock:
                    self._counts["errors"] += 1
                log.error(
                    "%s: invalid batchItemFailures %r; the whole batch counts as failed",
                    self.name,
                    response.get("batchItemFailures") if isinstance(response, dict) else response,
                )
                return
            done = [record for record in event["Records"] if record["messageId"] not in failed]
            with self._lock:
                self._counts["reported_failures"] += len(failed)
            self._delete(done)
        except Exception:
            log.exception("%s: invocation bookkeeping failed", self.name)
        finally:
            with self._idle:
                self._in_flight -= 1
                self._idle.notify_all()
            self._slots.release()

    def _delete(self, records: list[dict[str, Any]]) -> None:
        for start in range(0, len(records), 10):
            chunk = records[start : start + 10]
            answer = self.sqs.delete_message_batch(
                QueueUrl=self.queue_url,
                Entries=[
                    {"Id": str(index), "ReceiptHandle": record["receiptHandle"]} for index, record in enumerate(chunk)
                ],
            )
            deleted = len(answer.get("Successful") or [])
            with self._lock:
                self._counts["deleted"] += deleted
            for failure in answer.get("Failed") or []:
                log.warning("%s: DeleteMessageBatch failed for an entry: %s", self.name, failure)


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


class ScheduleTimer(_InvocationsInFlight):
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


def _lambda_json(value: Any) -> Any:
    """A GetRecords value as Lambda's event carries it: binary attributes as base64 text."""
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dict):
        return {key: _lambda_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_lambda_json(item) for item in value]
    return value


def stream_record(record: dict[str, Any], stream_arn: str, region: str = LOCAL_REGION) -> dict[str, Any]:
    """One record of Lambda's DynamoDB stream event, from one record of a GetRecords answer."""
    dynamodb = _lambda_json(dict(record.get("dynamodb") or {}))
    created = dynamodb.get("ApproximateCreationDateTime")
    if isinstance(created, dt.datetime):
        dynamodb["ApproximateCreationDateTime"] = created.timestamp()
    return {**record, "dynamodb": dynamodb, "awsRegion": region, "eventSourceARN": stream_arn}


class StreamPoller(_Pausable):
    """One DynamoDB stream event mapping, as Lambda runs it: the shard's records in order, in
    batches of at most `batch_size` gathered for up to the batching window, only those the
    mapping's filters match; a batch that fails (raises, or reports failures) is retried from its
    first failed record (Lambda's checkpoint), `BisectBatchOnFunctionError` aside, up to
    `max_retries` times, then its records go to the OnFailure queue and the shard moves on.

    Polls GetRecords every `idle_sleep` seconds (`wake()` makes it look at once: the local stack
    wakes it after every DynamoDB write of this process)."""

    def __init__(self, *, name: str, streams: Any, sqs: Any, stream_arn: str, handler: Callable[[dict, Any], Any],
                 batch_size: int = 100, max_batching_window: float = 0.0, filters: list[dict] | None = None,
                 max_retries: int = -1, on_failure_queue_url: str | None = None,
                 report_batch_item_failures: bool = True, context_factory: Callable[[], Any] | None = None,
                 idle_sleep: float = IDLE_SLEEP_SECONDS, region: str = LOCAL_REGION) -> None:
        from moto.events.models import EventPattern

        self.name = name
        self.streams = streams
        self.sqs = sqs
        self.stream_arn = stream_arn
        self.handler = handler
        self.batch_size = max(1, int(batch_size))
        self.max_batching_window = max(0.0, float(max_batching_window))
        # Lambda's filter patterns are EventBridge patterns: moto's matcher reads them.
        self.patterns = [EventPattern.load(f["Pattern"]) for f in filters or []]
        self._filters_read_images = any("Image" in f["Pattern"] for f in filters or [])
        self.max_retries = int(max_retries)
        self.on_failure_queue_url = on_failure_queue_url
        self.report_batch_item_failures = report_batch_item_failures
        self.context_factory = context_factory or (lambda: LambdaContext(name, 128, 60))
        self.idle_sleep = idle_sleep
        self.region = region
        super().__init__()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._busy = threading.Event()
        self._thread: threading.Thread | None = None
        self._iterator: str | None = None
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(("get_records", "records", "matched", "invocations", "errors", "given_up"), 0)

    def start(self) -> StreamPoller:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=f"stream-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> bool:
        self._stop.set()
        self._running.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
            return not self._thread.is_alive()
        return True

    def wake(self) -> None:
        self._wake.set()

    def wait_idle(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._busy.is_set():
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {**self._counts, "paused": self.paused, "batch_size": self.batch_size}

    def _count(self, name: str, value: int = 1) -> None:
        with self._lock:
            self._counts[name] += value

    def _shard_iterator(self) -> str:
        shard = self.streams.describe_stream(StreamArn=self.stream_arn)["StreamDescription"]["Shards"][0]
        return self.streams.get_shard_iterator(StreamArn=self.stream_arn, ShardId=shard["ShardId"],
                                               ShardIteratorType="TRIM_HORIZON")["ShardIterator"]

    def _matches(self, record: dict[str, Any]) -> bool:
        """Whether the mapping's filters take `record`. Matched on its keys and event name alone
        when no filter looks at the images: a request item's images (its compressed answer) are
        large, and most records are of request items."""
        if not self.patterns:
            return True
        dynamodb = record.get("dynamodb") or {}
        if not self._filters_read_images:
            dynamodb = {"Keys": dynamodb.get("Keys")}
        thin = _lambda_json({"eventName": record.get("eventName"), "eventSource": record.get("eventSource"),
                             "dynamodb": {k: v for k, v in dynamodb.items() if k != "ApproximateCreationDateTime"}})
        return any(pattern.matches_event(thin) for pattern in self.patterns)

    def _loop(self) -> None:
        pending: list[dict[str, Any]] = []
        window_ends: float | None = None
        while not self._stop.is_set():
            self._running.wait()
            if self._stop.is_set():
                break
            try:
                if self._iterator is None:
                    self._iterator = self._shard_iterator()
                answer = self.streams.get_records(ShardIterator=self._iterator, Limit=1000)
            except Exception:
                if not self._stop.is_set():
                    log.exception("%s: GetRecords failed", self.name)
                    self._stop.wait(ERROR_SLEEP_SECONDS)
                continue
            self._count("get_records")
            self._iterator = answer.get("NextShardIterator") or self._iterator
            records = answer.get("Records") or []
            self._count("records", len(records))
            try:
                matched = [stream_record(r, self.stream_arn, self.region) for r in records if self._matches(r)]
            except Exception:
                log.exception("%s: could not filter stream records; they are skipped", self.name)
                matched = []
            self._count("matched", len(matched))
            pending.extend(matched)
            if pending and window_ends is None:
                window_ends = time.monotonic() + self.max_batching_window
            full = len(pending) >= self.batch_size
            if pending and (full or time.monotonic() >= (window_ends or 0)):
                self._busy.set()
                try:
                    while pending and not self._stop.is_set():
                        batch, pending = pending[:self.batch_size], pending[self.batch_size:]
                        self._invoke_until_done(batch)
                finally:
                    self._busy.clear()
                window_ends = None
                continue
            if not records:
                self._wake.wait(self.idle_sleep if not pending else min(self.idle_sleep, self.max_batching_window))
                self._wake.clear()

    def _invoke_until_done(self, batch: list[dict[str, Any]]) -> None:
        """Invoke with `batch` until every record succeeded, retrying from the first failed one."""
        retries = 0
        while batch and not self._stop.is_set():
            self._count("invocations")
            try:
                response = self.handler({"Records": batch}, self.context_factory())
                failed_from = self._first_failure(response, batch)
            except Exception:
                log.exception("%s: the function raised; its %d record(s) are retried", self.name, len(batch))
                failed_from = 0
            if failed_from is None:
                return
            self._count("errors")
            batch = batch[failed_from:]
            retries += 1
            if 0 <= self.max_retries < retries:
                self._give_up(batch)
                return
            self._stop.wait(min(ERROR_SLEEP_SECONDS * retries, 5.0))

    def _first_failure(self, response: Any, batch: list[dict[str, Any]]) -> int | None:
        """The index of the first record to retry, or None if the batch succeeded."""
        if not self.report_batch_item_failures or not isinstance(response, dict):
            return None
        failures = response.get("batchItemFailures") or []
        if not failures:
            return None
        numbers = [r["dynamodb"]["SequenceNumber"] for r in batch]
        first = [f.get("itemIdentifier") for f in failures if isinstance(f, dict)]
        positions = [numbers.index(i) for i in first if i in numbers]
        return min(positions) if positions and len(positions) == len(first) else 0

    def _give_up(self, batch: list[dict[str, Any]]) -> None:
        self._count("given_up", len(batch))
        log.error("%s: %d stream record(s) failed every retry; sent to the OnFailure destination",
                  self.name, len(batch))
        if self.on_failure_queue_url:
            self.sqs.send_message(QueueUrl=self.on_failure_queue_url, MessageBody=json.dumps({
                "requestContext": {"condition": "RetryAttemptsExhausted", "functionArn": self.name},
                "DDBStreamBatchInfo": {"streamArn": self.stream_arn, "batchSize": len(batch),
                                       "startSequenceNumber": batch[0]["dynamodb"]["SequenceNumber"],
                                       "endSequenceNumber": batch[-1]["dynamodb"]["SequenceNumber"]}}))
