"""store.dynamo.batch_get: at most 100 keys per request, over all tables, unprocessed keys re-asked."""

from __future__ import annotations

from freeinference_batch.core import aws
from freeinference_batch.store import dynamo


class FakeDynamo:
    """Answers BatchGetItem like DynamoDB: refuses > 100 keys; leaves the last 30 keys of each
    request unprocessed once (as it does when an answer would pass 16 MB)."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.held_back: set[str] = set()

    def batch_get_item(self, RequestItems: dict) -> dict:
        keys = [(t, k) for t, spec in RequestItems.items() for k in spec["Keys"]]
        assert len(keys) <= 100, len(keys)
        assert all(spec.get("ConsistentRead") for spec in RequestItems.values())
        self.sizes.append(len(keys))
        answered, unprocessed = keys, []
        if len(keys) > 30 and not self.held_back:
            answered, unprocessed = keys[:-30], keys[-30:]
            self.held_back = {k["pk"]["S"] for _, k in unprocessed}
        responses: dict = {}
        for table, k in answered:
            responses.setdefault(table, []).append({**k, "table": {"S": table}})
        pending: dict = {}
        for table, k in unprocessed:
            pending.setdefault(table, {"Keys": [], "ConsistentRead": True})["Keys"].append(k)
        return {"Responses": responses, "UnprocessedKeys": pending}


def test_batch_get_splits_keys_over_tables_and_follows_unprocessed_keys(monkeypatch):
    fake = FakeDynamo()
    monkeypatch.setattr(aws, "dynamodb", lambda: fake)
    requests = {
        "a": {"Keys": [dynamo.key(f"A#{i}", "X") for i in range(130)], "ConsistentRead": True},
        "b": {"Keys": [dynamo.key(f"B#{i}", "X") for i in range(95)], "ConsistentRead": True},
    }
    found = dynamo.batch_get(requests)
    assert sorted(i["pk"] for i in found["a"]) == sorted(f"A#{i}" for i in range(130))
    assert sorted(i["pk"] for i in found["b"]) == sorted(f"B#{i}" for i in range(95))
    assert all(i["table"] == "a" for i in found["a"]) and all(i["table"] == "b" for i in found["b"])
    assert max(fake.sizes) == 100 and sum(fake.sizes) == 225 + 30  # the held-back keys asked again
