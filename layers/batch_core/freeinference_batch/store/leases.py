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

A block's writes here are each one conditional UpdateItem: one more slot, one fewer, all of them
given back, its expiry extended. The block itself, what it believes it holds and the
compare-and-set on its `n` that only its invocation writes, is the worker's
(worker/slot_blocks.py). Nothing is ever written in a transaction (DynamoDB bills a transaction's
writes twice, and transactions on these items would conflict with each other).
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

from botocore.exceptions import ClientError

from freeinference_batch.core import aws
from freeinference_batch.core.settings import Settings
from freeinference_batch.store.dynamo import batch_get, from_item, is_conditional_failure, key, refused_item, values

# The slots items' sort key (`SLOTS` held the form before blocks: one entry per slot, no count).
SLOTS_SORT_KEY = "HELD_SLOTS"


def model_slots_key(model: str) -> dict:
    return key(f"MODEL#{model}", SLOTS_SORT_KEY)


def account_slots_key(account_id: str) -> dict:
    return key(f"ACCOUNT#{account_id}", SLOTS_SORT_KEY)


def chain_slots_keys(model: str, account_id: str) -> list[dict]:
    """The two slots items a chain's run holds one slot of: its model's and its account's."""
    return [model_slots_key(model), account_slots_key(account_id)]


def slots_name(slots_key: dict) -> str:
    return slots_key["pk"]["S"]


# Bounds the slots item (every gate read carries it): beyond this, waiters just park longer.
MAX_WAITERS = 32

# Expiries are kept to the hundredth of a second: 12 digits, 7 bytes of a DynamoDB number.
EXPIRY_DECIMALS = 2


