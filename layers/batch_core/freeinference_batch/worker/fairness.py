"""Who gets a model's (or an account's) slots while batches wait: the engine's turn-taking
policy, read from a slots item as `store/leases.py` keeps it, and testable without AWS.

All the chains of a batch read the same item and so agree on which of them give a slot up
(`keeps_slot`: aged chains first, then the others, blocks in order, lowest lanes first in each),
instead of each yielding on its own. What an item holds is counted in slots, not entries: an
entry is a worker invocation's block of a batch's slots (store/leases.py).
"""

from __future__ import annotations

import math
from collections import Counter

from freeinference_batch.store.leases import Waiter, entry_aged, entry_slots, waiters_of
from freeinference_batch.worker.slot_blocks import holder_batch

# A batch with at most this many requests left takes the slots it can use ahead of bigger ones:
# it is over in a few request times.
SMALL_BATCH_REQUESTS = 100
# A chain that waited this long for a slot has waited its turn: once it holds a slot, its batch
# keeps one ahead of small batches (its claim token is marked aged, and the mark passes along
# the chain's hand-overs). Without this, small batches streaming in one after another would
# hold a big batch back indefinitely; with it, a small batch behind a big one still takes every
# slot it can use for the few seconds it needs.
AGING_SECONDS = 10.0


def waited_its_turn(waited_seconds: float) -> bool:
    return waited_seconds >= AGING_SECONDS


def held_by(item: dict | None, batch_id: str) -> int:
    """How many of the item's slots the batch's requests hold."""
    prefix = f"{batch_id}."
    return sum(entry_slots(entry) for holder, entry in (item or {}).get("leases", {}).items()
               if holder.startswith(prefix))


def rank(waiter: Waiter, item: dict | None) -> tuple[bool, float, float]:
    """Who is woken first: batches holding none of the slots, longest waiting first (so none
    waits forever behind newer ones); then, among batches holding some, the fewest requests left."""
    if held_by(item, waiter.batch_id) == 0:
        return False, waiter.since, waiter.remaining
    return True, waiter.remaining, waiter.since


def live_waiters(item: dict | None, now: float) -> list[Waiter]:
    """The item's unexpired waiters, best first."""
    return sorted(waiters_of(item, now), key=lambda waiter: rank(waiter, item))


def fair_shares(item: dict | None, capacity: int, batch_id: str, remaining: int, now: float) -> dict[str, int]:
    """How many slots the given batch and each waiting batch should hold, from what the item shows.

    Batches that hold slots and have no waiter are left out (their own chains decide for them),
    and their slots with them. Of the rest, a batch holding a slot through a chain that waited
    its turn (an aged token) keeps one: so a batch always gets back in, however many small
    batches stream in after it (with k batches taking turns, each keeps about one k-th of a
    model of k slots). Then small batches (at most SMALL_BATCH_REQUESTS left), fewest left first,
    get as many slots as they have chains: they are over in a few request times. Then every
    other batch holding a slot keeps one, each waiting batch holding none gets one (longest
    waiting first), and the slots left go to the fewest requests left, up to as many chains as
    each has running or waiting."""
    leases = (item or {}).get("leases", {})
    holders: Counter[str] = Counter()
    for holder, entry in leases.items():
        holders[holder_batch(holder)] += entry_slots(entry)
    aged = {holder_batch(h) for h, entry in leases.items() if entry_aged(entry)}
    waiters = live_waiters(item, now)
    waiting = Counter(w.batch_id for w in waiters)
    waiting_since: dict[str, float] = {}
    for waiter in waiters:
        waiting_since[waiter.batch_id] = min(waiter.since, waiting_since.get(waiter.batch_id, math.inf))
    left = {w.batch_id: w.remaining for w in waiters}
    left[batch_id] = remaining
    wants = {b: holders[b] + waiting[b] for b in left}
    free = capacity - sum(n for b, n in holders.items() if b not in left)
    order = sorted(left, key=lambda b: (left[b], b))
    shares = dict.fromkeys(order, 0)

    def give(batch: str, up_to: int) -> None:
        nonlocal free
        more = min(free, up_to - shares[batch])
        if more > 0:
            shares[batch], free = shares[batch] + more, free - more

    for batch in order:
        if batch in aged:
            give(batch, 1)
    for batch in order:
        if left[batch] <= SMALL_BATCH_REQUESTS:
            give(batch, wants[batch])
    for batch in order:
        if holders[batch] > 0:
            give(batch, 1)
    for batch in sorted(order, key=lambda b: (waiting_since.get(b, math.inf), left[b], b)):
        if holders[batch] == 0:
            give(batch, min(1, wants[batch]))
    for batch in order:
        give(batch, wants[batch])
    return shares


def keeps_slot(item: dict | None, block: str, rank: int, share: int) -> bool:
    """Whether the run at `rank` of its block (`SlotBlock.rank`: aged runs first, then the lowest
    lanes) is among the `share` of its batch's slots that are kept. The batch's slots are put in
    one order, its blocks taken by name: first every block's aged chains (they waited their turn),
    then every block's others; a run keeps its slot if its place in that order is below the share.
    Every chain of the batch reading the same item so agrees on which `share` of them keep."""
    batch = holder_batch(block)
    leases = (item or {}).get("leases", {})
    blocks = sorted(h for h in leases if holder_batch(h) == batch)
    earlier = [h for h in blocks if h < block]
    own_aged = entry_aged(leases[block]) if block in leases else 0
    if rank < own_aged:
        place = sum(entry_aged(leases[h]) for h in earlier) + rank
    else:
        all_aged = sum(entry_aged(leases[h]) for h in blocks)
        place = all_aged + sum(entry_slots(leases[h]) - entry_aged(leases[h]) for h in earlier) + rank - own_aged
    return place < share
