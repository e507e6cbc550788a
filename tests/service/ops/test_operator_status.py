"""The operator status (ops/operator_status.py): its arithmetic, a chain's backlog and the drain
time; and on moto, the expire schedule publishing each model's batch cap and slots held once a
minute, so the operations dashboard charts over time what `admin status` shows now, and the
batches waiting, with why."""

from __future__ import annotations

import json
import time

from freeinference_batch import accounts
from freeinference_batch.core.catalog import load_catalog
from freeinference_batch.ops import operator_status
from freeinference_batch.ops.operator_status import chain_backlog, drain_seconds
from freeinference_batch.store import accounts_table
from freeinference_batch.store.leases import model_slots_key
from freeinference_batch.worker import Worker
from freeinference_batch.worker.slot_blocks import BlockLeases, SlotBlock
from freeinference_batch_local.handlers import LambdaContext, load_handler

from tests.conftest import sample_request
from tests.service.worker.helpers import NO_RECORD, message_for

MODEL = "glm-5.3-flash"


def test_a_chains_backlog_counts_its_own_positions_from_its_head():
    # A lane of 10 requests on 4 chains: chain 1 runs 1, 5, 9
    assert chain_backlog(10, 4, 1, 1) == 3
    assert chain_backlog(10, 4, 1, 5) == 2
    assert chain_backlog(10, 4, 1, 9) == 1
    assert chain_backlog(10, 4, 1, 13) == 0
    assert sum(chain_backlog(10, 4, chain, chain) for chain in range(4)) == 10


def test_the_drain_time_is_the_backlog_over_the_last_five_minutes_rate():
    assert drain_seconds(0, 0, 0) == 0.0
    assert drain_seconds(100, 0, 0) is None  # nothing settled lately: no estimate
    assert drain_seconds(600, 250, 50) == 600.0  # 300 in 300 s: one a second


def emf_records(text: str) -> list[dict]:
    return [record for line in text.splitlines() if line.startswith("{")
            and "_aws" in (record := json.loads(line))]


def _value(emf_value: float | list[float]) -> float:
    return emf_value[0] if isinstance(emf_value, list) else emf_value


def test_the_expire_schedule_publishes_each_models_cap_and_slots_held(harness, monkeypatch, capsys):
    # Given a model with interactive load and one slot held by a chain
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "false")
    catalog = load_catalog(harness.settings.model_catalog_path)
    now = time.time()
    accounts_table.put_model_load(harness.settings, MODEL, catalog.models[MODEL].interactive_capacity, at=int(now))
    leases = BlockLeases(harness.settings)
    assert leases.take(model_slots_key(MODEL), SlotBlock("holder.b", None, 60), 4, now)
    capsys.readouterr()
    # When the expire schedule runs
    load_handler("schedules", "expire_handler")({"source": "aws.events"}, LambdaContext("expire", 128, 60))
    records = emf_records(capsys.readouterr().out)
    # Then it published, per model, the cap the gates would use now and the slots held
    gauges = operator_status.publish_model_gauges(harness.settings, catalog, now)
    published = {(r["model"], name): _value(r[name]) for r in records for name in ("BatchCap", "SlotsHeld")
                 if name in r}
    for model in catalog.models:
        assert published[(model, "BatchCap")] == gauges[model][0]
        assert published[(model, "SlotsHeld")] == gauges[model][1]
    assert gauges[MODEL][1] == 1
    assert gauges[MODEL][0] < catalog.models[MODEL].batch_concurrency  # the interactive load lowered it
    assert all(r["service"] == "freeinference-batch" for r in records if "BatchCap" in r)


def test_admin_status_lists_the_batches_waiting_and_why(harness):
    # Given two unfinished batches of an account whose daily quota is used up, one of them parked
    # by its chain (the API answers the account 429: the operator's view is where it shows)
    waiting, idle = (harness.create([sample_request("q-0")]) for _ in range(2))
    accounts.set_account(harness.settings, "acct-1", daily_quota_usd=0)
    Worker(harness.settings).process(message_for(harness, waiting["id"], 0), NO_RECORD)
    # When the operator asks
    found = operator_status.operator_status(harness.settings, load_catalog(harness.settings.model_catalog_path),
                                            time.time())
    # Then the waiting one is listed with its reason; the other, which no chain has looked at, is not
    assert [(w.batch_id, w.account_id, w.reason) for w in found.waiting] == [(waiting["id"], "acct-1", "daily_quota")]
    assert "00:00 UTC" in found.waiting[0].message
    assert found.as_dict()["waiting"][0]["reason"] == "daily_quota"
    assert idle["id"] not in {w.batch_id for w in found.waiting}
