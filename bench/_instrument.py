"""Counting and timing every AWS call of an in-process LocalStack, by who made it.

botocore event hooks (`before-parameter-build.*.*` / `after-call.*.*`, plus `before-send.*.*`
for HTTP attempts, i.e. retries) are registered on every client the service uses: the cached clients of
`freeinference_batch.core.aws` (the functions' code) and each queue poller's own SQS client (the
stand-in for Lambda's event source mapping). A thread-local label says who is calling: wrappers
around the API routes, `Worker.handle_record`, the schedule handlers and the pollers set it.

Each call also gets its billing units for the cost model, and every write is counted by item
(_billing.py: `AwsCalls` is a `BillingUnits`).

Nothing here changes the service: it patches functions of this process only.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from _billing import BillingUnits

_local = threading.local()


def current_source() -> str:
    return getattr(_local, "source", None) or "other"


class labelled:
    """Context manager: calls made on this thread inside are labelled `source`."""

    def __init__(self, source: str) -> None:
        self.source = source

    def __enter__(self) -> None:
        self.previous = getattr(_local, "source", None)
        _local.source = self.source

    def __exit__(self, *exc: object) -> None:
        _local.source = self.previous


@dataclass
class OpStats:
    calls: int = 0
    attempts: int = 0
    seconds: float = 0.0
    rru: float = 0.0  # DynamoDB read request units
    wru: float = 0.0  # DynamoDB write request units
    old_wru: float = 0.0  # the same writes under the old rule (after-image, every GSI the item is in)
    sqs_requests: int = 0  # SQS billed requests (64 KB chunks)
    s3_puts: int = 0
    s3_gets: int = 0
    empty: int = 0  # ReceiveMessage answers without messages
    messages: int = 0  # messages received / sent


@dataclass
class Timings:
    """Worker-side timings (seconds), filled by the wrappers."""

    handle: list[float] = field(default_factory=list)  # every handle_record
    # records that called upstream: (handle_record minus its upstream calls, upstream calls). One
    # record runs a stretch of its chain (the hand-overs), so a record can run several requests.
    chain_runs: list[tuple[float, int]] = field(default_factory=list)
    upstream: list[float] = field(default_factory=list)
    queue_wait: list[float] = field(default_factory=list)  # SentTimestamp -> handle_record start
    outcomes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    invocations: list[tuple[int, float]] = field(default_factory=list)  # (messages, seconds)
    # Per invocation, in the order they ended: [(records' upstream calls, records' upstream
    # seconds)], one pair per record (records run side by side, each its chain's requests in turn).
    invocation_records: list[list[tuple[int, float]]] = field(default_factory=list)
    api: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))  # route -> seconds

    @property
    def requests_run(self) -> int:
        return sum(calls for _, calls in self.chain_runs)

    @property
    def overhead_per_request(self) -> float:
        """Worker time per upstream call besides the call itself (AWS calls, their wait for moto)."""
        return sum(seconds for seconds, _ in self.chain_runs) / max(1, self.requests_run)


class MotoBusy:
    """Time spent inside moto (holding its one lock), by operation: wraps the serialized WSGI app."""

    def __init__(self, stack: Any) -> None:
        self.app = stack.moto.app
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._inner = self.app.app
        self._lock = threading.Lock()

    def install(self) -> MotoBusy:
        inner = self._inner

        def timed(environ: dict, start_response: Any) -> Any:
            started = time.perf_counter()
            try:
                return inner(environ, start_response)
            finally:
                target = environ.get("HTTP_X_AMZ_TARGET", "")
                op = target.rpartition(".")[2] if target else f"s3 {environ.get('REQUEST_METHOD')}"
                with self._lock:
                    self.seconds[op] += time.perf_counter() - started
                    self.calls[op] += 1

        self.app.app = timed
        return self

    def uninstall(self) -> None:
        self.app.app = self._inner

    def reset(self) -> None:
        with self._lock:
            self.seconds.clear()
            self.calls.clear()

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


class AwsCalls(BillingUnits):
    def __init__(self, stack: Any, units: bool = True) -> None:
        super().__init__(stack)
        self.stack = stack
        self.with_units = units
        self.ops: dict[tuple[str, str], OpStats] = defaultdict(OpStats)
        self.timings = Timings()
        self.enabled = True
        self._patched: list[tuple[Any, str, Any]] = []
        self._record_sink: dict[str, list[tuple[int, float]]] = {}

    # ------------------------------------------------------------ installing

    def install(self) -> AwsCalls:
        from freeinference_batch import worker
        from freeinference_batch.core import aws
        from freeinference_batch.worker import upstream

        hooked: set[int] = set()
        for client in (aws.dynamodb(), aws.sqs(), aws.s3()):
            hooked.add(id(client))
            self._hook(client, None)
        for poller in self.stack.pollers.values():
            if id(poller.sqs) not in hooked:  # the pollers share one client of their own
                hooked.add(id(poller.sqs))
                self._hook(poller.sqs, "poller")
            self._patch(poller, "handler", self._wrap_invocation(poller.handler))
        for name, timer in self.stack.timers.items():
            self._patch(timer, "handler", self._wrap_label(timer.handler, f"schedule:{name}"))
        for route in self.stack.api.routes:
            self._patch(route, "handler", self._wrap_api(route.handler, route.route_key))
        self._patch(worker.Worker, "handle_record", self._wrap_handle_record(worker.Worker.handle_record))
        self._patch(upstream, "call", self._wrap_upstream(upstream.call))
        return self

    def uninstall(self) -> None:
        for owner, name, original in reversed(self._patched):
            setattr(owner, name, original)
        self._patched.clear()
        self.enabled = False

    def reset(self) -> None:
        with self.lock:
            self.ops.clear()
            self.timings = Timings()
            self._clear_units()

    def _patch(self, owner: Any, name: str, replacement: Any) -> None:
        self._patched.append((owner, name, getattr(owner, name)))
        setattr(owner, name, replacement)

    def _hook(self, client: Any, fixed_source: str | None) -> None:
        service = client.meta.service_model.service_name
        events = client.meta.events

        def before_parameter_build(params: dict, context: dict, model: Any, **_: Any) -> None:
            context["bench_params"] = params  # the API parameters (before-call only sees the HTTP request)
            if service == "dynamodb" and self.with_units and self.enabled:
                try:  # DynamoDB bills a write by the larger of the item before and after it
                    context["bench_before"] = {target: self._image(*target)
                                               for target in self._write_targets(model.name, params)}
                except Exception as error:  # a cost estimate must never break the call
                    print(f"(before-image failed for {model.name}: {error!r})")
            context["bench_started"] = time.perf_counter()
            _local.attempts = 0

        def before_send(**_: Any) -> None:
            _local.attempts = getattr(_local, "attempts", 0) + 1

        def after_call(model: Any, parsed: dict, context: dict, http_response: Any = None, **_: Any) -> None:
            if not self.enabled:
                return
            seconds = time.perf_counter() - context.get("bench_started", time.perf_counter())
            params = context.get("bench_params") or {}
            source = fixed_source or current_source()
            try:
                units = self._units(service, model.name, params, parsed, http_response,
                                    context.get("bench_before") or {}, source=source) if self.with_units else {}
            except Exception as error:  # a cost estimate must never break the call
                units = {}
                print(f"(cost estimate failed for {model.name}: {error!r})")
            empty = model.name == "ReceiveMessage" and not parsed.get("Messages")
            name = model.name + (" (empty)" if empty else "")
            with self.lock:
                stats = self.ops[(source, f"{service}.{name}")]
                stats.calls += 1
                stats.attempts += max(1, getattr(_local, "attempts", 1))
                stats.seconds += seconds
                for name, value in units.items():
                    setattr(stats, name, getattr(stats, name) + value)

        events.register(f"before-parameter-build.{service}.*", before_parameter_build)
        events.register(f"before-send.{service}.*", before_send)
        events.register(f"after-call.{service}.*", after_call)

    # ------------------------------------------------------------ wrappers

    def _wrap_label(self, function: Any, source: str) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with labelled(source):
                return function(*args, **kwargs)

        return wrapped

    def _wrap_api(self, function: Any, route_key: str) -> Any:
        def wrapped(event: dict, context: Any) -> Any:
            started = time.perf_counter()
            with labelled(f"api:{route_key}"):
                try:
                    return function(event, context)
                finally:
                    with self.lock:
                        self.timings.api[route_key].append(time.perf_counter() - started)

        return wrapped

    def _wrap_invocation(self, function: Any) -> Any:
        def wrapped(event: dict, context: Any) -> Any:
            started = time.perf_counter()
            # The records run on the handler's own threads: they find their invocation by message id.
            ids = [record.get("messageId") for record in event.get("Records", ())]
            mine: list[tuple[int, float]] = []
            with self.lock:
                for message_id in ids:
                    self._record_sink[message_id] = mine
            with labelled("worker"):
                try:
                    return function(event, context)
                finally:
                    with self.lock:
                        for message_id in ids:
                            self._record_sink.pop(message_id, None)
                        self.timings.invocations.append((len(event.get("Records", ())), time.perf_counter() - started))
                        self.timings.invocation_records.append(mine)

        return wrapped

    def _wrap_handle_record(self, function: Any) -> Any:
        timings_of = self

        def handle_record(worker_self: Any, record: dict, deadline: float | None = None,
                          invocation_seconds: float | None = None) -> Any:
            started = time.perf_counter()
            sent = float(record.get("attributes", {}).get("SentTimestamp", 0)) / 1000
            _local.upstream_seconds, _local.upstream_calls = 0.0, 0
            outcome = None
            with labelled("worker"):
                try:
                    outcome = function(worker_self, record, deadline, invocation_seconds)
                    return outcome
                finally:
                    seconds = time.perf_counter() - started
                    up = getattr(_local, "upstream_seconds", 0.0)
                    with timings_of.lock:
                        t = timings_of.timings
                        t.handle.append(seconds)
                        if up:
                            t.chain_runs.append((seconds - up, _local.upstream_calls))
                        sink = timings_of._record_sink.get(record.get("messageId"))
                        if sink is not None:
                            sink.append((getattr(_local, "upstream_calls", 0), up))
                        if sent:
                            t.queue_wait.append(max(0.0, time.time() - seconds - sent))
                        t.outcomes[type(outcome).__name__ if outcome is not None else "raised"] += 1

        return handle_record

    def _wrap_upstream(self, function: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                seconds = time.perf_counter() - started
                _local.upstream_seconds = getattr(_local, "upstream_seconds", 0.0) + seconds
                _local.upstream_calls = getattr(_local, "upstream_calls", 0) + 1
                with self.lock:
                    self.timings.upstream.append(seconds)

        return call

    # ------------------------------------------------------------ reading the figures

    def by_source(self) -> dict[str, dict[str, OpStats]]:
        out: dict[str, dict[str, OpStats]] = defaultdict(dict)
        with self.lock:
            for (source, op), stats in self.ops.items():
                out[source][op] = stats
        return out

    def moto_requests(self) -> int:
        return self.stack.moto.app.requests
