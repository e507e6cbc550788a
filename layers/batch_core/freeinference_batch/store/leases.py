"""Concurrency slots as leases, kept in the accounts table beside what the interactive gateway
writes: `MODEL#<id>/HELD_SLOTS` (the model's batch slots) and `ACCOUNT#<id>/HELD_SLOTS` (the
account's concurrent-request slots, shared with its interactive traffic). Before blocks they were
`.../SLOTS`, of another form: the new form is in new items, so that writers of the two forms
never meet in one item during a deploy (docs/ARCHITECTURE.md, "Slots items", the migration).

The item's form (docs/ARCHITECTURE.md, "Slots items", with the gateway's side and the migration):
- `held`: how many slots are held, all entries together. Every write that adds or removes a slot
  changes it in the same UpdateItem, and a take is conditional on it (`held <= capacity - 1`):
  the size of the map no longer says how many slots are held.
- `leases`: one entry per holder. A number is one slot until that expiry (what the interactive
  gateway writes: one entry per interactive request). A map `{n, u, a}` is a block: `n` slots held
  by one worker invocation for one batch until `u`, `a` of them by chains that waited their turn
  (fairness.py). So at 500 batch requests in flight the map holds a few dozen blocks, not 500
  entries: the item stays near 2 KB instead of 31 KB, and every claim reads it and every take and
  release writes it whole.
- `waiters`: chains that found the slots full, each with the receipt handle of its parked
  message. Whoever frees a slot without taking it again makes the best waiter's message visible
  at once. Who is best, and how many slots each batch should hold while others wait, is the
  engine's policy (`fairness.py`).

A block is the invocation's (`SlotBlock`, one per batch in a `SlotBlocks` per invocation): its
chains take and give back slots one at a time through it, each a compare-and-set on the block's
own `n` (only its invocation writes it), so a write that botocore sent again after its answer was
lost is told apart from a refusal by one consistent read of the entry. Nothing is ever written in
a transaction (DynamoDB bills a transaction's writes twice, and transactions on these items would
conflict with each other). A block's expiry never outlives its invocation by more than
`BLOCK_MARGIN_SECONDS`: an invocation that dies (killed, timed out) leaves a block that simply
expires, and whoever next finds the slots full reaps it.
"""

from __future__ import annotations

import math
import secrets
import threading
from dataclasses import dataclass, field

from botocore.exceptions import ClientError

from freeinference_batch.core import aws, clock
from freeinference_batch.core.observability import logger
from freeinference_batch.core.settings import Settings
from freeinference_batch.store.dynamo import from_item, is_conditional_failure, key, values

# The slots items' sort key (`SLOTS` held the form before blocks: one entry per slot, no count).
SLOTS_SORT_KEY = "HELD_SLOTS"


def model_slots_key(model: str) -> dict:
    return key(f"MODEL#{model}", SLOTS_SORT_KEY)


def account_slots_key(account_id: str) -> dict:
    return key(f"ACCOUNT#{account_id}", SLOTS_SORT_KEY)


def chain_slots_keys(model: str, account_id: str) -> list[dict]:
    """The two slots items a chain's run holds one slot of: its model's and its account's."""
    return [model_slots_key(model), account_slots_key(account_id)]


def model_load_key(model: str) -> dict:
    return key(f"MODEL#{model}", "LOAD")


def slots_name(slots_key: dict) -> str:
    return slots_key["pk"]["S"]


# Bounds the slots item (every gate read carries it): beyond this, waiters just park longer.
MAX_WAITERS = 32

AGED_MARK = ".a"  # short, as the random part: see HOLDER_RANDOM_BYTES

# A run's (and a block's) random part tells apart two holds of one chain (or batch) that overlap:
# a dead one's until it expires, and the next one's. 32 bits make a clash one in four billion.
HOLDER_RANDOM_BYTES = 4
# Expiries are kept to the hundredth of a second: 12 digits, 7 bytes of a DynamoDB number.
EXPIRY_DECIMALS = 2
# A block expires this long after its invocation's end at the latest: Lambda has killed it by
# then, and the margin covers clocks that differ between hosts.
BLOCK_MARGIN_SECONDS = 60.0


