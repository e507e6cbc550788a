"""A DynamoDB stream event source mapping, as Lambda runs it, on a thread (`StreamPoller`): the
shard's records in order, filtered by the mapping's `FilterCriteria`, retried from the first
failed record up to `MaximumRetryAttempts`, then sent to the `OnFailure` destination."""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from moto.events.models import EventPattern

from freeinference_batch_local.cloudformation.resources import TemplateResources, truthy
from freeinference_batch_local.handlers import LOCAL_REGION, FunctionSpec, LambdaContext
from freeinference_batch_local.triggers.event_source import ERROR_SLEEP_SECONDS, IDLE_SLEEP_SECONDS, Pausable

log = logging.getLogger(__name__)


def stream_pollers(functions: Iterable[FunctionSpec], resources: TemplateResources, clients: dict[str, Any],
                   invoker: Callable[[FunctionSpec], Any]) -> Iterator[StreamPoller]:
    """A StreamPoller (not started) per enabled `DynamoDB` event of `functions`, named for its
    function (`Function.Event` when the function has several), reading with
    `clients["dynamodbstreams"]` and sending failures with `clients["sqs"]`; `invoker(function)`
    is what it invokes."""
    urls_by_arn = resources.queue_urls_by_arn()
    for spec in functions:
        for event_name, properties in spec.events("DynamoDB").items():
            if not truthy(properties.get("Enabled", True)):
                continue
            on_failure = ((properties.get("DestinationConfig") or {}).get("OnFailure") or {}).get("Destination")
            name = spec.logical_id if len(spec.events("DynamoDB")) == 1 else f"{spec.logical_id}.{event_name}"
            yield StreamPoller(
                name=name,
                streams=clients["dynamodbstreams"],
                sqs=clients["sqs"],
                stream_arn=resources.resolve(properties["Stream"]),
                handler=invoker(spec),
                batch_size=int(properties.get("BatchSize", 100)),
                max_batching_window=float(properties.get("MaximumBatchingWindowInSeconds") or 0),
                filters=(properties.get("FilterCriteria") or {}).get("Filters"),
                max_retries=int(properties.get("MaximumRetryAttempts", -1)),
                on_failure_queue_url=urls_by_arn.get(resources.resolve(on_failure)) if on_failure else None,
                report_batch_item_failures="ReportBatchItemFailures"
                in (properties.get("FunctionResponseTypes") or ()),
                context_factory=spec.context,
            )


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


class StreamPoller(Pausable):
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
