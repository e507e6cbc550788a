"""AWS faults on a running local stack (`LOCAL_AWS_FAULTS`): only the service's calls are faulted,
and `admin faults` prints what was injected."""

from __future__ import annotations

import json

import pytest

# tests/e2e is not a package: pytest imports its conftest as the top-level module `conftest`.
from conftest import ADMIN_COMMAND
from freeinference_batch_local.aws_faults.config import APP_ID_ENV, FAULT_NAMES, SERVICE_APP_ID

pytestmark = pytest.mark.e2e


def test_every_service_dynamodb_call_failing_leaves_setup_and_admin_working_and_admin_faults_counts_it(
    start_stack, tmp_path
):
    # Given a stack whose DynamoDB answers every call of the service's with a 500
    stack = start_stack(tmp_path, LOCAL_AWS_FAULTS="dynamodb.error=1", LOCAL_AWS_FAULTS_SEED="5")
    # Then it started: its setup (tables, the dev key) was not faulted
    assert stack.key.startswith("hyi-")
    # And the admin CLI is not faulted either
    assert stack.create_key("e2e-faults-admin").startswith("hyi-")
    before = json.loads(stack.admin("faults").stdout)
    # When the API (the service) reads the key table
    answer = stack.api().get("/batches")
    # Then its calls failed, and only they were counted
    assert answer.status_code >= 500, answer.text
    after = json.loads(stack.admin("faults").stdout)
    assert list(after) == list(FAULT_NAMES)
    assert after["dynamodb.error"] > before["dynamodb.error"]
    assert all(count == 0 for name, count in after.items() if name != "dynamodb.error")
    # And the mark is where the service's processes and `sam local`'s containers read it, not in
    # the state file the admin CLI and tests apply
    state = json.loads(stack.state_file.read_text())
    assert APP_ID_ENV not in state["env"]
    sam_env = json.loads((stack.cwd / ".local-stack" / "sam-env.json").read_text())
    assert sam_env["Parameters"][APP_ID_ENV] == SERVICE_APP_ID


def test_admin_faults_prints_the_counts_of_a_stack_at_work(start_stack, tmp_path):
    # Given a stack with a few DynamoDB and SQS faults, running three small batches (each chain's
    # first request is a message the pollers receive)
    stack = start_stack(
        tmp_path,
        LOCAL_AWS_FAULTS="dynamodb.throttle=0.05,dynamodb.stale_ms=200,sqs.duplicate=0.5",
        LOCAL_AWS_FAULTS_SEED="11",
    )
    api = stack.api()
    batch_ids = []
    for batch in range(3):
        items = [{"custom_id": f"f-{n}", "body": {"model": "glm-5.3-flash",
                                                  "messages": [{"role": "user", "content": f"hello {batch} {n}"}]}}
                 for n in range(8)]
        created = api.create_batch(items)
        assert created.status_code == 200, created.text
        batch_ids.append(created.json()["id"])
    # When they have run, each request once
    for batch_id in batch_ids:
        final = api.wait_for_status(batch_id, {"completed", "failed", "expired", "cancelled"}, timeout=120)
        assert final["status"] == "completed" and final["request_counts"] == {"total": 8, "completed": 8, "failed": 0}
    # Then `admin faults` (from the stack's directory) prints every name with its count
    counted = json.loads(stack.admin("faults").stdout)
    assert list(counted) == list(FAULT_NAMES)
    assert counted["sqs.duplicate"] > 0 and counted["dynamodb.throttle"] > 0
    assert counted["dynamodb.error"] == counted["dynamodb.lost_answer"] == counted["sqs.lost_answer"] == 0


def test_admin_faults_without_a_local_stack_says_where_to_run_it(tmp_path):
    import subprocess

    result = subprocess.run([*ADMIN_COMMAND, "faults"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "No local stack here" in result.stderr