def new_run(batch_id: str, lane: int, aged: bool = False) -> str:
    """A chain's run: `<batch id>.<lane>.<random>`, marked `.a` for a chain that waited its turn
    (see fairness.py). It is the chain's `runner` and its requests' `slot_holder`; the slots
    themselves are held by its invocation's block for the batch."""
    return f"{batch_id}.{lane}.{secrets.token_hex(HOLDER_RANDOM_BYTES)}{AGED_MARK if aged else ''}"


def new_block_holder(batch_id: str) -> str:
    """A block's entry name: `<batch id>.<random>`."""
    return f"{batch_id}.{secrets.token_hex(HOLDER_RANDOM_BYTES)}"


def lease_expiry(until: float) -> float:
    """An expiry as a slots item stores it (rounded up: a lease never ends before it was asked to)."""
    return math.ceil(until * 10**EXPIRY_DECIMALS) / 10**EXPIRY_DECIMALS


def is_aged(holder: str) -> bool:
    return holder.endswith(AGED_MARK)


def holder_batch(holder: str) -> str:
    return holder.split(".", 1)[0]


def holder_lane(holder: str) -> float:
    lane = holder.split(".")[1] if holder.count(".") >= 2 else ""
    return int(lane) if lane.isdigit() else math.inf  # not a batch chain's run: ranks last


def entry_slots(entry: object) -> int:
    """How many slots an entry of `leases` holds: a block's `n`, or one."""
    return int(entry["n"]) if isinstance(entry, dict) else 1


def entry_expiry(entry: object) -> float:
    return float(entry["u"]) if isinstance(entry, dict) else float(entry)  # type: ignore[arg-type]


def entry_aged(entry: object) -> int:
    """How many of an entry's slots are held by chains that waited their turn."""
    return int(entry.get("a", 0)) if isinstance(entry, dict) else 0


def slots_held(item: dict | None) -> int:
    """The slots the item says are held (its `held` counter; none before its first write)."""
    return int((item or {}).get("held", 0))


def live_slots(item: dict | None, now: float) -> int:
    """The slots held by entries that have not expired (an operator's figure: `admin status`)."""
    return sum(entry_slots(e) for e in (item or {}).get("leases", {}).values() if entry_expiry(e) > now)


@dataclass
class SlotBlock:
    """One worker invocation's hold on one batch's slots: an entry of each slots item, `n` slots
    each, shared by the invocation's chains of that batch. Its writes take `lock`: only this
    invocation writes its entries, so each write is a compare-and-set on the `n` it last wrote."""

    holder: str
    # When the invocation ends (the clock's time); None without a deadline (tests, a record
    # handled alone), where renewals alone keep the block.
    ends_at: float | None
    slot_lease_seconds: float
    # Slots item (its pk) -> the slots the block holds there; None after a write whose outcome is
    # unknown (an error after botocore's retries: applied or not), read again before the next.
    counts: dict[str, int | None] = field(default_factory=dict)
    expiries: dict[str, float] = field(default_factory=dict)  # slots item -> the entry's `u` as written
    keys: dict[str, dict] = field(default_factory=dict)
    runs: dict[str, bool] = field(default_factory=dict)  # the chains' runs in the block -> aged
    # Its entry of an item expired and was reaped while its chains ran (they were held past the
    # block's expiry): its chains hold nothing and give up at their next hand-over, and the
    # invocation's next claims take a new block (SlotBlocks.for_batch). What its entries still
    # hold elsewhere expires.
    lost: bool = False
    lock: threading.RLock = field(default_factory=threading.RLock)

    def join(self, run: str) -> None:
        with self.lock:
            self.runs[run] = is_aged(run)

    def leave(self, run: str) -> bool:
        """Take the run out of the block; False if it was not in it (it gave its slots back already)."""
        with self.lock:
            return self.runs.pop(run, None) is not None

    def aged(self) -> int:
        with self.lock:
            return sum(self.runs.values())

    def rank(self, run: str) -> int:
        """The run's place among the block's (aged first, then by lane): who keeps its slot when
        the batch holds more than its share (fairness.keeps_slot)."""
        with self.lock:
            order = sorted(self.runs, key=lambda r: (not self.runs[r], holder_lane(r), r))
        return order.index(run) if run in order else len(order)

    def holds(self, slots_key: dict) -> int:
        return self.counts.get(slots_name(slots_key)) or 0

    def until(self, now: float) -> float:
        """The expiry a write of the block's entries sets: a slot lease from now, never past the
        invocation's end (plus the margin), which Lambda does not let the block outlive."""
        until = now + self.slot_lease_seconds
        if self.ends_at is not None:
            until = min(until, self.ends_at + BLOCK_MARGIN_SECONDS)
        return lease_expiry(until)

    def renewal_due(self, slots_key: dict, now: float, lease_seconds: float) -> bool:
        """Whether the entry has less than a request's lease left and a renewal would extend it.
        Where a slot lease outlasts the invocation (the default: twice the upstream timeout + 60 s
        against the worker's 900 s), the entry already lasts as long as the invocation: then the
        block is never renewed."""
        current = self.expiries.get(slots_name(slots_key), 0.0)
        return current - now < lease_seconds and self.until(now) > current


