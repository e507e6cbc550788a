"""AIMD of a model's batch cap (model_backoff.py), without AWS."""

from freeinference_batch.worker.model_backoff import Backoff, capped, lowered, raised


def test_the_cap_bounds_the_capacity_only_while_backing_off():
    assert capped(8, None) == 8
    assert capped(8, Backoff(cap=3, changed_at=0)) == 3
    assert capped(2, Backoff(cap=3, changed_at=0)) == 2  # interactive load may lower it further


def test_an_overload_halves_the_cap_once_per_cooldown():
    assert lowered(8, None, now=100, cooldown=10) == 4
    assert lowered(8, Backoff(cap=4, changed_at=95), now=100, cooldown=10) is None  # already answered
    assert lowered(8, Backoff(cap=4, changed_at=90), now=100, cooldown=10) == 2
    assert lowered(8, Backoff(cap=1, changed_at=0), now=100, cooldown=10) is None  # one slot stays
    assert lowered(3, None, now=100, cooldown=10) == 1


def test_successes_grow_the_cap_one_slot_per_interval_up_to_the_configured_one():
    assert raised(8, None, now=100, interval=30) is None
    assert raised(8, Backoff(cap=2, changed_at=80), now=100, interval=30) is None
    assert raised(8, Backoff(cap=2, changed_at=70), now=100, interval=30) == 3
    assert raised(8, Backoff(cap=7, changed_at=0), now=100, interval=30) == 8  # the backoff is over
