"""An SQS event source mapping, as Lambda runs it, on threads.

`QueuePoller` is one SQS event mapping: it receives up to `BatchSize` messages, builds the SQS
event exactly as Lambda does, invokes the worker with at most `ScalingConfig.MaximumConcurrency`
invocations at once (it stops receiving while all are busy), and deletes every record the
invocation did not report in `batchItemFailures`; an invocation that raises deletes nothing, so
its messages come back after the visibility timeout, as on AWS. An invocation the function
throttles (beyond its reserved concurrency: environments.py) is sent again with exponential
backoff while the batch's visibility timeout lasts, then left to come back, as Lambda's poller
does for a throttled batch ("Backoff strategy for failed invocations", Lambda's operator guide).

As Lambda does, it gathers a batch for at most the mapping's `MaximumBatchingWindowInSeconds`
(0 or absent: it invokes at once with what one receive got; with a window, `BatchSize` may go
up to 10,000 and it receives again until the batch is full or the window is over), and it never
builds an event over Lambda's 6 MB invoke payload: the messages that do not fit are made visible
again at once (Lambda keeps them for its next batch; here they are received again, so their
receive count goes up by one).

Polls never wait (`WaitTimeSeconds=0`): every moto request holds the moto server's one lock, so
a long poll would stall every other AWS call of the stack. An empty receive sleeps a few tens of
milliseconds instead.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from freeinference_batch_local.cloudformation.resources import TemplateResources, truthy
from freeinference_batch_local.environments import is_throttle
from freeinference_batch_local.handlers import (
    LAMBDA_INVOKE_PAYLOAD_BYTES,
    LOCAL_REGION,
    FunctionSpec,
    LambdaContext,
    invoke_payload_bytes,
)
from freeinference_batch_local.triggers.event_source import (
    ERROR_SLEEP_SECONDS,
    IDLE_SLEEP_SECONDS,
    InvocationsInFlight,
)

log = logging.getLogger(__name__)

# One ReceiveMessage returns at most 10 messages; Lambda's SQS batch may be bigger with a window.
RECEIVE_MAX_MESSAGES = 10
MAX_BATCH_SIZE_WITH_WINDOW = 10_000
# The JSON around the records of an SQS event: {"Records": [...]}, and ", " between records.
_EVENT_ENVELOPE_BYTES = invoke_payload_bytes({"Records": []})
_RECORD_SEPARATOR_BYTES = len(", ")
# A throttled invocation is sent again after this, doubling up to the cap, while the batch's
# messages stay invisible. SQS's default VisibilityTimeout, for a queue that sets none.
THROTTLE_BACKOFF_SECONDS = 0.05
THROTTLE_BACKOFF_MAX_SECONDS = 2.0
DEFAULT_VISIBILITY_TIMEOUT = 30.0


def queue_pollers(functions: Iterable[FunctionSpec], resources: TemplateResources, sqs: Any,
                  invoker: Callable[[FunctionSpec], Any]) -> Iterator[QueuePoller]:
    """A QueuePoller (not started) per enabled `SQS` event of `functions`, named for its function
    (`Function.Event` when the function has several); `invoker(function)` is what it invokes."""
    urls_by_arn = resources.queue_urls_by_arn()
    for spec in functions:
        for event_name, properties in spec.events("SQS").items():
            if not truthy(properties.get("Enabled", True)):
                continue
            arn = resources.resolve(properties["Queue"])
            name = spec.logical_id if len(spec.events("SQS")) == 1 else f"{spec.logical_id}.{event_name}"
            yield QueuePoller(
                name=name,
                sqs=sqs,
                queue_url=urls_by_arn[arn],
                queue_arn=arn,
                handler=invoker(spec),
                batch_size=int(properties.get("BatchSize", 10)),
                max_batching_window=float(properties.get("MaximumBatchingWindowInSeconds") or 0),
                max_concurrency=spec.mapping_concurrency(properties),
                visibility_timeout=_visibility_timeout(resources, arn),
                report_batch_item_failures="ReportBatchItemFailures"
                in (properties.get("FunctionResponseTypes") or ()),
                context_factory=spec.context,
            )


def _visibility_timeout(resources: TemplateResources, arn: str) -> float:
    """The VisibilityTimeout of the template's queue whose ARN is `arn`."""
    for logical_id, physical in resources.physical.items():
        if physical.get("Arn") == arn:
            properties = resources.resources[logical_id].get("Properties") or {}
            return float(resources.resolve(properties.get("VisibilityTimeout", DEFAULT_VISIBILITY_TIMEOUT)))
    return DEFAULT_VISIBILITY_TIMEOUT


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
        "md5OfBody": message.get("MD5OfBody")
        or hashlib.md5(message.get("Body", "").encode(), usedforsecurity=False).hexdigest(),
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



class QueuePoller(InvocationsInFlight):
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
        visibility_timeout: float = DEFAULT_VISIBILITY_TIMEOUT,
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
        self.visibility_timeout = float(visibility_timeout)
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
                "release_failed",
                "throttles",
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
            received_at = time.monotonic()
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
            threading.Thread(target=self._invoke, args=(records, received_at), name=f"invoke-{self.name}",
                             daemon=True).start()

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
        """Make received messages visible again at once: they did not fit in this event. A batch
        call answers 200 with the entries it could not change in `Failed`: those come back at their
        visibility timeout instead, as on AWS."""
        failed = 0
        for start in range(0, len(records), RECEIVE_MAX_MESSAGES):
            chunk = records[start : start + RECEIVE_MAX_MESSAGES]
            answer = self.sqs.change_message_visibility_batch(
                QueueUrl=self.queue_url,
                Entries=[
                    {"Id": str(index), "ReceiptHandle": record["receiptHandle"], "VisibilityTimeout": 0}
                    for index, record in enumerate(chunk)
                ],
            )
            failed += len(answer.get("Failed") or [])
        with self._lock:
            self._counts["released_over_payload"] += len(records) - failed
            self._counts["release_failed"] += failed
        log.info("%s: %d message(s) over the 6 MB invoke payload wait for the next batch", self.name, len(records))
        if failed:
            log.warning("%s: %d of them could not be made visible; they come back at their visibility timeout",
                        self.name, failed)

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

    def _invoke(self, records: list[dict[str, Any]], received_at: float | None = None) -> None:
        try:
            event = {"Records": records}
            ids = [record["messageId"] for record in event["Records"]]
            with self._lock:
                self._counts["invocations"] += 1
            try:
                response = self._invoke_unless_throttled(event, received_at)
            except Exception as error:
                with self._lock:
                    self._counts["errors"] += 1
                if is_throttle(error):
                    log.warning("%s: throttled until the batch's visibility timeout; its %d message(s) come back",
                                self.name, len(records))
                else:
                    log.exception("%s: the worker raised; its %d message(s) return after the visibility timeout",
                                  self.name, len(records))
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

    def _invoke_unless_throttled(self, event: dict[str, Any], received_at: float | None) -> Any:
        """The handler's answer; a throttled invocation sent again with backoff while the batch
        is invisible (the last throttle raised when the next try would be past it)."""
        visible_again = (time.monotonic() if received_at is None else received_at) + self.visibility_timeout
        delay = THROTTLE_BACKOFF_SECONDS
        while True:
            try:
                return self.handler(event, self.context_factory())
            except Exception as error:
                if not is_throttle(error) or time.monotonic() + delay >= visible_again or self._stop.is_set():
                    raise
                with self._lock:
                    self._counts["throttles"] += 1
            self._stop.wait(delay)
            delay = min(delay * 2, THROTTLE_BACKOFF_MAX_SECONDS)

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