class SlotBlocks:
    """A worker invocation's blocks, one per batch its records belong to."""

    def __init__(self, settings: Settings, ends_at: float | None = None) -> None:
        self.slot_lease_seconds = settings.slot_lease_seconds
        self.ends_at = ends_at
        self._blocks: dict[str, SlotBlock] = {}
        self._lock = threading.Lock()

    def for_batch(self, batch_id: str) -> SlotBlock:
        """The batch's block, a new one if it has none or its block was lost."""
        with self._lock:
            block = self._blocks.get(batch_id)
            if block is None or block.lost:
                block = self._blocks[batch_id] = SlotBlock(new_block_holder(batch_id), self.ends_at,
                                                           self.slot_lease_seconds)
            return block

    def blocks(self) -> list[SlotBlock]:
        with self._lock:
            return list(self._blocks.values())


@dataclass(frozen=True)
class Waiter:
    id: str  # "<batch id>#<chain>": one entry per waiting chain
    batch_id: str
    model: str
    remaining: int  # the batch's unfinished requests when it registered
    handle: str
    until: float
    since: float  # when the chain began to wait (its message was sent)

    def entry(self) -> dict:
        return {"b": self.batch_id, "m": self.model, "r": self.remaining, "h": self.handle, "u": self.until,
                "s": self.since}


def waiters_of(item: dict | None, now: float) -> list[Waiter]:
    """The item's unexpired waiters, in no particular order."""
    return [
        Waiter(id=name, batch_id=e["b"], model=e["m"], remaining=int(e["r"]), handle=e["h"], until=float(e["u"]),
               since=float(e.get("s", e["u"])))
        for name, e in (item or {}).get("waiters", {}).items() if float(e["u"]) > now
    ]


