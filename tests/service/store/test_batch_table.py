"""The batch table's own counter (store/batch_table.py) on moto, on AWS's bad days: a result-id
reservation whose answer was lost, so that botocore sent it again."""

from __future__ import annotations

from freeinference_batch.core import aws
from freeinference_batch.store.batch_table import BatchTable


def test_reserving_result_ids_again_whose_first_answer_was_lost_reserves_one_block(harness, monkeypatch):
    table = BatchTable(harness.settings)
    first = table.reserve_result_ids(3)
    # When a reservation is applied, its answer lost, and botocore sends it again
    client = aws.dynamodb()
    real = client.update_item

    def applied_then_resent(**kwargs):
        real(**kwargs)
        return real(**kwargs)

    monkeypatch.setattr(client, "update_item", applied_then_resent)
    second = table.reserve_result_ids(5)
    monkeypatch.undo()
    # Then it answers the block it reserved, once: the next one follows it without a gap
    assert second == first + 3
    assert table.reserve_result_ids(2) == second + 5
