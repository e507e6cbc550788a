"""cloudformation/resources.py `function_environments`: each function of the repo's template gets
its own variables (its `Environment` with `Globals` applied, as SAM does), resolved against the
created resources, and no variable only another function declares."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from freeinference_batch_local.cloudformation.resources import TemplateResources, function_environments
from freeinference_batch_local.cloudformation.template import load_template
from freeinference_batch_local.handlers import functions_from_template
from moto import mock_aws

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def resources(monkeypatch) -> Iterator[TemplateResources]:
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {"AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(name, value)
    with mock_aws():
        clients = {name: boto3.client(name) for name in ("dynamodb", "sqs", "s3", "secretsmanager")}
        yield TemplateResources(load_template(REPO / "template.yaml"), clients)


def test_each_function_gets_its_own_variables_and_no_other_functions(resources):
    template = resources.template
    functions = functions_from_template(template, REPO)
    # Given the stack's process environment: the globals set, a setting the template leaves out,
    # and a template default a test overrides
    environ = {"PATH": "/bin", "BATCH_SCHEDULE_SECONDS": "1", "BATCH_MAX_ATTEMPTS": "2",
               "AWS_SDK_UA_APP_ID": "marked", "BATCH_TABLE_NAME": "from-the-shell"}
    environments = function_environments(template, resources, functions, environ)
    worker, api = environments["GlmFlashModel/WorkerFunction"], environments["ApiFunction"]
    # Then a model's worker has its own model and the upstream credential's secret, resolved
    assert worker["WORKER_MODEL"] == "glm-5.3-flash"
    assert environments["Qwen35bModel/WorkerFunction"]["WORKER_MODEL"] != worker["WORKER_MODEL"]
    secret = resources.ensure("UpstreamApiKeySecret")["Ref"]
    assert worker["UPSTREAM_API_KEY_SECRET"] == secret
    # And no other function sees them
    for logical_id, env in environments.items():
        if not logical_id.endswith("/WorkerFunction"):
            assert "WORKER_MODEL" not in env and "UPSTREAM_API_KEY_SECRET" not in env, logical_id
    # And every function has the globals, a resource's name being the stack's, any other value
    # already set winning over the template's, and what the template does not declare passing through
    for env in (worker, api):
        assert env["BATCH_TABLE_NAME"] == resources.ensure("BatchTable")["Ref"]
        assert env["BATCH_MAX_ATTEMPTS"] == "2" and env["AWS_SDK_UA_APP_ID"] == "marked"
        assert env["BATCH_SCHEDULE_SECONDS"] == "1" and env["PATH"] == "/bin"
        assert env["POWERTOOLS_SERVICE_NAME"] == "freeinference-batch"
