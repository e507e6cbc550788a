"""Files' items and content on moto: ids, ownership, lines across objects, caps, batch files."""

from __future__ import annotations

import time

import pytest
from freeinference_batch.core import aws
from freeinference_batch.store import files, objects
from freeinference_batch.store.accounts_table import account_item_key
from freeinference_batch.store.dynamo import TransactionConflict, from_item


def _input_file(harness, account: str = "acct-1", *, content: bytes = b'{"a":1}\n{"b":2}\n',
                parts: list[bytes] | None = None, expires_in: int = 3600) -> files.FileRecord:
    now = time.time()
    file_id = files.new_file_id(now)
    keys = []
    for number, part in enumerate(parts or [content]):
        keys.append(f"files/{file_id}/part-{number}")
        objects.put(harness.settings.payload_bucket_name, keys[-1], part)
    record = files.FileRecord(id=file_id, account_id=account, purpose="batch", filename="in.jsonl",
                              bytes=sum(map(len, parts or [content])), created_at=int(now),
                              expires_at=int(now) + expires_in, status="processed", objects=keys)
    files.create_input_file(harness.settings, record, max_files=3, max_bytes=1000)
    return record


def _account(harness, account: str = "acct-1") -> dict:
    answer = aws.dynamodb().get_item(TableName=harness.settings.accounts_table_name,
                                     Key=account_item_key(account), ConsistentRead=True)
    return from_item(answer["Item"])


def test_ids_are_time_ordered_and_unguessable() -> None:
    first, second = files.new_file_id(1_000.0), files.new_file_id(1_000.000001)
    assert first.startswith("file-") and len(first) == 5 + 14 + 18
    assert first < second
    assert files.new_file_id(1_000.0) != first


def test_a_batch_file_id_is_the_same_every_time_and_differs_by_kind() -> None:
    batch_id = "batch_0005f1a2b3c4d5e6f708192a3b4c5d6e7f"
    output = files.batch_file_id(batch_id, "output")
    assert output == files.batch_file_id(batch_id, "output")
    assert output != files.batch_file_id(batch_id, "error")
    assert output.startswith("file-0005f1a2b3c4d5") and len(output) == 37


def test_a_file_is_its_owners_only(harness) -> None:
    record = _input_file(harness)
    assert files.get_file(harness.settings, "acct-1", record.id) == record
    assert files.get_file(harness.settings, "acct-2", record.id) is None
    assert files.get_file(harness.settings, "acct-1", "file-00000000000000000000000000000000") is None
    assert files.get_file(harness.settings, "acct-1", "nonsense") is None


def test_an_expired_file_is_gone(harness) -> None:
    record = _input_file(harness, expires_in=60)
    harness.advance_clock(61)
    assert files.get_file(harness.settings, "acct-1", record.id) is None
    assert files.purge_input_files(harness.settings, time.time() + 61) == 1
    assert "input_files" in _account(harness) and _account(harness)["input_files"] == 0
    assert files.purge_input_files(harness.settings, time.time() + 61) == 0  # its item is gone


def test_an_expired_file_whose_account_stays_busy_is_left_to_the_next_purge(harness, monkeypatch) -> None:
    # Given two expired files, the first of whose give-back meets conflicts past the retries
    busy = _input_file(harness, expires_in=60)
    _input_file(harness, expires_in=60)
    transact = files.transact

    def conflicting(elements):
        if elements[0]["Update"]["Key"] == files.file_key(busy.id):
            raise TransactionConflict(["None", "TransactionConflict"])
        return transact(elements)

    monkeypatch.setattr(files, "transact", conflicting)
    # When the purge runs, then the other expires, and the busy one stays counted, for the next
    assert files.purge_input_files(harness.settings, time.time() + 61) == 1
    assert _account(harness)["input_files"] == 1
    monkeypatch.setattr(files, "transact", transact)
    assert files.purge_input_files(harness.settings, time.time() + 61) == 1
    assert _account(harness)["input_files"] == 0


def test_lines_come_in_order_and_a_line_across_two_objects_is_joined(harness, monkeypatch) -> None:
    monkeypatch.setattr(files, "READ_CHUNK_BYTES", 4)
    record = _input_file(harness, parts=[b'{"a":1}\n{"b"', b':2}\n{"c":3}\n', b'{"d":4}'])
    assert list(files.iter_lines(harness.settings, record)) == [b'{"a":1}', b'{"b":2}', b'{"c":3}', b'{"d":4}']


