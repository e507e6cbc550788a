"""Progress people can plan by (issue 33): a running batch's rate and estimated finish from one read
of it (progress.py), and the lines `freeinference-batch status` prints with them."""

from __future__ import annotations

import types

import pytest
from click.testing import CliRunner
from freeinference_batch_client import progress
from freeinference_batch_client.cli import batches as batch_commands
from freeinference_batch_client.cli import main
from freeinference_batch_client.models import Batch

from tests.client.helpers import BATCH_ID, batch_json, make, response

NOW = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC
STARTED = int(NOW) - 600  # ten minutes running


def batch(status: str = "in_progress", completed: int = 25, failed: int = 5, total: int = 120, **fields) -> Batch:
    fields.setdefault("in_progress_at", STARTED)
    fields.setdefault("expires_at", int(NOW) + 86_400)
    return Batch.model_validate(batch_json(status, request_counts={"total": total, "completed": completed,
                                                                   "failed": failed}, **fields))


# ---- the estimate -----------------------------------------------------------------------------


def test_the_rate_is_the_batchs_over_its_running_time_and_the_rest_finishes_at_that_rate():
    # 30 finished (failures count: they are done) in 10 minutes: 3 a minute, 90 to go, 30 minutes
    estimate = progress.progress(batch(), NOW)
    assert estimate == progress.Estimate(per_minute=3.0, running_seconds=600.0, remaining=90, finish_at=NOW + 1800)
    assert not estimate.after_window(int(NOW) + 1800) and estimate.after_window(int(NOW) + 1799)
    assert not estimate.after_window(None)


@pytest.mark.parametrize("case", [
    batch("validating", 0, 0, in_progress_at=None),  # not started
    batch("in_progress", 0, 0),  # started, nothing finished
    batch("in_progress", in_progress_at=int(NOW)),  # no running time (clocks a second apart)
    batch("in_progress", in_progress_at=int(NOW) + 30),  # this clock behind the server's
    *(batch(status) for status in ("completed", "failed", "expired", "cancelled", "cancelling")),
], ids=["validating", "nothing-done", "no-time", "clock-behind", "completed", "failed", "expired", "cancelled",
        "cancelling"])
def test_no_estimate_while_it_cannot_be_told_or_nothing_more_runs(case: Batch):
    assert progress.progress(case, NOW) is None


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0 s"), (44.6, "45 s"), (89, "89 s"), (90, "2 min"), (5369, "89 min"),
    (5400, "1 h 30 min"), (3 * 3600 + 5 * 60, "3 h 05 min"), (47 * 3600 + 59 * 60, "47 h 59 min"),
    (2 * 86400 + 4 * 3600, "2 d 4 h"), (-5, "0 s"),
])
def test_durations_read_as_a_person_says_them(seconds: float, text: str):
    assert progress.duration(seconds) == text


def test_rates_keep_a_decimal_only_where_it_matters():
    assert [progress.rate_text(r) for r in (0.25, 3.0, 9.94, 10.0, 312.6)] == ["0.2", "3.0", "9.9", "10", "313"]


def test_the_waiting_message_is_read_when_the_server_sends_one():
    assert progress.waiting_message(batch()) is None  # a server without the field
    assert progress.waiting_message(batch(waiting=None)) is None  # not waiting
    waiting = {"reason": "concurrency", "message": "Every concurrent-request slot is in use", "since": STARTED}
    assert progress.waiting_message(batch(waiting=waiting)) == "Every concurrent-request slot is in use"
    typed = types.SimpleNamespace(waiting=types.SimpleNamespace(message="typed"))  # once the model has a field
    assert progress.waiting_message(typed) == "typed"  # type: ignore[arg-type]


# ---- `freeinference-batch status` -------------------------------------------------------------


def status_output(monkeypatch, answer: dict) -> str:
    client, _, _ = make(response(200, answer))
    monkeypatch.setattr(batch_commands, "make_client", lambda: client)
    monkeypatch.setattr(batch_commands, "time", types.SimpleNamespace(time=lambda: NOW))
    result = CliRunner().invoke(main, ["status", BATCH_ID])
    assert result.exit_code == 0, result.output
    return result.output


def test_status_of_a_running_batch_says_its_rate_and_when_it_should_be_done(monkeypatch):
    counts = {"total": 120, "completed": 25, "failed": 5}
    output = status_output(monkeypatch, batch_json("in_progress", request_counts=counts, in_progress_at=STARTED,
                                                   expires_at=int(NOW) + 86_400))
    assert output.splitlines() == [
        f"{BATCH_ID}  in_progress  25 completed, 5 failed, 120 total",
        "    rate: 3.0 requests a minute over 10 min running; 90 to go, done about 2027-01-15 08:30:00Z (in 30 min)",
    ]


def test_status_warns_when_at_this_rate_the_completion_window_closes_first(monkeypatch):
    counts = {"total": 120, "completed": 25, "failed": 5}
    output = status_output(monkeypatch, batch_json("in_progress", request_counts=counts, in_progress_at=STARTED,
                                                   expires_at=int(NOW) + 600))
    assert output.splitlines()[1].endswith(
        "(in 30 min); but its completion window closes first, at 2027-01-15 08:10:00Z: what has not started by "
        "then expires")


def test_status_says_when_nothing_has_finished_yet_and_shows_the_waiting_message(monkeypatch):
    waiting = {"reason": "batch_access", "message": "Your account has no batch access at the moment", "since": 1}
    output = status_output(monkeypatch, batch_json("validating", waiting=waiting))
    assert output.splitlines()[1:] == ["    rate: not enough progress yet (no request has finished)",
                                       "    waiting: Your account has no batch access at the moment"]


def test_status_of_a_finished_batch_has_no_rate(monkeypatch):
    counts = {"total": 2, "completed": 2, "failed": 0}
    output = status_output(monkeypatch, batch_json("completed", request_counts=counts, in_progress_at=STARTED))
    assert output.splitlines() == [f"{BATCH_ID}  completed    2 completed, 0 failed, 2 total"]
