"""The operator's view of the service now (`freeinference-batch admin status`, and the per-model
gauges the sweep publishes for the dashboard): per model the batch cap after interactive load and
upstream backoff, slots held, requests queued and running, recent completions and failures and the
backlog's drain time; per account its unfinished batches and today's usage against its quota;
and the batches that are waiting, with why (issue 33: a `daily_quota` wait is seen here, as the API
answers the account 429 then).

Everything here is read from the tables except the recent counts, which are the
`RequestsCompletedByModel` / `RequestsFailedByModel` metrics the workers publish: the caller
passes them in (`RecentCounts`), read from CloudWatch (`recent_counts`).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit, single_metric

from freeinference_batch.batches import views
from freeinference_batch.core.catalog import NANO_PER_USD, Catalog, ModelInfo
from freeinference_batch.core.clock import utc_day
from freeinference_batch.core.observability import metrics
from freeinference_batch.core.schemas import FINAL_STATUSES, BatchStatus
from freeinference_batch.core.settings import Settings
from freeinference_batch.store import accounts_table, metric_data
from freeinference_batch.store.batch_keys import batch_id_of
from freeinference_batch.store.batch_table import BatchTable
from freeinference_batch.store.leases import Leases, live_slots, model_slots_key
from freeinference_batch.worker import model_backoff
from freeinference_batch.worker.outcomes import COMPLETED_BY_MODEL, FAILED_BY_MODEL

WINDOWS_MINUTES = (5, 60)
BATCH_CAP_METRIC = "BatchCap"
SLOTS_HELD_METRIC = "SlotsHeld"


@dataclass
class RecentCounts:
    """Requests of one model settled completed / failed in the last 5 and 60 minutes."""

    completed: dict[int, int] = field(default_factory=lambda: dict.fromkeys(WINDOWS_MINUTES, 0))
    failed: dict[int, int] = field(default_factory=lambda: dict.fromkeys(WINDOWS_MINUTES, 0))


@dataclass
class ModelStatus:
    model: str
    batch_cap: int  # what may run now: the catalog's concurrency, after interactive load and backoff
    configured_cap: int
    interactive_inflight: int
    backed_off: bool
    slots_held: int
    requests_queued: int
    requests_running: int
    completed_5m: int
    failed_5m: int
    completed_60m: int
    failed_60m: int
    drain_seconds: float | None  # backlog / the last 5 minutes' completion rate; None at no rate


@dataclass
class AccountStatus:
    account_id: str
    unfinished_batches: int
    usage_usd_today: float
    daily_quota_usd: float | None


@dataclass
class WaitingBatch:
    """An unfinished batch none of whose requests can start now, and why (the batch's `waiting`)."""

    batch_id: str
    account_id: str
    reason: str
    since: int
    message: str


@dataclass
class OperatorStatus:
    at: float
    models: list[ModelStatus]
    accounts: list[AccountStatus]
    waiting: list[WaitingBatch] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def chain_backlog(size: int, width: int, chain: int, head: int) -> int:
    """Requests of chain `chain` (positions chain, chain + width, ...) at or after its head."""
    first = max(head, chain)
    first += (chain - first) % width
    return len(range(first, size, width))


def drain_seconds(backlog: int, completed_5m: int, failed_5m: int) -> float | None:
    """The backlog over the last 5 minutes' rate of settled requests (a failure settles one too)."""
    settled = completed_5m + failed_5m
    if backlog == 0:
        return 0.0
    return backlog / (settled / 300) if settled else None


def model_backlogs(table: BatchTable) -> tuple[Counter[str], Counter[str], list[WaitingBatch]]:
    """Requests not yet settled per model, unfinished batches per account, and the batches waiting
    (longest first), over open batches: their items are read for the backlog anyway."""
    backlog: Counter[str] = Counter()
    unfinished: Counter[str] = Counter()
    waiting: list[WaitingBatch] = []
    open_ids = [batch_id_of(item) for item in table.open_batches()]
    for batch_id, meta in table.get_metas(open_ids).items():
        if meta.status in FINAL_STATUSES or meta.status == BatchStatus.DELETED:
            continue
        unfinished[meta.account_id] += 1
        why = views.waiting(meta)
        if why is not None:
            waiting.append(WaitingBatch(batch_id, meta.account_id, why.reason, why.since, why.message))
        for lane in table.get_lanes(batch_id):
            for chain, head in enumerate(lane["heads"]):
                backlog[lane["model"]] += chain_backlog(int(lane["size"]), int(lane["width"]), chain, int(head))
    return backlog, unfinished, sorted(waiting, key=lambda batch: (batch.since, batch.batch_id))


def _capacity(settings: Settings, leases: Leases, info: ModelInfo, name: str,
              now: float) -> tuple[int, int, int, model_backoff.Backoff | None]:
    """A model's batch cap now (after interactive load and backoff), its slots held, its
    interactive in-flight count and its backoff."""
    load = accounts_table.get_model_load(settings, name) or {}
    inflight = int(load.get("inflight", 0))
    backoff = model_backoff.backoff_of(accounts_table.get_model_backoff(settings, name))
    cap = model_backoff.capped(info.batch_capacity(inflight), backoff)
    held = live_slots(leases.read(model_slots_key(name)), now)
    return cap, held, inflight, backoff


def publish_model_gauges(settings: Settings, catalog: Catalog, now: float) -> dict[str, tuple[int, int]]:
    """`BatchCap` and `SlotsHeld` of every model as metrics (dimensions service and model), so the
    dashboard charts over time what `admin status` shows now; answers (cap, held) per model.
    Three reads a model, once a minute (the expire schedule)."""
    leases = Leases(settings)
    gauges = {}
    for name, info in sorted(catalog.models.items()):
        cap, held, _, _ = _capacity(settings, leases, info, name, now)
        gauges[name] = (cap, held)
        for metric_name, value in ((BATCH_CAP_METRIC, cap), (SLOTS_HELD_METRIC, held)):
            with single_metric(name=metric_name, unit=MetricUnit.Count, value=value, namespace=metrics.namespace,
                               default_dimensions={"service": metrics.service}) as record:
                record.add_dimension(name="model", value=name)
    return gauges


def operator_status(settings: Settings, catalog: Catalog, now: float,
                    recent: dict[str, RecentCounts] | None = None) -> OperatorStatus:
    table = BatchTable(settings)
    leases = Leases(settings)
    backlog, unfinished, waiting = model_backlogs(table)
    models = []
    for name, info in sorted(catalog.models.items()):
        cap, held, inflight, backoff = _capacity(settings, leases, info, name, now)
        counts = (recent or {}).get(name) or RecentCounts()
        # A slot is held by a chain while it runs one request: the requests running are the slots
        # held, and the rest of the backlog waits.
        queued = max(0, backlog[name] - held)
        models.append(ModelStatus(
            model=name, batch_cap=cap, configured_cap=info.batch_concurrency, interactive_inflight=inflight,
            backed_off=backoff is not None and backoff.cap < info.batch_concurrency, slots_held=held,
            requests_queued=queued, requests_running=held,
            completed_5m=counts.completed[5], failed_5m=counts.failed[5],
            completed_60m=counts.completed[60], failed_60m=counts.failed[60],
            drain_seconds=drain_seconds(backlog[name], counts.completed[5], counts.failed[5]),
        ))
    day = utc_day(now)
    accounts = []
    for account_id in sorted(unfinished):
        account, used_nano = accounts_table.get_account_and_usage(settings, account_id, day)
        quota = (account or {}).get("daily_quota_nano")
        accounts.append(AccountStatus(
            account_id=account_id, unfinished_batches=unfinished[account_id],
            usage_usd_today=used_nano / NANO_PER_USD,
            daily_quota_usd=int(quota) / NANO_PER_USD if quota is not None else None,
        ))
    return OperatorStatus(at=now, models=models, accounts=accounts, waiting=waiting)


def recent_counts(models: list[str], now: float) -> dict[str, RecentCounts]:
    """Per model, the `RequestsCompletedByModel` / `RequestsFailedByModel` sums of the last 5 and
    60 minutes, from CloudWatch (one GetMetricData call)."""
    end = dt.datetime.fromtimestamp(now, dt.UTC)
    counts = {model: RecentCounts() for model in models}
    for minutes in WINDOWS_MINUTES:
        series, names = {}, {}
        for index, model in enumerate(models):
            for metric_name in (COMPLETED_BY_MODEL, FAILED_BY_MODEL):
                query_id = f"m{index}{'c' if metric_name == COMPLETED_BY_MODEL else 'f'}"
                names[query_id] = (model, metric_name)
                series[query_id] = (metric_name, {"service": metrics.service, "model": model})
        if not series:
            continue
        for query_id, total in metric_data.sums(metrics.namespace, series, minutes * 60, end).items():
            model, metric_name = names[query_id]
            (counts[model].completed if metric_name == COMPLETED_BY_MODEL else counts[model].failed)[minutes] = total
    return counts
