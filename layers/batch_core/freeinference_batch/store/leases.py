"""Concurrency slots as leases, kept in the accounts table beside what the interactive gateway
writes: `MODEL#<id>/SLOTS` (the model's batch slots) and `ACCOUNT#<id>/SLOTS` (the account's
concurrent-request slots, shared with its interactive traffic).

A slot is an entry `holder -> expiry` in the item's `leases` map; taking one is a conditional
write on the map's size, written alone (never in a transaction, which DynamoDB bills twice: these
are the table's largest hot items). A worker that dies leaves an entry that simply expires:
whoever next finds the slots full reaps expired entries. A holder
is a batch's chain, `<batch id>.<lane>.<random>`, for as long as it runs on in one invocation
(its requests' claims come and go under it: see `Settings.slot_lease_seconds`), so the map also
tells how many slots each batch holds, and which of its lanes hold them.

Beside the leases, the item keeps `waiters`: chains that found the slots full, each with the
receipt handle of its parked message. Whoever frees a slot without taking it again makes the
best waiter's message visible at once, so a freed slot never sits idle for the length of a park.
Who is best, and how many slots each batch should hold while others wait, is the engine's
policy (`fairness.py`); this module only stores and reads the leases and the waiters.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

from botocore.exceptions import ClientError

from freeinference_batch import aws
from freeinference_batch.observability import logger
from freeinference_batch.settings import Settings
from freeinference_batch.store.dynamo import from_item, is_conditional_failure, key, values


def model_slots_key(model: str) -> dict:
    return key(f"MODEL#{model}", "SLOTS")


def account_slots_key(account_id: str) -> dict:
    return key(f"ACCOUNT#{account_id}", "SLOTS")


def model_load_key(model: str) -> dict:
    return key(f"MODEL#{model}", "LOAD")


# Bounds the slots item (every gate read carries it): beyond this, waiters just park longer.
MAX_WAITERS = 32


AGED_MARK = ".a"  # short, as the random part: see HOLDER_RANDOM_BYTES


# A holder's random part tells apart two runs of one chain whose holds overlap (a dead run's until
# it expires, and the next run's): 32 bits make a clash one in four billion. It is short because
# every holder is an entry of the slots items, the table's hottest, which every claim reads and
# every take, renewal and release writes whole: at 500 holders each byte of an entry is 500 bytes
# of every such write (bench/README.md, hot items).
HOLDER_RANDOM_BYTES = 4
# Expiries are kept to the hundredth of a second: 12 digits, 7 bytes of a DynamoDB number.
EXPIRY_DECIMALS = 2


def new_holder(batch_id: str, lane: int, aged: bool = False) -> str:
    """A chain's hold on its slots: `<batch id>.<lane>.<random>`, marked `.a` for a chain that
    waited its turn (see fairness.py)."""
    return f"{batch_id}.{lane}.{secrets.token_hex(HOLDER_RANDOM_BYTES)}{AGED_MARK if aged else ''}"


def lease_expiry(until: float) -> float:
    """An expiry as a slots item stores it (rounded up: a lease never ends before it was asked to)."""
    return math.ceil(until * 10**EXPIRY_DECIMALS) / 10**EXPIRY_DECIMALS


def is_aged(holder: str) -> bool:
    return holder.endswith(AGED_MARK)


def holder_batch(holder: str) -> str:
    return holder.split(".", 1)[0]


def holder_lane(holder: str) -> float:
    lane = holder.split(".")[1] if holder.count(".") >= 2 else ""
    return int(lane) if lane.isdigit() else math.inf  # not a batch chain's token: ranks last


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

    def acquire_element(self, slots_key: dict, holder: str, capacity: int, until: float,
                        stop_waiting: str | None = None) -> dict:
        """Take a slot; `stop_waiting` names the claimant's own waiter entry, removed with it."""
        names = {"#holder": holder}
        expression = "SET leases.#holder = :until"
        if stop_waiting:
            expression += " REMOVE waiters.#waiter"
            names["#waiter"] = stop_waiting
        return {"Update": {
            "TableName": self.table, "Key": slots_key,
            "UpdateExpression": expression,
            # Already ours: a write botocore sent again after its answer was lost succeeds again.
            "ConditionExpression": "attribute_exists(leases.#holder) OR "
                                   "(attribute_exists(leases) AND size(leases) < :capacity)",
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values(until=lease_expiry(until), capacity=capacity),
        }}

    def renew_element(self, slots_key: dict, holder: str, capacity: int, until: float) -> dict:
        """Extend a held slot, unless it was reaped or the capacity has shrunk below the holders."""
        return {"Update": {
            "TableName": self.table, "Key": slots_key,
            "UpdateExpression": "SET leases.#holder = :until",
            "ConditionExpression": "attribute_exists(leases.#holder) AND size(leases) <= :capacity",
            "ExpressionAttributeNames": {"#holder": holder},
            "ExpressionAttributeValues": values(until=lease_expiry(until), capacity=capacity),
        }}

    def release_element(self, slots_key: dict, holder: str) -> dict:
        return {"Update": {
            "TableName": self.table, "Key": slots_key,
            "UpdateExpression": "REMOVE leases.#holder",
            "ExpressionAttributeNames": {"#holder": holder},
        }}

    def release(self, slots_key: dict, holder: str) -> None:
        aws.dynamodb().update_item(**self.release_element(slots_key, holder)["Update"])

    def release_held(self, model: str, account_id: str, holder: str) -> None:
        """Give up both slots a chain holds, the model's and its account's (see `release_all`)."""
        self.release_all([model_slots_key(model), account_slots_key(account_id)], holder)

    def release_all(self, slots_keys: list[dict], holder: str) -> None:
        """Give up the holder's slots, one plain write each (a holder is one run's alone, so
        releasing one already released or reaped changes nothing). Never raises: a release that
        fails leaves a lease that expires, which must not stop what the caller does next (count,
        wake, send the chain's next message)."""
        for slots_key in slots_keys:
            try:
                self.release(slots_key, holder)
            except Exception:
                logger.warning("could not release a slot: it expires", exc_info=True,
                               extra={"slots": slots_key["pk"]["S"]})

    def reap(self, slots_key: dict, now: float) -> int:
        """Make sure the slots item exists and drop expired leases; returns how many are still held
        (as read now: the item may have changed since the caller read it)."""
        answer = aws.dynamodb().get_item(TableName=self.table, Key=slots_key, ConsistentRead=True)
        item = from_item(answer.get("Item"))
        if item is None or "leases" not in item:
            try:
                aws.dynamodb().update_item(
                    TableName=self.table, Key=slots_key, UpdateExpression="SET leases = :empty",
                    ConditionExpression="attribute_not_exists(leases)", ExpressionAttributeValues=values(empty={}),
                )
            except ClientError as error:
                if not is_conditional_failure(error):
                    raise
            return 0
        held = 0
        for holder, until in item["leases"].items():
            if until > now:
                held += 1
                continue
            try:
                aws.dynamodb().update_item(
                    TableName=self.table, Key=slots_key, UpdateExpression="REMOVE leases.#holder",
                    ConditionExpression="leases.#holder = :until",
                    ExpressionAttributeNames={"#holder": holder}, ExpressionAttributeValues=values(until=until),
                )
            except ClientError as error:
                if not is_conditional_failure(error):
                    raise
                held += 1  # renewed (or handed over) since the read: still held
        return held

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

    def holders(self, slots_key: dict) -> dict[str, float]:
        answer = aws.dynamodb().get_item(TableName=self.table, Key=slots_key, ConsistentRead=True)
        item = from_item(answer.get("Item")) or {}
        return item.get("leases", {})
