"""A run re-checks its batch's owner, on moto: once the creating key is revoked the batch fails
`owner_unauthorized` (after the sweep recovers a run that died meanwhile) and its counts never
change afterwards; a model the owner's tier may no longer use fails `model_not_found` without an
upstream call.
"""

from __future__ import annotations

import json

import pytest
from freeinference_batch import accounts
from freeinference_batch.core.catalog import load_catalog
from freeinference_batch.ops import schedules
from freeinference_batch.worker import Done, Worker
from freeinference_batch.worker import upstream as upstream_client

from tests.conftest import sample_request
from tests.service.worker.helpers import (
    ACCOUNT,
    MODEL,
    NO_RECORD,
    WorkerDied,
    expire_leases,
    message_for,
    meta_of,
    results_by_id,
)


def test_a_failed_batch_recovers_a_dead_run_and_its_counts_never_change(harness, monkeypatch):
    # Given a batch whose first request runs on a worker that dies mid-run
    batch = harness.create([sample_request("q-0", "Dies"), sample_request("q-1", "Waits")])

    def dying_call(*args, **kwargs):
        raise WorkerDied

    monkeypatch.setattr(upstream_client, "call", dying_call)
    with pytest.raises(WorkerDied):
        Worker(harness.settings).process(message_for(harness, batch["id"], 0), NO_RECORD)
    # When the key that created it is revoked, and the second request meets the owner check
    assert accounts.revoke_key(harness.settings, harness.key)
    assert isinstance(Worker(harness.settings).process(message_for(harness, batch["id"], 1), NO_RECORD), Done)
    # Then the batch does not take a final status while a request runs...
    assert meta_of(harness, batch["id"]).status == "in_progress"
    # ...the sweep takes the dead run back once its lease ends, and the batch fails
    expire_leases(harness)
    swept = schedules.sweep(harness.settings)
    assert swept["recovered"] == 1 and swept["resent"] == 0 and swept["finalized"] == 1
    reader = accounts.create_key(harness.settings, "acct-1")
    final = _batch(harness, batch["id"], reader)
    assert final["status"] == "failed" and final["error"]["code"] == "owner_unauthorized"
    assert final["request_counts"] == {"total": 2, "completed": 0, "failed": 2}
    lines = _results(harness, batch["id"], reader)
    assert [line["error"]["code"] for line in lines] == ["batch_failed", "batch_failed"]
    # And nothing changes afterwards
    schedules.sweep(harness.settings)
    schedules.expire(harness.settings)
    assert _batch(harness, batch["id"], reader) == final


def _batch(harness, batch_id: str, key: str) -> dict:
    status, body = harness.call("GET", f"/v1/batches/{batch_id}", key=key)
    assert status == 200, body
    return body


def _results(harness, batch_id: str, key: str) -> list[dict]:
    status, page = harness.call("GET", f"/v1/batches/{batch_id}/results", key=key)
    assert status == 200, page
    return page["data"]


def test_a_model_the_owners_tier_may_no_longer_use_fails_model_not_found_without_an_upstream_call(
        harness, stub, tmp_path):
    # Given a catalog where a second tier may batch but may not use glm-5.3-flash, and a batch of
    # the internal tier on both models
    catalog = json.loads(load_catalog().model_dump_json())
    catalog["batch_tiers"] = ["internal", "partner"]
    catalog["models"][MODEL]["tiers"] = ["internal"]
    catalog["models"]["qwen3.6-35b"]["tiers"] = ["internal", "partner"]
    path = tmp_path / "models.json"
    path.write_text(json.dumps(catalog))
    harness.configure(MODEL_CATALOG_PATH=str(path))
    stub.answer = json.dumps({"object": "chat.completion", "choices": [], "usage": {}}).encode()
    batch = harness.create([sample_request("q-1"), sample_request("q-2", model="qwen3.6-35b")])
    # When the account's tier changes mid-batch
    accounts.set_account(harness.settings, ACCOUNT, tier="partner")
    # Then the request on the model the tier may no longer use fails model_not_found, as the spec
    # words it, without reaching the upstream; the other one runs
    assert isinstance(Worker(harness.settings).process(message_for(harness, batch["id"], 0), NO_RECORD), Done)
    assert stub.received == []
    assert isinstance(Worker(harness.settings).process(
        message_for(harness, batch["id"], 1, model="qwen3.6-35b"), NO_RECORD), Done)
    lines = results_by_id(harness, batch["id"])
    assert lines["q-1"]["status"] == "failed"
    assert lines["q-1"]["error"] == {"code": "model_not_found", "message": "Model 'glm-5.3-flash' not found",
                                     "status": 404}
    assert lines["q-2"]["status"] == "completed" and len(stub.received) == 1
    assert harness.batch(batch["id"])["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