def test_the_account_counts_its_files_and_bytes_and_refuses_past_the_caps(harness) -> None:
    first = _input_file(harness, content=b"x" * 400)
    _input_file(harness, content=b"y" * 400)
    assert (_account(harness)["input_files"], _account(harness)["input_file_bytes"]) == (2, 800)
    with pytest.raises(files.FileCapReached):  # bytes: 800 + 400 > 1000
        _input_file(harness, content=b"z" * 400)
    assert files.delete_input_file(harness.settings, first, time.time())
    assert not files.delete_input_file(harness.settings, first, time.time())  # given back once
    assert (_account(harness)["input_files"], _account(harness)["input_file_bytes"]) == (1, 400)
    assert files.get_file(harness.settings, "acct-1", first.id) is None
    _input_file(harness, content=b"z" * 10)
    _input_file(harness, content=b"w" * 10)
    with pytest.raises(files.FileCapReached):  # files: 3 already
        _input_file(harness, content=b"v" * 10)


def test_a_deleted_files_objects_are_deleted(harness) -> None:
    record = _input_file(harness)
    files.delete_input_file(harness.settings, record, time.time())
    listed = aws.s3().list_objects_v2(Bucket=harness.settings.payload_bucket_name, Prefix=f"files/{record.id}/")
    assert listed.get("KeyCount", 0) == 0


def test_list_pages_newest_or_oldest_first_by_purpose(harness) -> None:
    made = [_input_file(harness, content=b"{}\n") for _ in range(3)]
    _input_file(harness, "acct-2")
    output = files.register_batch_file(harness.settings, "acct-1", "batch_0005f1a2b3c4d5e6f708192a3b4c5d6e7f",
                                       "output", "k", 1, time.time(), int(time.time()) + 100)
    page, more = files.list_files(harness.settings, "acct-1", purpose="batch", limit=2, after=None, newest_first=True)
    assert [r.id for r in page] == [made[2].id, made[1].id] and more
    page, more = files.list_files(harness.settings, "acct-1", purpose="batch", limit=2, after=made[1].id,
                                  newest_first=True)
    assert [r.id for r in page] == [made[0].id] and not more
    page, more = files.list_files(harness.settings, "acct-1", purpose=None, limit=10, after=None, newest_first=False)
    assert [r.id for r in page] == [output.id, *(r.id for r in made)] and not more


def test_a_batch_file_is_registered_once_not_counted_and_deleted_with_its_batch(harness) -> None:
    batch_id = "batch_0005f1a2b3c4d5e6f708192a3b4c5d6e7f"
    key = files.batch_object_prefix(batch_id) + "output.jsonl"
    objects.put(harness.settings.payload_bucket_name, key, b'{"id":"r1"}\n')
    now = time.time()
    record = files.register_batch_file(harness.settings, "acct-1", batch_id, "output", key, 12, now, int(now) + 10)
    again = files.register_batch_file(harness.settings, "acct-1", batch_id, "output", key, 12, now + 5, int(now) + 10)
    assert again == record
    assert (record.purpose, record.filename, record.expires_at, record.objects, record.batch_id) == (
        "batch_output", f"{batch_id}_output.jsonl", None, [key], batch_id)
    assert files.get_file(harness.settings, "acct-1", record.id) == record
    assert list(files.iter_lines(harness.settings, record)) == [b'{"id":"r1"}']
    assert "input_files" not in _account(harness)  # nothing counted
    files.delete_batch_files(harness.settings, batch_id)
    assert files.get_file(harness.settings, "acct-1", record.id) is None


def test_a_deleted_batch_file_stays_deleted_when_its_writer_runs_again(harness) -> None:
    batch_id = "batch_0005f1a2b3c4d5e6f708192a3b4c5d6e7f"
    now = time.time()
    record = files.register_batch_file(harness.settings, "acct-1", batch_id, "error", "k", 3, now, int(now) + 10)
    files.delete_batch_file(harness.settings, record, now)
    files.register_batch_file(harness.settings, "acct-1", batch_id, "error", "k", 3, now, int(now) + 10)
    assert files.get_file(harness.settings, "acct-1", record.id) is None
