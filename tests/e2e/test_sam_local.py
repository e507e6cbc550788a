"""`sam local` against the local stack, as far as it can be checked without Docker.

The stack writes `.local-stack/sam-env.json`. SAM's own code (the samcli package of
`.tools/sam`: its function provider and the environment resolution `sam local invoke` does)
reads the template with that file: every variable the template declares must get the stack's
value, reachable from a container. Then each sample event in events/ is run through its
function's handler in a fresh interpreter whose environment is exactly what SAM resolved (with
`host.docker.internal` meaning this machine, as it does for a container), against the running
stack, carrying the key the stack created for them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from freeinference_batch_local.cloudformation.template import function_properties, load_template, resources_of_type
from freeinference_batch_local.sam_env import DOCKER_HOST, SAMPLE_EVENTS_KEY, sam_env_path

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "template.yaml"
SAM_PYTHON = REPO / ".tools" / "sam" / "bin" / "python"
LAYER = REPO / "layers" / "batch_core"
LOCAL_STACK = REPO / "local_stack"

# The environment `sam local invoke` gives each function (SAM's provider and resolution).
_SAM_RESOLVE = """
import json, sys
from samcli.commands.local.lib.local_lambda import LocalLambdaRunner
from samcli.lib.providers.sam_function_provider import SamFunctionProvider
from samcli.lib.providers.sam_stack_provider import SamLocalStackProvider

template, env_file = sys.argv[1:]
stacks, _ = SamLocalStackProvider.get_stacks(template)
provider = SamFunctionProvider(stacks)
runner = LocalLambdaRunner(local_runtime=None, function_provider=provider, cwd=".", real_path=".",
                           aws_region="us-east-1", env_vars_values=json.load(open(env_file)))
out = {}
for function in provider.get_all():
    declared = (function.environment or {}).get("Variables", {})
    # A model's worker is in its nested stack: `GlmFlashModel/WorkerFunction`, as `sam local invoke` names it.
    out[function.full_path] = {"declared": sorted(declared), "env": runner._make_env_vars(function).resolve(),
                          "handler": function.handler, "codeuri": function.codeuri}
print(json.dumps(out))
"""

# One function's handler, run on its sample events (a fresh interpreter: its own environment).
_INVOKE = """
import importlib, json, sys
from freeinference_batch_local.handlers import LambdaContext
code_dir, handler, events = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
sys.path.insert(0, code_dir)
module, _, name = handler.rpartition(".")
function = getattr(importlib.import_module(module), name)
print(json.dumps({event: function(json.load(open(event)), LambdaContext("sam-local", 512, 60))
                  for event in events}, default=str))
