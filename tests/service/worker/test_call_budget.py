"""How long one upstream call may run (call_budget.py): `min(timeout, left - settle)`, the most a
call may run, and when a chain hands over. Pure arithmetic, no AWS, no waiting."""

from __future__ import annotations

import pytest
from freeinference_batch.core.settings import Settings
from freeinference_batch.worker.call_budget import Invocation, call_budget, longest_call, may_hand_over

LAMBDA_CEILING = 900.0  # the workers' Timeout in model/template.yaml


def settings(**env: str) -> Settings:
    return Settings(**env)  # type: ignore[arg-type]


@pytest.mark.parametrize(("timeout", "settle", "left", "seconds", "cut"), [
    (600, 30, 900, 600, False),   # a fresh invocation: the whole timeout
    (600, 30, 630, 600, False),   # just enough left
    (600, 30, 400, 370, True),    # late in the invocation: what it has left, less the settle time
    (600, 30, 150, 120, True),
    (600, 30, 20, 0, True),       # nothing left: never negative
    (5, 1, 4, 3, True),           # short values, as the integration tests use
    (2, 1, 4, 2, False),
])
def test_a_call_gets_the_timeout_or_what_the_invocation_has_left_less_the_settle_time(
        timeout, settle, left, seconds, cut):
    # Given the timeout, the settle time and an invocation of 900 s whose `left` seconds remain
    config = settings(BATCH_UPSTREAM_TIMEOUT_SECONDS=str(timeout), BATCH_SETTLE_SECONDS=str(settle))
    invocation = Invocation(deadline=1000.0 + left, seconds=LAMBDA_CEILING if timeout > 100 else 6)
    # When a call starts now
    budget = call_budget(config, invocation, now=1000.0)
    # Then it may run min(timeout, left - settle), and it is cut when that is short of the most a call may run
    assert budget.seconds == pytest.approx(seconds)
    assert budget.cut is cut


def test_the_most_a_call_may_run_is_the_timeout_or_what_a_fresh_invocation_leaves():
    # Keeping the settle time at both ends: 900 - 2 x 30 = 840 s at most, whatever the timeout
    assert longest_call(settings(BATCH_UPSTREAM_TIMEOUT_SECONDS="600"), LAMBDA_CEILING) == 600
    assert longest_call(settings(BATCH_UPSTREAM_TIMEOUT_SECONDS="900"), LAMBDA_CEILING) == 840
    # An invocation too short for the settle time still gives its calls something (no call is cut forever)
    assert longest_call(settings(BATCH_SETTLE_SECONDS="30"), 30) == 10
    # Without an invocation (a direct call), the timeout
    assert longest_call(settings(), None) == 600
    assert call_budget(settings(), None, now=0.0).seconds == 600 and not call_budget(settings(), None, 0.0).cut


def test_the_default_stack_runs_an_answer_of_several_minutes_in_one_call():
    # Given the defaults (what the template deploys) and a fresh worker invocation of Lambda's 900 s
    config = settings()
    assert config.batch_upstream_timeout_seconds == 600
    budget = call_budget(config, Invocation(deadline=900.0, seconds=LAMBDA_CEILING), now=0.5)
    # Then a 150 s answer ([sim:latency=150]) fits in its first call, uncut, as would 599 s
    assert budget.seconds == 600 and not budget.cut
    assert budget.seconds > 150


def test_chains_hand_over_as_long_as_they_did_with_the_120_s_timeout():
    # Before: a chain ran its next request while more than timeout + 30 s (150 s) was left
    config = settings()
    fresh = Invocation(deadline=900.0, seconds=LAMBDA_CEILING)
    assert may_hand_over(config, fresh, now=900.0 - 150)
    assert not may_hand_over(config, fresh, now=900.0 - 149)
    # A short timeout hands over while one whole call fits, as before (timeout + settle)
    short = settings(BATCH_UPSTREAM_TIMEOUT_SECONDS="2")
    assert may_hand_over(short, fresh, now=900.0 - 32)
    assert not may_hand_over(short, fresh, now=900.0 - 31.9)
    # No invocation (a message run on its own): never
    assert not may_hand_over(config, None, now=0.0)


def test_leases_follow_the_timeout():
    # A running request's lease outlasts the longest call and its settle; the chain's slots twice that
    config = settings()
    assert config.lease_seconds == 660 and config.slot_lease_seconds == 1320
    assert settings(BATCH_UPSTREAM_TIMEOUT_SECONDS="120").lease_seconds == 180
