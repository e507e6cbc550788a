"""What a step of a request's run answers: the message is done with or parked, a request is
claimed and to run, or a chain leaves its invocation."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass

from aws_lambda_powertools.metrics import MetricUnit, single_metric

from freeinference_batch.core.observability import metrics
from freeinference_batch.core.schemas import RequestMessage
from freeinference_batch.store.batch_record import BatchRecord
from freeinference_batch.store.runs import Tally
from freeinference_batch.worker import model_backoff
from freeinference_batch.worker.gates import QuotaReading
from freeinference_batch.worker.slot_blocks import SlotBlock

_metrics_lock = threading.Lock()
# Requests settled per (metric, model) in this invocation, published per model by the handler
# (`publish_model_counts`): the shared metrics carry only the service dimension, which the
# alarms on them match exactly, so the per-model counts are metrics of their own.
_model_counts: Counter[tuple[str, str]] = Counter()
COMPLETED_BY_MODEL = "RequestsCompletedByModel"
FAILED_BY_MODEL = "RequestsFailedByModel"


def metric(name: str, value: float = 1, unit: str = "Count") -> None:
    # Records run in threads of one invocation, and Powertools' metrics are not thread-safe.
    with _metrics_lock:
        metrics.add_metric(name=name, unit=unit, value=value)


def count_settled(model: str, completed: bool) -> None:
    with _metrics_lock:
        _model_counts[(COMPLETED_BY_MODEL if completed else FAILED_BY_MODEL, model)] += 1


def publish_model_counts() -> None:
    """One EMF record per (metric, model) counted since the last call, with dimensions service and
    model (what the dashboard and `admin status` read)."""
    with _metrics_lock:
        counts = dict(_model_counts)
        _model_counts.clear()
    for (name, model), value in sorted(counts.items()):
        with single_metric(name=name, unit=MetricUnit.Count, value=value, namespace=metrics.namespace,
                           default_dimensions={"service": metrics.service}) as metric_record:
            metric_record.add_dimension(name="model", value=model)


@dataclass
class Done:
    """The message is finished with: delete it."""


@dataclass
class Parked:
    """The message stays: its visibility was set to when it should come back."""

    seconds: float
    # A message that keeps failing unexpectedly must reach the dead-letter queue: never refresh it.
    refresh: bool = True


@dataclass
class Claimed:
    """A request this worker has claimed and is to run."""

    message: RequestMessage
    meta: BatchRecord
    # The request's claim (every write of its run is conditional on it), the chain's run (its
    # `runner`, which outlives the claim: a hand-over passes it on), and the invocation's block
    # that holds the run's two slots (slot_blocks.py), which a hand-over keeps without writing.
    token: str
    run: str
    block: SlotBlock
    # False for a request claimed by a hand-over: the SQS record in hand belongs to an earlier one.
    has_record: bool
    # What the chain's run has settled and not yet counted (store/runs.py).
    tally: Tally
    # The model's batch capacity and backoff as the claim's gates read them (model_backoff.py).
    capacity: int = 0
    backoff: model_backoff.Backoff | None = None
    # The account's quota as the claim's gates read it (gates.py `QuotaReading`): near it, the run
    # counts each request as it settles and reads the owner's usage consistently.
    quota: QuotaReading | None = None


@dataclass
class Leave:
    """A chain leaves the invocation: its next request goes by a message sent `delay_seconds` late.
    `yielded_from` holds the slots items as read when the chain gave its slots to a waiting batch."""

    delay_seconds: int = 0
    yielded_from: list[dict | None] | None = None
