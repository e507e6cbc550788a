"""`dynamodb.stale_ms`: eventually consistent reads answer from lagging replicas, never staler than
the lag, never for a consistent read; nobody sees the replicas."""

from __future__ import annotations

import time

from tests.local_stack.aws_faults.calls import client, counts, key, table

STALE_MS = 400


def test_an_eventually_consistent_read_may_answer_the_item_as_it_was_within_the_lag_and_never_after(moto):
    endpoint = moto(f"dynamodb.stale_ms={STALE_MS}")
    name = table(endpoint)
    dynamodb = client("dynamodb", endpoint)
    for n in range(30):
        dynamodb.put_item(TableName=name, Item={**key(n), "v": {"N": "1"}})
    _wait_past(time.monotonic() + STALE_MS / 1000)
    stale_answers, written_at = 0, 0.0
    for n in range(30):
        dynamodb.put_item(TableName=name, Item={**key(n), "v": {"N": "2"}})
        written_at = time.monotonic()
        eventual = dynamodb.get_item(TableName=name, Key=key(n))["Item"]["v"]["N"]
        assert eventual in ("1", "2")  # an earlier version, never another
        stale_answers += eventual == "1"
        # A consistent read is never stale
        assert dynamodb.get_item(TableName=name, Key=key(n), ConsistentRead=True)["Item"]["v"] == {"N": "2"}
    assert stale_answers >= 5  # the next read came within a few ms; the lag is up to 400 ms
    assert counts(endpoint)["dynamodb.stale_ms"] == stale_answers  # counted: answers that were stale
    _wait_past(written_at + STALE_MS / 1000)
    assert all(dynamodb.get_item(TableName=name, Key=key(n))["Item"]["v"] == {"N": "2"} for n in range(30))
    assert counts(endpoint)["dynamodb.stale_ms"] == stale_answers


def test_index_queries_scans_and_batch_gets_can_be_stale_consistent_ones_never(moto):
    endpoint = moto(f"dynamodb.stale_ms={STALE_MS}")
    name = table(endpoint, index=True)
    dynamodb = client("dynamodb", endpoint)
    missed = {"index": 0, "scan": 0, "batch": 0}
    for n in range(20):
        dynamodb.put_item(TableName=name, Item={**key(n), "g": {"S": f"g{n}"}})
        found = dynamodb.query(TableName=name, IndexName="g-index", KeyConditionExpression="g = :g",
                               ExpressionAttributeValues={":g": {"S": f"g{n}"}})["Items"]
        missed["index"] += not found
        everything = {item["pk"]["S"] for item in dynamodb.scan(TableName=name)["Items"]}
        missed["scan"] += f"k{n}" not in everything
        batch = dynamodb.batch_get_item(RequestItems={name: {"Keys": [key(n)]}})["Responses"][name]
        missed["batch"] += not batch
        assert dynamodb.query(TableName=name, KeyConditionExpression="pk = :k", ConsistentRead=True,
                              ExpressionAttributeValues={":k": key(n)["pk"]})["Items"]
        assert {item["pk"]["S"] for item in dynamodb.scan(TableName=name, ConsistentRead=True)["Items"]} >= {
            f"k{m}" for m in range(n + 1)}
        assert dynamodb.batch_get_item(
            RequestItems={name: {"Keys": [key(n)], "ConsistentRead": True}})["Responses"][name]
    assert all(count >= 3 for count in missed.values()), missed
    # The replicas behind this are moto's business: nobody lists them
    assert client("dynamodb", endpoint).list_tables()["TableNames"].count(name) == 1
    assert not [t for t in client("dynamodb", endpoint, marked=False).list_tables()["TableNames"]
                if t.startswith(name) and t != name]


def _wait_past(moment: float) -> None:
    """Until the monotonic clock passes `moment`: what the lag's bound is stated in."""
    while time.monotonic() <= moment:
        time.sleep(moment - time.monotonic() + 0.001)
