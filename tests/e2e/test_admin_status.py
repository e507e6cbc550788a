"""`freeinference-batch admin status` against the local stack: the tables' figures while a batch
runs, and the workers' per-model metrics (forwarded by the local stack to its moto CloudWatch)
once it is done."""

from __future__ import annotations

import json

from conftest import StackProcess, wait_for

MODEL = "qwen3.6-35b"


def status(stack: StackProcess) -> dict:
    return json.loads(stack.admin("status", "--json").stdout)


def model_of(answer: dict) -> dict:
    (found,) = [model for model in answer["models"] if model["model"] == MODEL]
    return found


def test_admin_status_shows_a_running_batch_then_its_completions(stack: StackProcess) -> None:
    key = stack.create_key("e2e-status", tier="internal", daily_quota_usd=5)
    api = stack.api(key)
    before = model_of(status(stack))["completed_5m"]
    # Given 8 requests of 2 s on one model (4 chains: about 4 s)
    created = api.create_batch([{"custom_id": f"s-{i}", "body": {
        "model": MODEL, "messages": [{"role": "user", "content": "Slow [sim:latency=2]"}]}} for i in range(8)])
    assert created.status_code == 200, created.text
    batch_id = created.json()["id"]

    # While it runs: the account has one unfinished batch, the model a backlog within its cap
    running = status(stack)
    (account,) = [a for a in running["accounts"] if a["account_id"] == "e2e-status"]
    assert account["unfinished_batches"] == 1 and account["daily_quota_usd"] == 5.0
    model = model_of(running)
    assert model["configured_cap"] == 4 and 0 < model["batch_cap"] <= 4
    assert model["requests_queued"] + model["requests_running"] >= 1
    assert model["requests_running"] == model["slots_held"] <= model["batch_cap"]

    # Once done: no unfinished batch, today's usage counted, the completions in the last minutes
    api.wait_for_status(batch_id, "completed", timeout=60)
    done = wait_for(lambda: (answer := status(stack)) and model_of(answer)["completed_5m"] >= before + 8 and answer,
                    timeout=60, interval=0.5, message="the completions in the metrics")
    assert "e2e-status" not in [a["account_id"] for a in done["accounts"]]
    model = model_of(done)
    assert model["completed_60m"] >= model["completed_5m"] >= before + 8
    assert model["drain_seconds"] == 0.0 or model["requests_queued"] > 0  # other tests' work

    # The table, for people
    table = stack.admin("status").stdout
    assert table.splitlines()[0].split()[:4] == ["model", "cap", "of", "load"]
    assert any(line.startswith(MODEL) for line in table.splitlines())
