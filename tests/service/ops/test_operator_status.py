"""The operator status's arithmetic: a chain's backlog and the drain time."""

from freeinference_batch.ops.operator_status import chain_backlog, drain_seconds


def test_a_chains_backlog_counts_its_own_positions_from_its_head():
    # A lane of 10 requests on 4 chains: chain 1 runs 1, 5, 9
    assert chain_backlog(10, 4, 1, 1) == 3
    assert chain_backlog(10, 4, 1, 5) == 2
    assert chain_backlog(10, 4, 1, 9) == 1
    assert chain_backlog(10, 4, 1, 13) == 0
    assert sum(chain_backlog(10, 4, chain, chain) for chain in range(4)) == 10


def test_the_drain_time_is_the_backlog_over_the_last_five_minutes_rate():
    assert drain_seconds(0, 0, 0) == 0.0
    assert drain_seconds(100, 0, 0) is None  # nothing settled lately: no estimate
    assert drain_seconds(600, 250, 50) == 600.0  # 300 in 300 s: one a second
