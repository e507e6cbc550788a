"""The batch record (`BATCH#<id>` / `META` read as a `BatchRecord`): without AWS, an item as create
wrote it on the wire, items from before or after a field, and an item that is not a batch; on
moto, the items the service really writes, at create and at the end, whose every attribute is a
field of `BatchRecord` or one of the table's key and index attributes."""

from __future__ import annotations

from decimal import Decimal

import pytest
from freeinference_batch.batches import lifecycle, views
from freeinference_batch.core import aws
from freeinference_batch.core.schemas import BatchStatus
from freeinference_batch.store.batch_keys import meta_key, record_of
from freeinference_batch.store.batch_record import BatchRecord
from freeinference_batch.store.batch_table import BatchTable
from freeinference_batch.store.dynamo import from_item
from pydantic import ValidationError

from tests.conftest import sample_request

BATCH_ID = "batch_0661c06624645981aee5cf6aa1916788"
# A META item exactly as create wrote it (two requests on two models, with metadata), in the
# low-level client's wire format: recorded from the integration harness.
CREATED = {
    "account_id": {"S": "acct-1"}, "chunk_starts": {"L": [{"N": "0"}]}, "completed": {"N": "0"},
    "cost_nano": {"N": "0"}, "created_at": {"N": "1796328835"},
    "created_key": {"S": f"01796328835540057#{BATCH_ID}"}, "expires_at": {"N": "1796415235"},
    "failed": {"N": "0"}, "id": {"S": BATCH_ID}, "id_base": {"N": "1000"},
    "key_hash": {"S": "f46fb10111183b5f8797f7335a7322b46ddb4dae2cb2ccb99c0df4ddda9c3099"},
    "lane_widths": {"M": {"glm-5.3-flash": {"N": "4"}, "qwen3.6-35b": {"N": "4"}}},
    "metadata": {"M": {"run": {"S": "7"}}}, "open_shard": {"S": "OPEN"}, "owner": {"S": "acct-1"},
    "pk": {"S": f"BATCH#{BATCH_ID}"}, "running": {"N": "0"}, "sk": {"S": "META"},
    "status": {"S": "validating"}, "total": {"N": "2"}, "ttl": {"N": "1797279235"},
    "window_seconds": {"N": "86400"},
}


def created() -> dict:
    item = from_item(CREATED)
    assert item is not None
    return item


def test_an_item_create_wrote_loads_typed():
    record = record_of(created())
    assert record is not None
    assert record.status is BatchStatus.VALIDATING
    assert (record.id, record.account_id, record.owner) == (BATCH_ID, "acct-1", "acct-1")
    assert (record.total, record.completed, record.failed, record.running, record.cost_nano) == (2, 0, 0, 0, 0)
    assert (record.created_at, record.expires_at, record.window_seconds) == (1796328835, 1796415235, 86400)
    assert (record.id_base, record.chunk_starts, record.ttl) == (1000, [0], 1797279235)
    assert record.lane_widths == {"glm-5.3-flash": 4, "qwen3.6-35b": 4}
    assert record.metadata == {"run": "7"}
    assert record.failing is None and record.error is None and record.purge_at is None
    assert record.in_progress_at is None and record.completed_at is None
    assert all(type(record.lane_widths[m]) is int for m in record.lane_widths)
    assert lifecycle.starts_requests(record, now=1796328836)
    assert views.batch_object(record)["request_counts"] == {"total": 2, "completed": 0, "failed": 0}


def test_no_item_is_no_record():
    assert record_of(None) is None


def test_numbers_as_decimals_load_as_ints():
    # What boto3's own deserializer (and so a resource or a stream record) answers: Decimals.
    item = {**created(), "total": Decimal("2"), "completed": Decimal("1"), "cost_nano": Decimal("1234"),
            "lane_widths": {"glm-5.3-flash": Decimal("4")}, "chunk_starts": [Decimal("0")]}
    record = BatchRecord.model_validate(item)
    assert (record.total, record.completed, record.cost_nano) == (2, 1, 1234)
    assert type(record.total) is int and type(record.lane_widths["glm-5.3-flash"]) is int
    assert record.chunk_starts == [0]


def test_unknown_attributes_are_ignored():
    # An attribute a later version adds (or an old one left) must not break reading the batch.
    record = BatchRecord.model_validate({**created(), "priority": 3, "legacy_flag": {"x": [1, 2]}})
    assert record == BatchRecord.model_validate(created())
    assert not hasattr(record, "priority")


def test_absent_counters_and_later_attributes_read_as_their_absence_means():
    item = {name: value for name, value in created().items()
            if name not in ("completed", "failed", "running", "cost_nano", "metadata")}
    record = BatchRecord.model_validate(item)
    assert (record.completed, record.failed, record.running, record.cost_nano, record.metadata) == (0, 0, 0, 0, None)


def test_a_deleted_batch_loads_without_its_owner_and_index_keys():
    # A delete removes `owner`, `created_key` and `open_shard`: the record must still say it is deleted.
    item = {name: value for name, value in created().items() if name not in ("owner", "created_key", "open_shard")}
    record = BatchRecord.model_validate({**item, "status": "deleted", "deleted_at": 1796330000,
                                         "purge_shard": "PURGE", "purge_at": 1796330000})
    assert record.status is BatchStatus.DELETED and record.owner is None
    assert (record.deleted_at, record.purge_at) == (1796330000, 1796330000)


def test_a_failing_batch_reads_as_one_that_starts_nothing():
    failing = {"code": "owner_unauthorized", "message": "gone"}
    record = BatchRecord.model_validate({**created(), "failing": failing})
    assert record.failing == failing
    assert not lifecycle.starts_requests(record, now=1796328836)


@pytest.mark.parametrize("missing", ["id", "account_id", "status", "total", "lane_widths", "chunk_starts", "ttl"])
def test_an_item_without_a_create_time_field_is_refused_naming_it(missing):
    # Create writes these in one Put and no later write removes them: an item without one is not
    # a batch the code can serve. The read fails there, naming the field (before the record, the
    # first `meta["..."]` of it raised a KeyError somewhere further on).
    item = {name: value for name, value in created().items() if name != missing}
    with pytest.raises(ValidationError) as refused:
        record_of(item)
    assert [error["loc"] for error in refused.value.errors()] == [(missing,)]


def test_a_status_the_service_does_not_know_is_refused():
    with pytest.raises(ValidationError):
        BatchRecord.model_validate({**created(), "status": "paused"})


def test_a_record_is_a_snapshot():
    record = BatchRecord.model_validate(created())
    with pytest.raises(ValidationError):
        record.running = 1  # type: ignore[misc]


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


def test_a_waiting_batch_loads_its_reason_and_shows_it_only_while_it_may_start_requests():
    waiting = {"reason": "model_busy", "message": "Model 'm' is at its batch capacity", "since": Decimal(1796328900)}
    record = BatchRecord.model_validate({**created(), "waiting": waiting})
    assert record.waiting is not None and record.waiting.reason == "model_busy" and record.waiting.since == 1796328900
    assert views.batch_object(record)["waiting"] == {**waiting, "since": 1796328900}
    # An item that kept one past the writes that remove it (a final status, failing) shows none
    for ended in ({"status": "completed"}, {"failing": {"code": "owner_unauthorized", "message": "gone"}}):
        assert views.batch_object(record.model_copy(update=ended))["waiting"] is None