def lease_expiry(until: float) -> float:
    """An expiry as a slots item stores it (rounded up: a lease never ends before it was asked to)."""
    return math.ceil(until * 10**EXPIRY_DECIMALS) / 10**EXPIRY_DECIMALS


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
    """The slots items' reads and writes (one conditional UpdateItem each)."""

    def __init__(self, settings: Settings) -> None:
        self.table = settings.accounts_table_name

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

    def _update_if(self, slots_key: dict, expression: str, condition: str, names: dict | None = None,
                   **named: object) -> bool:
        """`_update`, False when its condition does not hold (any other error raises)."""
        try:
            self._update(slots_key, expression, condition, names, **named)
            return True
        except ClientError as error:
            if not is_conditional_failure(error):
                raise
            return False

    def read(self, slots_key: dict) -> dict | None:
        answer = aws.dynamodb().get_item(TableName=self.table, Key=slots_key, ConsistentRead=True)
        return from_item(answer.get("Item"))

    def read_many(self, keys: list[dict]) -> list[dict | None]:
        """Several slots items in one consistent BatchGetItem, in the order of `keys` (None: no item)."""
        found = batch_get({self.table: {"Keys": keys, "ConsistentRead": True}})
        by_key = {(i["pk"], i["sk"]): i for i in found[self.table]}
        return [by_key.get((k["pk"]["S"], k["sk"]["S"])) for k in keys]

    # ---- a block's writes (worker/slot_blocks.py decides them): False when the condition failed

    def add_to_block(self, slots_key: dict, holder: str, entry: dict, old: int, capacity: int,
                     stop_waiting: str | None = None) -> bool:
        """One more slot for the block `holder`: its entry becomes `entry` and `held` one more, only
        while the entry holds `old` slots (none: no entry) and `held` leaves one free under
        `capacity`. `stop_waiting` names the claimant's own waiter entry, removed with it."""
        names = {"#holder": holder}
        expression = "SET leases.#holder = :entry, held = held + :one"
        if stop_waiting:
            expression += " REMOVE waiters.#waiter"
            names["#waiter"] = stop_waiting
        mine = "attribute_not_exists(leases.#holder)" if old == 0 else "leases.#holder.n = :old"
        return self._update_if(slots_key, expression, f"{mine} AND held <= :room", names, entry=entry, one=1,
                               room=capacity - 1, **({"old": old} if old else {}))

    def remove_from_block(self, slots_key: dict, holder: str, old: int, aged: int) -> bool:
        """One slot fewer for the block `holder`, only while its entry holds `old`: the entry goes
        with its last slot, else its `n` and `a` (its slots held by chains that waited) are set."""
        names = {"#holder": holder}
        if old == 1:
            return self._update_if(slots_key, "REMOVE leases.#holder SET held = held - :old",
                                   "leases.#holder.n = :old", names, old=old)
        return self._update_if(slots_key, "SET leases.#holder.n = :n, leases.#holder.a = :a, held = held - :one",
                               "leases.#holder.n = :old", names, n=old - 1, a=aged, old=old, one=1)

    def remove_block(self, slots_key: dict, holder: str, held: int) -> bool:
        """Every slot of the block `holder` given back at once, only while its entry holds `held`."""
        return self._update_if(slots_key, "REMOVE leases.#holder SET held = held - :n", "leases.#holder.n = :n",
                               {"#holder": holder}, n=held)

    def extend_block(self, slots_key: dict, holder: str, until: float, capacity: int) -> bool:
        """The block's entry lasts until `until`: only while it exists (it was not reaped) and no more
        than `capacity` slots are held."""
        return self._update_if(slots_key, "SET leases.#holder.u = :until",
                               "attribute_exists(leases.#holder) AND held <= :capacity", {"#holder": holder},
                               until=until, capacity=capacity)

    # ---- one slot under an entry of its own: the interactive gateway's writes (see the docstring)

    def take_one(self, slots_key: dict, holder: str, capacity: int, until: float) -> bool:
        """What the interactive gateway writes for one of its requests (ARCHITECTURE, "Slots
        items"): an entry `holder -> expiry` and one more `held`. A re-send after a lost answer
        fails its condition and finds the entry its own."""
        until = lease_expiry(until)
        for _ in range(2):
            if self._update_if(slots_key, "SET leases.#holder = :until, held = held + :one",
                               "attribute_not_exists(leases.#holder) AND held < :capacity", {"#holder": holder},
                               until=until, one=1, capacity=capacity):
                return True
            item = self.read(slots_key)
            if item is not None and "held" in item:
                return item.get("leases", {}).get(holder) == until
            self.ensure_item(slots_key, item)  # no item yet: make it, then again
        return False

    def release_one(self, slots_key: dict, holder: str) -> None:
        """The gateway's release of its entry (a re-send finds it gone and changes nothing)."""
        self._update_if(slots_key, "REMOVE leases.#holder SET held = held - :one", "attribute_exists(leases.#holder)",
                        {"#holder": holder}, one=1)

    # ---- the item's form, and expired entries

    def ensure_item(self, slots_key: dict, item: dict | None) -> dict:
        """Make sure the item exists, with no entry and nothing held if it did not, and answer it."""
        if item is not None and "held" in item:
            return item
        self._update_if(slots_key, "SET leases = if_not_exists(leases, :empty), held = if_not_exists(held, :zero)",
                        "attribute_not_exists(held)", empty={}, zero=0)
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
            if self._update_if(slots_key, "REMOVE leases.#holder SET held = held - :n", same, {"#holder": holder},
                               **{"n": slots, **named}):
                held -= slots
            # Else renewed since the read, or another reaper was first: either way no slot of ours to count.
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
        """Remove a waiter to wake it; False if another worker took it first (or it re-registered).

        The take leaves a token of its own in `woken` (the item's last take), so that this very
        write, re-sent by botocore after its answer was lost, finds its own earlier success in
        the item its refusal answers, rather than reading as another worker's take and leaving the
        waiter to the end of its park. (Another take on the item between the lost answer and the
        re-send replaces the token: then the waiter waits out its park, as a lost wake does.)"""
        token = secrets.token_hex(8)
        try:
            aws.dynamodb().update_item(
                TableName=self.table, Key=slots_key, UpdateExpression="REMOVE waiters.#waiter SET woken = :token",
                ConditionExpression="waiters.#waiter.h = :handle", ExpressionAttributeNames={"#waiter": waiter.id},
                ExpressionAttributeValues=values(handle=waiter.handle, token=token),
                ReturnValuesOnConditionCheckFailure="ALL_OLD")
        except ClientError as error:
            if not is_conditional_failure(error):
                raise
            found = refused_item(error) if "Item" in error.response else self.read(slots_key)
            return (found or {}).get("woken") == token
        return True

    def holders(self, slots_key: dict) -> dict[str, object]:
        """The item's entries: holder -> expiry (one slot) or block `{n, u, a}`."""
        return (self.read(slots_key) or {}).get("leases", {})