"""


def sam_resolved_environments(env_file: Path) -> dict[str, dict[str, Any]]:
    if not SAM_PYTHON.exists():
        pytest.skip("the SAM CLI is not installed (make install)")
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
           "AWS_DEFAULT_REGION": "us-east-1", "SAM_CLI_TELEMETRY": "0"}
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "PYTHONPATH"):
        env.pop(name, None)
    result = subprocess.run([str(SAM_PYTHON), "-c", _SAM_RESOLVE, str(TEMPLATE), str(env_file)], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def resolved(stack) -> dict[str, dict[str, Any]]:
    env_file = sam_env_path(stack.cwd)
    assert env_file.is_file(), "the local stack writes .local-stack/sam-env.json"
    return sam_resolved_environments(env_file)


def test_the_env_file_gives_every_declared_variable_a_value_a_container_can_use(stack, resolved):
    document = json.loads(sam_env_path(stack.cwd).read_text())
    state = json.loads((stack.cwd / ".local-stack" / "state.json").read_text())
    template = load_template(TEMPLATE)
    functions = resources_of_type(template, "AWS::Serverless::Function")
    assert set(resolved) == set(functions)
    for logical_id, function in resolved.items():
        declared = function_properties(template, logical_id)["Environment"]["Variables"]
        assert set(function["declared"]) == set(declared), logical_id
        expected = {**document["Parameters"], **document.get(logical_id, {})}
        for name in declared:
            # Every declared variable comes from the file: none is left as SAM's stand-in for
            # an intrinsic (a `!Ref BatchTable` would read "BatchTable").
            assert function["env"][name] == expected[name], (logical_id, name)
            value = function["env"][name]
            assert "127.0.0.1" not in value and "localhost" not in value, (logical_id, name, value)
        env = function["env"]
        assert env["AWS_ENDPOINT_URL"].startswith(f"http://{DOCKER_HOST}:"), logical_id
        assert env["UPSTREAM_BASE_URL"].startswith(f"http://{DOCKER_HOST}:"), logical_id
        # Queues are found by name (moto, like SQS, reads the name from the URL), so the prefix
        # is the deployed one.
        assert env["MODEL_QUEUE_URL_PREFIX"] == state["env"]["MODEL_QUEUE_URL_PREFIX"], logical_id
    # The stack's real resources, not the template's logical ids.
    assert document["Parameters"]["BATCH_TABLE_NAME"] == state["env"]["BATCH_TABLE_NAME"]
    assert document["Parameters"]["ACCOUNTS_TABLE_NAME"] == state["env"]["ACCOUNTS_TABLE_NAME"]


def _events_of(handler: str, codeuri: str) -> list[Path]:
    code_dir = Path(codeuri).name
    if code_dir == "schedules":
        return [REPO / "events" / f"schedule-{handler.partition('.')[2].removesuffix('_handler')}.json"]
    return sorted((REPO / "events").glob(f"{code_dir}-*.json"))


def test_each_sample_event_runs_its_handler_against_the_running_stack(stack, resolved):
    answers: dict[str, Any] = {}
    ran = set()
    for logical_id, function in resolved.items():
        events = _events_of(function["handler"], function["codeuri"])
        if function["codeuri"].rstrip("/").endswith("worker") and "worker" in ran:
            continue  # the workers share their code and sample event
        ran.add(Path(function["codeuri"]).name)
        # What the container would see, with host.docker.internal being this machine.
        env = {name: value.replace(DOCKER_HOST, "127.0.0.1") for name, value in function["env"].items()}
        # The layer is what the container has; the local stack's root only for LambdaContext.
        env.update(PATH=os.environ["PATH"], PYTHONPATH=os.pathsep.join([str(LAYER), str(LOCAL_STACK)]),
                   POWERTOOLS_TRACE_DISABLED="true", POWERTOOLS_METRICS_DISABLED="true")
        result = subprocess.run(
            [sys.executable, "-c", _INVOKE, str(REPO / function["codeuri"]), function["handler"],
             json.dumps([str(e) for e in events])],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, f"{logical_id}: {result.stderr[-3000:]}"
        answers.update({Path(k).name: v for k, v in json.loads(result.stdout.strip().splitlines()[-1]).items()})

    assert set(answers) == {p.name for p in (REPO / "events").glob("*.json")}
    for name, answer in answers.items():
        if name.startswith("api-"):
            # The events' key is valid on the stack: never 401; the sample batch id is not there.
            body = json.loads(answer["body"])
            expected = {"api-create-batch.json": 200, "api-list-batches.json": 200,
                        "api-create-webhook-endpoint.json": 200, "api-list-webhook-endpoints.json": 200,
                        "api-list-webhook-event-types.json": 200, "api-create-file.json": 200,
                        "api-list-files.json": 200, "api-create-upload.json": 200,
                        "api-method-not-allowed.json": 405}.get(name, 404)
            assert answer["statusCode"] == expected, (name, body)
            if expected == 405:
                assert body["error"]["code"] == "method_not_allowed"
                assert answer["headers"]["Allow"] == "GET, POST", answer
        elif name == "worker-sqs.json":
            assert answer == {"batchItemFailures": []}
        else:
            assert isinstance(answer, dict), (name, answer)
    # The batch the sample create made is on the stack, under the events' account.
    listed = stack.api(key=SAMPLE_EVENTS_KEY).get("/batches")
    assert listed.status_code == 200 and listed.json()["data"], listed.text
