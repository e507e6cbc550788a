"""The gates a request passes before every run, read in one BatchGetItem: the batch, the owner's
key, account settings and day's usage, the model's interactive load, its backoff and both slots items."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from freeinference_batch import accounts
from freeinference_batch.batches import lifecycle
from freeinference_batch.core import clock
from freeinference_batch.core.catalog import Catalog
from freeinference_batch.core.observability import logger
from freeinference_batch.core.schemas import RequestMessage
from freeinference_batch.core.settings import Settings
from freeinference_batch.store import accounts_table
from freeinference_batch.store.batch_keys import meta_key, record_of
from freeinference_batch.store.batch_record import BatchRecord
from freeinference_batch.store.batch_table import BatchTable
from freeinference_batch.store.dynamo import batch_get
from freeinference_batch.store.leases import account_slots_key, model_slots_key
from freeinference_batch.store.runs import FLUSH_EVERY_REQUESTS
from freeinference_batch.worker import model_backoff


@dataclass
class Gates:
    """What the gate read found for one request."""

    meta: BatchRecord | None
    key_item: dict
    account: dict
    usage_nano: int
    load: int
    model_slots: dict | None
    account_slots: dict | None
    backoff: model_backoff.Backoff | None = None
    # The dearest request charged today, to a power of two (accounts_table.peak_of); 0: none yet.
    usage_peak_nano: int = 0
    # Whether the owner's items (the day's usage among them) may be up to OWNER_REUSE_SECONDS old
    # or eventually consistent: read with `reuse_owner`.
    reused: bool = False


@dataclass
class QuotaReading:
    """What a run's gates read of its account's quota, for the hand-over after the next settle to
    judge `near_quota` again with the cost that settle adds, before it claims (settling.py)."""

    usage_nano: int
    quota_nano: int
    concurrency: int
    peak_nano: int

    def near(self, pending_cost: int, run_peak_nano: int) -> bool:
        return near_quota(self.usage_nano + pending_cost, self.quota_nano, self.concurrency,
                          max(self.peak_nano, run_peak_nano))


@dataclass
class Verdict:
    """The gates' answer: `run` with the model's capacity, or why not."""

    kind: str  # run | gone | unauthorized | quota | no_access | no_model
    owner: accounts.OwnerState | None = None
    capacity: int = 0
    # The account could reach its quota with what its chains may hold uncounted and in flight:
    # count exactly (`near_quota`).
    near: bool = False
    quota: QuotaReading | None = None


def slots_as_read(message: RequestMessage, gates: Gates, verdict: Verdict) -> list[tuple[dict, dict | None, int]]:
    """(key, item as the gates read it, capacity) of the model's and the account's slots, in that order."""
    assert verdict.owner is not None
    return [(model_slots_key(message.model), gates.model_slots, verdict.capacity),
            (account_slots_key(message.account_id), gates.account_slots, verdict.owner.concurrency_limit)]


# A chain running on re-reads the owner's key, account and day's usage, and the model's backoff,
# at most this often: they seldom change, while the batch (cancel, expiry, failure), the model's
# interactive load and the slots (capacity, waiters) are read before every run. So a key revoked,
# an account disabled or a quota used up stops each running chain within this long (at most one
# more request per chain at upstream latencies of this much or more), and a cap lowered by
# another worker's overloaded call reaches it within this long plus one request. (Plus the lag of
# an eventually consistent read, usually well under a second; moto, locally, has none.)
OWNER_REUSE_SECONDS = 5.0
# The most requests each of an account's slots may have run and not had counted, by the time a
# chain far from its quota (as read) sees otherwise: a chain holds up to FLUSH_EVERY_REQUESTS
# uncounted or in flight (store/runs.py), and may claim that many more on an owner read up to
# OWNER_REUSE_SECONDS old (calls of at least OWNER_REUSE_SECONDS / FLUSH_EVERY_REQUESTS, 0.21 s).
UNCOUNTED_PER_SLOT = 2 * FLUSH_EVERY_REQUESTS


def near_quota(usage_nano: int, quota_nano: int, concurrency: int, peak_nano: int) -> bool:
    """Whether an account's uncounted and in-flight requests could take its usage to its quota:
    usage + concurrency x UNCOUNTED_PER_SLOT x the dearest request charged today (to the power of
    two above it), at or past the quota. With nothing charged yet today there is no estimate: near."""
    if peak_nano <= 0:
        return True
    dearest = 1 << (peak_nano - 1).bit_length()  # as the usage item keeps it
    return usage_nano + concurrency * UNCOUNTED_PER_SLOT * dearest >= quota_nano


class OwnerReads:
    """The owners' and the models' items as read, for chains running on to reuse for up to
    OWNER_REUSE_SECONDS: one per worker invocation, shared by its chains, so the chains of one
    batch (up to 24 in an invocation) read their owner's items once per OWNER_REUSE_SECONDS
    between them, not each."""

    def __init__(self) -> None:
        self._items: dict[tuple[str, str], tuple[float, dict | None]] = {}
        self._lock = threading.Lock()

    def reusable(self, names: list[tuple[str, str]], now: float) -> list[dict | None] | None:
        """The items by name if each was read less than OWNER_REUSE_SECONDS ago, else None."""
        with self._lock:
            found = [self._items.get(name) for name in names]
        if any(kept is None or now - kept[0] >= OWNER_REUSE_SECONDS for kept in found):
            return None
        return [kept[1] for kept in found if kept is not None]

    def keep(self, items: dict[tuple[str, str], dict | None], now: float) -> None:
        with self._lock:
            self._items.update({name: (now, item) for name, item in items.items()})


class Gatekeeper:
    """Reads and judges a chain's gates. One per chain run (a Worker per record); what it reuses
    between reads is its invocation's (`OwnerReads`)."""

    def __init__(self, settings: Settings, table: BatchTable, catalog: Catalog, owners: OwnerReads) -> None:
        self.settings = settings
        self.table = table
        self.catalog = catalog
        self.owners = owners

    def read(self, message: RequestMessage, now: float, *, reuse_owner: bool = False) -> Gates:
        """All the gates, in one BatchGetItem. `reuse_owner` (a chain running on): the owner's and
        the model's items as its invocation read them up to OWNER_REUSE_SECONDS ago, if it did
        (then only the batch, the model's load and the slots are read), and the accounts table's
        items read eventually consistent, at half the read units: every hand-over reads both slots
        items. What a running chain checks there tolerates a read a moment old (its block holds
        its slots; a lowered cap or a new waiter is acted on at the next hand-over), while the
        batch item stays a consistent read (a cancel stops the chain at once), and a first claim,
        which takes slots, reads everything consistently."""
        account_id, key_hash = message.account_id, message.key_hash
        owner_keys = [accounts_table.key_item_key(key_hash), accounts_table.settings_item_key(account_id),
                      accounts_table.usage_item_key(account_id, clock.utc_day(now)),
                      accounts_table.backoff_item_key(message.model)]
        fresh_keys = [model_slots_key(message.model), account_slots_key(account_id),
                      accounts_table.load_item_key(message.model)]
        names = [(k["pk"]["S"], k["sk"]["S"]) for k in owner_keys]
        kept = self.owners.reusable(names, now) if reuse_owner else None
        accounts_keys = fresh_keys if kept is not None else [*fresh_keys, *owner_keys]
        found = batch_get({
            self.table.name: {"Keys": [meta_key(message.batch_id)], "ConsistentRead": True},
            self.settings.accounts_table_name: {"Keys": accounts_keys, "ConsistentRead": not reuse_owner},
        })
        meta = record_of(found[self.table.name][0] if found[self.table.name] else None)
        by_key = {(i["pk"], i["sk"]): i for i in found[self.settings.accounts_table_name]}
        if kept is None:
            kept = [by_key.get(name) for name in names]
            self.owners.keep(dict(zip(names, kept, strict=True)), now)
        model_slots, account_slots, load = (by_key.get((k["pk"]["S"], k["sk"]["S"])) for k in fresh_keys)
        key_item, account, usage, backoff = kept
        if meta is not None and (meta.account_id != account_id or meta.key_hash != key_hash):
            # Messages are ours, but never trust one over the batch it names.
            logger.error("message owner does not match its batch", extra={"batch_id": message.batch_id})
            meta = None
        return Gates(meta=meta, key_item=key_item or {}, account=account or {},
                     usage_nano=int((usage or {}).get("cost_nano", 0)), load=int((load or {}).get("inflight", 0)),
                     model_slots=model_slots, account_slots=account_slots,
                     backoff=model_backoff.backoff_of(backoff), usage_peak_nano=accounts_table.peak_of(usage),
                     reused=reuse_owner)

    def judge(self, message: RequestMessage, gates: Gates, now: float, pending_cost: int = 0,
              run_peak_nano: int = 0) -> Verdict:
        """The gates, cheapest first. `pending_cost` is usage about to be added by a hand-over, whose
        dearest request cost `run_peak_nano`."""
        meta = gates.meta
        # The batch is gone, no longer starts requests, or its window closed before this one started.
        if meta is None or not lifecycle.starts_requests(meta, now):
            return Verdict("gone")
        # The owner, checked again before every run.
        owner = accounts.judge_owner(self.catalog, meta.account_id, gates.key_item or None,
                                     gates.account or None, gates.usage_nano + pending_cost, now)
        kind = {accounts.OwnerStatus.UNAUTHORIZED: "unauthorized", accounts.OwnerStatus.QUOTA_EXHAUSTED: "quota",
                accounts.OwnerStatus.NO_BATCH_ACCESS: "no_access"}.get(owner.status)
        if kind:
            return Verdict(kind, owner)
        # The model, as the owner's tier may use it now: a model that left the catalog and one the
        # tier lost access to since the create read the same (model_not_found), as at create. The
        # tier is the owner's as read above (at most OWNER_REUSE_SECONDS old): no read of its own.
        model = self.catalog.model_for_tier(message.model, owner.tier)
        if model is None:
            return Verdict("no_model", owner)
        quota = QuotaReading(gates.usage_nano, int(gates.account.get("daily_quota_nano", 0)),
                             owner.concurrency_limit, gates.usage_peak_nano)
        return Verdict("run", owner, model_backoff.capped(model.batch_capacity(gates.load), gates.backoff),
                       quota.near(pending_cost, run_peak_nano), quota)
