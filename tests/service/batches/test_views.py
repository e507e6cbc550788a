"""A result line's `error`: the spec's `{code, message}` "plus the HTTP `status` behind it when there
was one", so an error with no HTTP answer behind it has no `status` at all (not null), without
AWS; and on moto, a request that ran keeps its last run's error when its batch is cancelled."""

from __future__ import annotations

from decimal import Decimal

import pytest
from freeinference_batch.batches import views
from freeinference_batch.core.schemas import BatchStatus
from freeinference_batch.store.batch_record import BatchRecord
from freeinference_batch.worker import Parked, Worker

from tests.conftest import sample_request
from tests.service.worker.helpers import NO_RECORD, message_for

BATCH_ID = "batch_0661c06624645981aee5cf6aa1916788"


def record(status: BatchStatus) -> BatchRecord:
    return BatchRecord(id=BATCH_ID, account_id="acct-1", key_hash="k", status=status, created_at=1, expires_at=2,
                       window_seconds=1, total=1, id_base=1000, chunk_starts=[0], lane_widths={"m": 1}, ttl=3)


@pytest.mark.parametrize(("batch_status", "code"), [(BatchStatus.FAILED, "batch_failed"),
                                                    (BatchStatus.EXPIRED, "batch_expired")])
def test_a_request_a_final_batch_never_ran_has_an_error_without_status(batch_status, code):
    line = views.result_line(record(batch_status), "batch_req_1000", "q-1", None, None)
    assert line["error"]["code"] == code
    assert set(line["error"]) == {"code", "message"}


def test_a_stored_error_without_an_http_answer_has_no_status():
    state = {"status": "failed", "error": {"code": "upstream_error", "message": "Each run stopped"}}
    line = views.result_line(record(BatchStatus.COMPLETED), "batch_req_1000", "q-1", state, None)
    assert line["error"] == {"code": "upstream_error", "message": "Each run stopped"}


def test_a_stored_error_with_an_http_answer_keeps_its_status():
    state = {"status": "failed", "error": {"code": "invalid_request", "message": "bad", "status": Decimal(400)}}
    line = views.result_line(record(BatchStatus.COMPLETED), "batch_req_1000", "q-1", state, None)
    assert line["error"] == {"code": "invalid_request", "message": "bad", "status": 400}


def test_a_request_that_ran_keeps_its_last_error_when_its_batch_is_cancelled(harness):
    # Given a request that failed once with a 503 and waits for its retry
    batch = harness.create([sample_request("q-0", "Flaky [sim:fail=503*5]")])
    outcome = Worker(harness.settings).process(message_for(harness, batch["id"], 0), NO_RECORD)
    assert isinstance(outcome, Parked)
    # When the batch is cancelled meanwhile
    status, cancelled = harness.call("POST", f"/v1/batches/{batch['id']}/cancel")
    assert status == 200 and cancelled["status"] == "cancelled"
    # Then its result is cancelled, with the error of the run it did have
    line = harness.results(batch["id"])[0]
    assert line["status"] == "cancelled"
    assert line["error"]["code"] == "service_unavailable" and line["error"]["status"] == 503
