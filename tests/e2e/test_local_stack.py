"""The local stack itself: start-up, its one stdout line, the state file, the admin CLI, Ctrl-C."""

from __future__ import annotations

import gzip
import json
import re

import pytest

pytestmark = pytest.mark.e2e


def test_prints_one_line_with_the_base_url_and_the_dev_key(stack):
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/v1", stack.base_url)
    assert stack.key.startswith("hyi-")
    assert stack.base_url in stack.first_line and stack.key in stack.first_line
    assert stack.first_line.endswith("\n") and stack.first_line.count("\n") == 1


def test_unauthenticated_list_is_401(stack):
    answer = stack.api(key="").get("/batches")
    assert answer.status_code == 401
    assert answer.json()["error"]["type"] == "authentication_error"


def test_dev_key_lists_batches(api):
    answer = api.get("/batches")
    assert answer.status_code == 200, answer.text
    assert answer.json()["object"] == "list"


def test_unknown_route_is_api_gateway_404(api):
    answer = api.get("/nothing-here")
    assert answer.status_code == 404 and answer.json() == {"message": "Not Found"}


def test_a_plain_7_mb_create_is_refused_as_lambda_refuses_it_and_the_same_gzipped_is_accepted(stack):
    # Given a valid 7 MB batch: under API Gateway's 10 MB, over Lambda's 6 MB invoke payload
    api = stack.api(stack.create_key("e2e-payload-limits", tier="internal"))
    document = json.dumps({"requests": [
        {"custom_id": f"q-{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "glm-5.3-flash", "messages": [{"role": "user", "content": f"{i} " + "x" * 1000}]}}
        for i in range(6100)
    ]}).encode()  # fmt: skip
    assert 7_000_000 < len(document) < 10_485_760
    # When it is sent plain, then the gateway answers as AWS does when Lambda refuses the invoke
    plain = api.post("/batches", data=document, headers={"Content-Type": "application/json"})
    assert plain.status_code == 413, plain.text[:300]
    assert plain.json() == {"message": "Request Entity Too Large"}
    assert api.get("/batches").json()["data"] == []
    # When the same batch is sent gzipped, then it is created
    packed = api.post("/batches", data=gzip.compress(document),
                      headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})  # fmt: skip
    assert packed.status_code == 200, packed.text[:300]
    assert packed.json()["request_counts"]["total"] == 6100
    # (cancelled at once: the other tests share this stack's workers)
    assert api.post(f"/batches/{packed.json()['id']}/cancel").status_code == 200


def test_state_file_describes_the_running_stack(stack):
    # Given the running stack's state file
    state = json.loads(stack.state_file.read_text())
    env = state["env"]
    # Then it names this stack, its moto endpoint and the resources made from the template
    assert state["base_url"] == stack.base_url and state["pid"] == stack.proc.pid
    assert env["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")
    assert env["AWS_ACCESS_KEY_ID"] == "test"
    assert env["BATCH_TABLE_NAME"].endswith("BatchTable") and env["ACCOUNTS_TABLE_NAME"].endswith("AccountsTable")
    # A model's queue URL is the prefix + the model id with "." made "-" (no per-model list).
    assert env["MODEL_QUEUE_URL_PREFIX"] == "https://sqs.us-east-1.amazonaws.com/123456789012/freeinference-batch-local-model_"
    # Settings given to the process pass straight through; an upstream is configured.
    assert env["BATCH_SCHEDULE_SECONDS"] == "1"
    assert env["UPSTREAM_BASE_URL"].startswith("http://127.0.0.1:")


def test_admin_cli_creates_keys_against_the_running_stack(stack):
    # When the admin CLI creates a key from the stack's directory
    key = stack.create_key("e2e-admin-account", tier="internal")
    # Then the stack accepts it, and it sees only its own (empty) list
    answer = stack.api(key).get("/batches")
    assert answer.status_code == 200, answer.text
    assert answer.json()["data"] == []


def test_env_overrides_reach_the_stack(start_stack, tmp_path):
    # Given a stack started with its own limit on requests per batch
    own = start_stack(tmp_path, BATCH_MAX_REQUESTS="2")
    state = json.loads(own.state_file.read_text())
    # Then that value wins over the template's default
    assert state["env"]["BATCH_MAX_REQUESTS"] == "2"


def test_ctrl_c_stops_cleanly_and_removes_the_state_file(start_stack, tmp_path):
    # Given a running stack that has served a request
    own = start_stack(tmp_path)
    assert own.state_file.is_file()
    assert own.api().get("/batches").status_code == 200
    # When it gets SIGINT
    code = own.stop()
    # Then it exits 0, leaves no state file and printed nothing after its one line
    assert code == 0, own.stderr_text()[-5000:]
    assert not own.state_file.exists()
    assert own.stdout_after_first_line == ""
    assert "local stack stopped" in own.stderr_text()


def test_fixed_dev_key_from_the_environment(start_stack, tmp_path):
    own = start_stack(tmp_path, FREEINFERENCE_DEV_KEY="hyi-e2e-fixed-dev-key-0123456789abcdef0123456789")
    assert own.key == "hyi-e2e-fixed-dev-key-0123456789abcdef0123456789"
    assert own.api().get("/batches").status_code == 200
