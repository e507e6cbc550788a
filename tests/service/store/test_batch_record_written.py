"""The batch record read from items the service really writes: every attribute of META is a field
of `BatchRecord` or one of the table's key and index attributes, at create and at the end."""

from __future__ import annotations

from freeinference_batch.core import aws
from freeinference_batch.core.schemas import BatchStatus
from freeinference_batch.store.batch_keys import meta_key
from freeinference_batch.store.batch_record import BatchRecord
from freeinference_batch.store.batch_table import BatchTable
from freeinference_batch.store.dynamo import from_item

from tests.conftest import sample_request

# How the table finds a batch (keys of the table and its indexes): deliberately not fields.
KEY_ATTRIBUTES = {"pk", "sk", "created_key", "open_shard", "purge_shard"}


def raw_meta(harness, batch_id: str) -> dict:
    answer = aws.dynamodb().get_item(TableName=harness.settings.batch_table_name, Key=meta_key(batch_id),
                                     ConsistentRead=True)
    item = from_item(answer.get("Item"))
    assert item is not None
    return item


def test_the_record_of_a_new_batch_holds_every_attribute_create_wrote(harness):
    # Given a batch just created, on two models
    batch = harness.create([sample_request("a"), sample_request("b", model="qwen3.6-35b"),
                            sample_request("c")], metadata={"run": "7"})
    # When its item is read as a record
    item = raw_meta(harness, batch["id"])
    record = BatchTable(harness.settings).get_meta(batch["id"])
    # Then every attribute create wrote is a field, or a key the table finds it by
    assert set(item) - set(BatchRecord.model_fields) == KEY_ATTRIBUTES - {"purge_shard"}
    assert record is not None
    assert record.model_dump(exclude_unset=True) == {name: value for name, value in item.items()
                                                     if name not in KEY_ATTRIBUTES}
    # And typed as the code reads it
    assert record.status is BatchStatus.VALIDATING
    assert (record.id, record.total, record.completed, record.failed, record.running) == (batch["id"], 3, 0, 0, 0)
    assert record.lane_widths == {"glm-5.3-flash": 4, "qwen3.6-35b": 4}
    assert record.chunk_starts == [0] and record.metadata == {"run": "7"}
    assert record.owner == record.account_id and record.failing is None and record.purge_at is None


def test_the_record_of_a_finished_batch_holds_every_attribute_its_changes_wrote(harness):
    # Given a batch run to the end
    batch = harness.create([sample_request("a"), sample_request("b")])
    final = harness.run_to_final(batch["id"])
    # When its item is read as a record
    item = raw_meta(harness, batch["id"])
    record = BatchTable(harness.settings).get_meta(batch["id"])
    # Then what the run and the final transition wrote are fields too
    assert set(item) - set(BatchRecord.model_fields) == KEY_ATTRIBUTES - {"open_shard"}
    assert record is not None
    assert record.status is BatchStatus.COMPLETED and record.completed == 2 and record.running == 0
    assert record.in_progress_at == final["in_progress_at"] and record.completed_at == final["completed_at"]
    assert record.finished_at == record.completed_at and record.purge_at is not None
