"""Delete is refused only while a request really runs (issue 30): a batch whose run died (its
running request's lease passed) is deletable before the sweep takes the run back, and what that
run settled without counting is charged to the account, on the day it finished, before the batch
goes. On moto, the run's death simulated as a killed Lambda (nothing cleans up)."""

from __future__ import annotations

import time

import pytest
from freeinference_batch.core import clock
from freeinference_batch.store import accounts_table
from freeinference_batch.worker import Worker
from freeinference_batch.worker import upstream as upstream_client

from tests.conftest import sample_request
from tests.service.worker.helpers import (
    ACCOUNT,
    NO_RECORD,
    TIME_LEFT,
    WorkerDied,
    message_for,
    meta_of,
    now,
    one_cost,
    state_of,
)

DAY = 86400


def usage_on(harness, day: str) -> int:
    _, usage = accounts_table.get_account_and_usage(harness.settings, ACCOUNT, day)
    return usage


def test_a_batch_whose_run_died_is_deleted_its_uncounted_requests_charged_to_their_day(harness, upstream, monkeypatch):
    # Given noon UTC by the service's clock (so the leases below pass within the day)
    harness.advance_clock((DAY / 2 - now(harness) % DAY) % DAY)
    # And a batch of 4 chains of 2, whose chain 0 settles request 0 and then dies in request 4's call
    contents = [f"Request {n}" for n in range(8)]
    contents[4] = "Dies in its call"
    batch = harness.create([sample_request(f"q-{n}", text) for n, text in enumerate(contents)])
    real_call = upstream_client.call

    def dying_call(settings, body, **kwargs):
        if b"Dies in its call" in body:
            raise WorkerDied
        return real_call(settings, body, **kwargs)

    monkeypatch.setattr(upstream_client, "call", dying_call)
    with pytest.raises(WorkerDied):
        Worker(harness.settings).process(message_for(harness, batch["id"], 0), NO_RECORD,
                                         deadline=time.monotonic() + TIME_LEFT)
    finished_on = clock.utc_day(now(harness))
    assert state_of(harness, batch["id"], 0)["status"] == "completed"
    assert state_of(harness, batch["id"], 4)["status"] == "running"
    meta = meta_of(harness, batch["id"])
    assert (meta.running, meta.completed, meta.cost_nano) == (1, 0, 0)  # request 0 not counted yet
    assert usage_on(harness, finished_on) == 0
    # When it is deleted while request 4's lease holds (its run may be alive, only slow)
    status, body = harness.call("DELETE", f"/v1/batches/{batch['id']}")
    # Then it is refused, naming the batch's status and why
    assert status == 409, body
    assert body["error"]["code"] == "batch_running"
    assert body["error"]["message"] == (f"Batch {batch['id']} is in_progress with 1 request running; "
                                        "cancel it and wait for them to finish, then delete it")
    # When the request's lease (and its chain's) has passed, the sweep not having run
    harness.advance_clock(max(harness.settings.lease_seconds, harness.settings.batch_dispatch_lease_seconds) + 1)
    status, body = harness.call("DELETE", f"/v1/batches/{batch['id']}")
    # Then the batch is deleted
    assert status == 200, body
    assert body == {"id": batch["id"], "object": "batch.deleted", "deleted": True}
    status, _ = harness.call("GET", f"/v1/batches/{batch['id']}")
    assert status == 404
    # And request 0, which the dead run settled, is charged once, to the day it finished
    assert usage_on(harness, finished_on) == one_cost(contents[0])
