"""The batch object as the spec's "Create a batch" answer shows it, on moto: every field in the
spec's order, the ones always null, its timestamps and cost before and after it runs.
"""

from __future__ import annotations

import pytest
from freeinference_batch.core import clock

from tests.service.helpers import TIMESTAMPS, assert_batch_object, body_with, req

pytestmark = pytest.mark.usefixtures("one_worker_thread")


def test_batch_object_has_every_field_of_the_spec(harness):
    before = int(clock.now(harness.settings.clock_offset_file))
    batch = harness.create(
        [req("q-1"), req("q-2", body=body_with(model="qwen3.6-35b", max_tokens=50))], metadata={"project": "eval-42"}
    )
    after = int(clock.now(harness.settings.clock_offset_file))
    assert_batch_object(batch)
    assert batch["status"] == "validating"
    assert before <= batch["created_at"] <= after
    assert batch["expires_at"] == batch["created_at"] + 86400
    assert batch["completion_window"] == "24h"
    for name in TIMESTAMPS:
        assert batch[name] is None, name
    assert batch["request_counts"] == {"total": 2, "completed": 0, "failed": 0}
    assert batch["metadata"] == {"project": "eval-42"}
    assert batch["cost_usd"] == 0.0 and batch["error"] is None
    # GET answers the same object
    assert harness.batch(batch["id"]) == batch
    # Once it has run: its timestamps and cost
    final = harness.run_to_final(batch["id"])
    assert_batch_object(final)
    assert final["status"] == "completed"
    assert final["created_at"] <= final["in_progress_at"] <= final["completed_at"]
    assert final["failed_at"] is final["expired_at"] is final["cancelling_at"] is final["cancelled_at"] is None
    assert final["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
    assert final["cost_usd"] > 0 and final["error"] is None
    assert final["expires_at"] == batch["expires_at"] and final["metadata"] == batch["metadata"]
    # A batch without metadata reads metadata null
    assert harness.create([req()])["metadata"] is None