class Leases:
    def __init__(self, settings: Settings) -> None:
        self.table = settings.accounts_table_name
        self.clock_file = settings.clock_offset_file

    def _update(self, slots_key: dict, expression: str, condition: str | None = None, names: dict | None = None,
                **named: object) -> None:
        arguments: dict = {"TableName": self.table, "Key": slots_key, "UpdateExpression": expression}
        if condition:
            arguments["ConditionExpression"] = condition
        if names:
            arguments["ExpressionAttributeNames"] = names
        if named:
            arguments["ExpressionAttributeValues"] = values(**named)
        aws.dynamodb().update_item(**arguments)

    def read(self, slots_key: dict) -> dict | None:
        answer = aws.dynamodb().get_item(TableName=self.table, Key=slots_key, ConsistentRead=True)
        return from_item(answer.get("Item"))

    # ---- a block's writes (the workers')

    def _recount(self, slots_key: dict, block: SlotBlock) -> tuple[int, dict | None]:
        """What the block holds in the item, as a consistent read finds it (after a write that was
        refused, or whose outcome is unknown), and the item. An entry gone near or past the expiry
        the block wrote may have been reaped (a reaper reaps only what has expired, by its own
        clock): the block is taken for lost, and its chains give up. Gone well before it, only the
        block's own give-back removed it."""
        name = slots_name(slots_key)
        block.counts[name] = None  # unknown until the read answers
        item = self.read(slots_key)
        entry = ((item or {}).get("leases") or {}).get(block.holder)
        written = block.expiries.get(name)
        if entry is None and written is not None and written <= clock.now(self.clock_file) + BLOCK_MARGIN_SECONDS:
            block.lost = True
            logger.warning("a slots block may have expired while its chains ran: they give up", extra={"slots": name})
        held = entry_slots(entry) if entry is not None else 0
        block.counts[name] = held
        return held, item

    def take(self, slots_key: dict, block: SlotBlock, capacity: int, now: float,
             stop_waiting: str | None = None) -> bool:
        """One more slot for the block, if the item has one free; `stop_waiting` names the
        claimant's own waiter entry, removed with it. False when the slots are full (or the block
        was lost). An error whose outcome is unknown leaves the block's count to be read again."""
        name = slots_name(slots_key)
        with block.lock:
            block.keys[name] = slots_key
            for _ in range(3):
                old = block.counts.get(name, 0)
                if old is None:
                    old, _ = self._recount(slots_key, block)
                if block.lost:
                    return False
                entry = {"n": old + 1, "u": block.until(now), "a": block.aged()}
                names = {"#holder": block.holder}
                expression = "SET leases.#holder = :entry, held = held + :one"
                if stop_waiting:
                    expression += " REMOVE waiters.#waiter"
                    names["#waiter"] = stop_waiting
                mine = "attribute_not_exists(leases.#holder)" if old == 0 else "leases.#holder.n = :old"
                try:
                    self._update(slots_key, expression, f"{mine} AND held <= :room", names, entry=entry, one=1,
                                 room=capacity - 1, **({"old": old} if old else {}))
                except ClientError as error:
                    if not is_conditional_failure(error):
                        block.counts[name] = None
                        raise
                    held, item = self._recount(slots_key, block)
                    if held == old + 1:
                        pass  # our own write, sent again by botocore after its answer was lost
                    elif item is None or "held" not in item:
                        self.ensure_item(slots_key, item)  # no item yet: make it, then again
                        continue
                    elif held != old or block.lost:
                        continue  # the count was not what the block believed: again from the item's
                    else:
                        return False  # full
                except Exception:
                    block.counts[name] = None
                    raise
                block.counts[name], block.expiries[name] = old + 1, entry["u"]
                return True
            return False

    def give(self, slots_key: dict, block: SlotBlock) -> None:
        """One slot fewer for the block. Never raises: a slot that could not be given back stays
        with the block until its invocation ends (`give_back_leftovers`) or its entry expires,
        which must not stop what the caller does next (count, wake, send the chain's next message)."""
        name = slots_name(slots_key)
        with block.lock:
            try:
                for _ in range(3):
                    old = block.counts.get(name, 0)
                    if old is None:
                        old, _ = self._recount(slots_key, block)
                    if block.lost or old == 0:
                        return
                    names = {"#holder": block.holder}
                    try:
                        if old == 1:
                            self._update(slots_key, "REMOVE leases.#holder SET held = held - :old",
                                         "leases.#holder.n = :old", names, old=old)
                        else:
                            self._update(slots_key,
                                         "SET leases.#holder.n = :n, leases.#holder.a = :a, held = held - :one",
                                         "leases.#holder.n = :old", names, n=old - 1, a=block.aged(), old=old, one=1)
                    except ClientError as error:
                        if not is_conditional_failure(error):
                            raise
                        held, _ = self._recount(slots_key, block)
                        if held != old - 1:
                            continue  # not ours applied: again from the item's count
                    block.counts[name] = old - 1
                    return
            except Exception:
                block.counts[name] = None
                logger.warning("could not give a slot back: its block keeps it", exc_info=True, extra={"slots": name})

    def give_all(self, slots_keys: list[dict], block: SlotBlock, run: str) -> None:
        """A chain's run gives back its slot of each item, once (never raises, see `give`)."""
        if block.leave(run):
            for slots_key in slots_keys:
                self.give(slots_key, block)

    def give_held(self, model: str, account_id: str, block: SlotBlock, run: str) -> None:
        """A chain's run gives back both slots it holds, its model's and its account's (`give_all`)."""
        self.give_all(chain_slots_keys(model, account_id), block, run)

    def give_back_leftovers(self, blocks: SlotBlocks) -> None:
        """At an invocation's end no chain runs: whatever its blocks still hold (a give-back that
        failed) goes back now, one write per item, rather than at the entries' expiry. Never raises."""
        for block in blocks.blocks():
            for name, slots_key in list(block.keys.items()):
                if block.lost or block.counts.get(name) == 0:
                    continue
                try:
                    held, _ = self._recount(slots_key, block)
                    if held:
                        self._update(slots_key, "REMOVE leases.#holder SET held = held - :n", "leases.#holder.n = :n",
                                     {"#holder": block.holder}, n=held)
                        block.counts[name] = 0
                except Exception:
                    logger.warning("could not give a block's slots back: they expire", exc_info=True,
                                   extra={"slots": name})

    def renew(self, slots_key: dict, block: SlotBlock, capacity: int, now: float, lease_seconds: float) -> bool:
        """Extend the block's entry (once per lease, whichever of its chains comes first), unless
        it was reaped (the block is lost) or the capacity has shrunk below what is held: then False."""
        name = slots_name(slots_key)
        with block.lock:
            if block.lost:
                return False
            if not block.renewal_due(slots_key, now, lease_seconds):
                return True  # another chain of the block renewed it
            until = block.until(now)
            try:
                self._update(slots_key, "SET leases.#holder.u = :until",
                             "attribute_exists(leases.#holder) AND held <= :capacity", {"#holder": block.holder},
                             until=until, capacity=capacity)
            except ClientError as error:
                if not is_conditional_failure(error):
                    raise
                self._recount(slots_key, block)  # a reaped entry marks the block lost
                return False
            block.expiries[name] = until
            return True

    # ---- one slot under an entry of its own: the interactive gateway's writes (see the docstring)

    def take_one(self, slots_key: dict, holder: str, capacity: int, until: float) -> bool:
        """What the interactive gateway writes for one of its requests (ARCHITECTURE, "Slots
        items"): an entry `holder -> expiry` and one more `held`. A re-send after a lost answer
        fails its condition and finds the entry its own."""
        until = lease_expiry(until)
        for _ in range(2):
            try:
                self._update(slots_key, "SET leases.#holder = :until, held = held + :one",
                             "attribute_not_exists(leases.#holder) AND held < :capacity", {"#holder": holder},
                             until=until, one=1, capacity=capacity)
                return True
            except ClientError as error:
                if not is_conditional_failure(error):
                    raise
            item = self.read(slots_key)
            if item is not None and "held" in item:
                return item.get("leases", {}).get(holder) == until
            self.ensure_item(slots_key, item)  # no item yet: make it, then again
        return False

    def release_one(self, slots_key: dict, holder: str) -> None:
        """The gateway's release of its entry (a re-send finds it gone and changes nothing)."""
        try:
            self._update(slots_key, "REMOVE leases.#holder SET held = held - :one",
                         "attribute_exists(leases.#holder)", {"#holder": holder}, one=1)
        except ClientError as error:
            if not is_conditional_failure(error):
                raise

    # ---- the item's form, and expired entries

    def ensure_item(self, slots_key: dict, item: dict | None) -> dict:
        """Make sure the item exists, with no entry and nothing held if it did not, and answer it."""
        if item is not None and "held" in item:
            return item
        try:
            self._update(slots_key, "SET leases = if_not_exists(leases, :empty), held = if_not_exists(held, :zero)",
                         "attribute_not_exists(held)", empty={}, zero=0)
        except ClientError as error:
            if not is_conditional_failure(error):
                raise
        return self.read(slots_key) or {}

    def reap(self, slots_key: dict, now: float) -> int:
        """Make sure the slots item exists in its form and drop expired entries; returns how many
        slots are still held (as read now: the item may have changed since the caller read it)."""
        item = self.read(slots_key)
        if item is None or "held" not in item:
            item = self.ensure_item(slots_key, item)
        held = slots_held(item)
        for holder, entry in item.get("leases", {}).items():
            if entry_expiry(entry) > now:
                continue
            slots = entry_slots(entry)
            if isinstance(entry, dict):
                same, named = "leases.#holder.u = :until AND leases.#holder.n = :n", {"until": entry["u"], "n": slots}
            else:
                same, named = "leases.#holder = :until", {"until": entry}
            try:
                self._update(slots_key, "REMOVE leases.#holder SET held = held - :n", same, {"#holder": holder},
                             **{"n": slots, **named})
                held -= slots
            except ClientError as error:
                if not is_conditional_failure(error):
                    raise
                # Renewed since the read, or another reaper was first: either way no slot of ours to count.
        return held

    # ---- waiters

    def add_waiter(self, slots_key: dict, item: dict | None, waiter: Waiter, now: float) -> dict | None:
        """Register a waiting chain (replacing its older entry, dropping expired ones). Answers the
        item as the registration left it (so the caller sees a slot freed meanwhile without
        another read), or None when the list is full."""
        present = (item or {}).get("waiters")
        if present is None:
            try:
                answer = aws.dynamodb().update_item(
                    TableName=self.table, Key=slots_key, UpdateExpression="SET waiters = :waiters",
                    ConditionExpression="attribute_not_exists(waiters)", ReturnValues="ALL_NEW",
                    ExpressionAttributeValues=values(waiters={waiter.id: waiter.entry()}))
                return from_item(answer["Attributes"])
            except ClientError as error:
                if not is_conditional_failure(error):
                    raise
            present = {}  # someone else created it meanwhile: add to it
        live = {w.id for w in waiters_of(item, now)}
        if waiter.id not in live and len(live) >= MAX_WAITERS:
            return None
        expired = [name for name, e in present.items() if float(e["u"]) <= now and name != waiter.id][:20]
        names = {"#waiter": waiter.id, **{f"#x{n}": name for n, name in enumerate(expired)}}
        expression = "SET waiters.#waiter = :entry"
        if expired:
            expression += " REMOVE " + ", ".join(f"waiters.#x{n}" for n in range(len(expired)))
        answer = aws.dynamodb().update_item(
            TableName=self.table, Key=slots_key, UpdateExpression=expression, ReturnValues="ALL_NEW",
            ExpressionAttributeNames=names, ExpressionAttributeValues=values(entry=waiter.entry()))
        return from_item(answer["Attributes"])

    def take_waiter(self, slots_key: dict, waiter: Waiter) -> bool:
        """Remove a waiter to wake it; False if another worker took it first (or it re-registered)."""
        try:
            aws.dynamodb().update_item(
                TableName=self.table, Key=slots_key, UpdateExpression="REMOVE waiters.#waiter",
                ConditionExpression="waiters.#waiter.h = :handle",
                ExpressionAttributeNames={"#waiter": waiter.id}, ExpressionAttributeValues=values(handle=waiter.handle))
            return True
        except ClientError as error:
            if not is_conditional_failure(error):
                raise
            return False

    def holders(self, slots_key: dict) -> dict[str, object]:
        """The item's entries: holder -> expiry (one slot) or block `{n, u, a}`."""
        return (self.read(slots_key) or {}).get("leases", {})
