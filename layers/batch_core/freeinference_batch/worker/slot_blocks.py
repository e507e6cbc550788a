"""A worker invocation's holds on slots: one block per batch in each slots item
(store/leases.py has the item's form and its writes).

A block is the invocation's (`SlotBlock`, one per batch in a `SlotBlocks` per invocation): its
chains take and give back slots one at a time through it, each a compare-and-set on the block's
own `n` (only its invocation writes it), so a write that botocore sent again after its answer was
lost is told apart from a refusal by one consistent read of the entry (`BlockLeases`). A block's
expiry never outlives its invocation by more than `BLOCK_MARGIN_SECONDS`: an invocation that
dies (killed, timed out) leaves a block that simply expires, and whoever next finds the slots
full reaps it.

Holders are named so that fairness.py can read an entry's batch and a run's lane from the name:
a block is `<batch id>.<random>`, a chain's run `<batch id>.<lane>.<random>`, marked `.a` when the
chain waited its turn.
"""

from __future__ import annotations

import math
import secrets
import threading
from dataclasses import dataclass, field

from freeinference_batch.core import clock
from freeinference_batch.core.observability import logger
from freeinference_batch.core.settings import Settings
from freeinference_batch.store.leases import Leases, chain_slots_keys, entry_slots, lease_expiry, slots_name

AGED_MARK = ".a"  # short, as the random part: see HOLDER_RANDOM_BYTES

# A run's (and a block's) random part tells apart two holds of one chain (or batch) that overlap:
# a dead one's until it expires, and the next one's. 32 bits make a clash one in four billion.
HOLDER_RANDOM_BYTES = 4
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


def is_aged(holder: str) -> bool:
    return holder.endswith(AGED_MARK)


def holder_batch(holder: str) -> str:
    return holder.split(".", 1)[0]


def holder_lane(holder: str) -> float:
    lane = holder.split(".")[1] if holder.count(".") >= 2 else ""
    return int(lane) if lane.isdigit() else math.inf  # not a batch chain's run: ranks last


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


class BlockLeases(Leases):
    """The slots items as a worker invocation's blocks use them: each write of a block is
    store/leases.py's, decided here from what the block believes it holds."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.clock_file = settings.clock_offset_file

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
                try:
                    taken = self.add_to_block(slots_key, block.holder, entry, old, capacity, stop_waiting)
                except Exception:
                    block.counts[name] = None
                    raise
                if not taken:
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
                    if not self.remove_from_block(slots_key, block.holder, old, block.aged()):
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
                    if held and self.remove_block(slots_key, block.holder, held):
                        block.counts[name] = 0
                    elif held:
                        logger.warning("could not give a block's slots back: they expire", extra={"slots": name})
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
            if not self.extend_block(slots_key, block.holder, until, capacity):
                self._recount(slots_key, block)  # a reaped entry marks the block lost
                return False
            block.expiries[name] = until
            return True
