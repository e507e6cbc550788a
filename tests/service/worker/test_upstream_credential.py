"""The upstream credential and base URL: read from Secrets Manager at run time (rotating it needs
no deploy), never from a function's environment; a base URL that cannot work stops a cold start; a
worker that cannot read the credential runs nothing and its messages come back in seconds."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from freeinference_batch.core import aws
from freeinference_batch.core.settings import Settings
from freeinference_batch.worker import CredentialUnavailable, upstream
from freeinference_batch.worker.runner import CREDENTIAL_WAIT_SECONDS
from freeinference_batch_local.cloudformation.resources import TemplateResources
from freeinference_batch_local.cloudformation.template import function_properties, load_template, resources_of_type
from freeinference_batch_local.handlers import LambdaContext
from moto import mock_aws
from pydantic import ValidationError

from tests.conftest import StubUpstream, sample_request
from tests.service.worker.helpers import MODEL, received_record, state_of

REPO = Path(__file__).resolve().parents[3]
TEMPLATE = REPO / "template.yaml"
COMPLETION = b'{"id": "c", "object": "chat.completion", "choices": [], "usage": {"prompt_tokens": 1}}'


@pytest.fixture
def recording_upstream() -> Iterator[StubUpstream]:
    server = StubUpstream(COMPLETION)
    yield server
    server.stop()


@pytest.fixture
def moto_env(monkeypatch) -> Iterator[None]:
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        aws.reset_clients()
        yield
    aws.reset_clients()


def _template_secret_arn() -> str:
    """The template's UpstreamApiKeySecret, created on moto as the local stack creates it."""
    clients = {"secretsmanager": boto3.client("secretsmanager")}
    resources = TemplateResources(load_template(TEMPLATE), clients)
    return resources.ensure("UpstreamApiKeySecret")["Ref"]


def test_rotating_the_secret_reaches_the_workers_without_a_deploy(moto_env, recording_upstream, monkeypatch):
    # Given the template's secret holding the first credential, and a worker's settings naming it
    # (as the template's UPSTREAM_API_KEY_SECRET does), with a 1 s cache
    arn = _template_secret_arn()
    secrets = boto3.client("secretsmanager")
    secrets.put_secret_value(SecretId=arn, SecretString="upstream-key-1")
    settings = Settings(UPSTREAM_BASE_URL=recording_upstream.base_url, UPSTREAM_API_KEY_SECRET=arn,
                        UPSTREAM_API_KEY_MAX_AGE_SECONDS=1)
    fetches: list[str] = []
    aws._client("secretsmanager").meta.events.register(
        "before-call.secrets-manager.GetSecretValue", lambda **_: fetches.append("fetch"))

    def call() -> None:
        outcome = upstream.call(settings, b'{"model": "m", "messages": []}', account_id="a", request_ref="b:0")
        assert outcome.kind == "completed", outcome

    # When requests run, the credential is rotated (a new secret value, nothing redeployed),
    # and requests run on
    call()
    call()
    secrets.put_secret_value(SecretId=arn, SecretString="upstream-key-2")
    call()  # within the cache's max age: still the old value, which the upstream accepts during rotation
    time.sleep(1.1)
    call()

    # Then the same settings (same environment, no deploy) send the new credential once the cache expires,
    # and the secret is read once per max age, not once per request
    assert recording_upstream.authorizations == [
        "Bearer upstream-key-1", "Bearer upstream-key-1", "Bearer upstream-key-1", "Bearer upstream-key-2"]
    assert fetches == ["fetch", "fetch"]


def test_a_failed_refresh_keeps_the_credential_last_read(moto_env, recording_upstream):
    # Given a worker that has read the secret once, with a cache that has expired
    arn = _template_secret_arn()
    boto3.client("secretsmanager").put_secret_value(SecretId=arn, SecretString="upstream-key-1")
    settings = Settings(UPSTREAM_BASE_URL=recording_upstream.base_url, UPSTREAM_API_KEY_SECRET=arn,
                        UPSTREAM_API_KEY_MAX_AGE_SECONDS=0)
    assert upstream.call(settings, b"{}", account_id="a", request_ref="b:0").kind == "completed"

    # When Secrets Manager fails the next read (the secret is gone here; a throttle or a blip on AWS)
    boto3.client("secretsmanager").delete_secret(SecretId=arn, ForceDeleteWithoutRecovery=True)
    outcome = upstream.call(settings, b"{}", account_id="a", request_ref="b:1")

    # Then the request still runs, with the credential last read: it costs no attempt
    assert outcome.kind == "completed"
    assert recording_upstream.authorizations == ["Bearer upstream-key-1", "Bearer upstream-key-1"]
    # (a worker that never read it has nothing to fall back on: it raises, before any claim: see below)
    aws.reset_clients()
    with pytest.raises(Exception, match=r"(?i)secret"):
        upstream.api_key(settings)


def test_without_a_secret_the_plain_setting_is_sent_and_nothing_when_empty(moto_env, recording_upstream):
    # The local stack's case: the simulated upstream needs no credential.
    for key, expected in (("local-key", "Bearer local-key"), ("", None)):
        settings = Settings(UPSTREAM_BASE_URL=recording_upstream.base_url, UPSTREAM_API_KEY=key)
        upstream.call(settings, b"{}", account_id="a", request_ref="b:0")
        assert recording_upstream.authorizations[-1] == expected


# ---------------------------------------------------------------- the template


def test_no_function_environment_holds_a_credential_and_only_workers_may_read_the_secret() -> None:
    template = load_template(TEMPLATE)
    assert not any(p.get("NoEcho") for p in template["Parameters"].values()), "credentials are not parameters"
    functions = resources_of_type(template, "AWS::Serverless::Function")
    readers = set()
    for logical_id in functions:
        properties = function_properties(template, logical_id)
        variables = properties["Environment"]["Variables"]
        assert "UPSTREAM_API_KEY" not in variables, logical_id
        statements = [s for p in properties.get("Policies", []) if isinstance(p, dict) for s in p.get("Statement", [])]
        # The upstream credential's readers (webhook functions read their signing key's secret).
        if any("secretsmanager:GetSecretValue" in _list(s["Action"]) and "WebhookSigningKeySecret" not in str(s)
               for s in statements):
            readers.add(logical_id)
            assert variables["UPSTREAM_API_KEY_SECRET"] == {"Ref": "UpstreamApiKeySecret"}
        else:
            assert "UPSTREAM_API_KEY_SECRET" not in variables, logical_id
    workers = {i for i, f in functions.items() if "WORKER_MODEL" in f["Properties"].get("Environment", {})
               .get("Variables", {})}
    assert readers == workers and workers


def _list(value: object) -> list:
    return value if isinstance(value, list) else [value]


# ---------------------------------------------------------------- the base URL

GOOD = ["https://gateway.internal/v1", "https://gateway.internal/v1/", "https://openrouter.ai/api/v1",
        "https://gw.example.com:8443/v1"]
BAD = ["https://gateway.internal", "https://gateway.internal/", "https://gateway.internal/v1/chat/completions",
       "https://gateway.internal/v2", "ftp://gateway.internal/v1", "gateway.internal/v1",
       "https://gateway.internal/v1?key=x", "https:///v1"]


@pytest.mark.parametrize("url", GOOD)
def test_settings_accept_a_base_url_ending_in_v1(url: str) -> None:
    assert Settings(UPSTREAM_BASE_URL=url).upstream_base_url == url


@pytest.mark.parametrize("url", BAD)
def test_settings_refuse_a_base_url_that_cannot_work(url: str) -> None:
    with pytest.raises(ValidationError, match="UPSTREAM_BASE_URL"):
        Settings(UPSTREAM_BASE_URL=url)


def test_the_template_pattern_agrees_with_settings() -> None:
    parameter = load_template(TEMPLATE)["Parameters"]["UpstreamBaseUrl"]
    assert "Default" not in parameter, "the upstream must be chosen at deploy"
    assert "/chat/completions" in parameter["Description"] and "/v1" in parameter["Description"]
    pattern = re.compile(parameter["AllowedPattern"])
    for url in GOOD:
        assert pattern.fullmatch(url), url
    for url in BAD:
        assert not pattern.fullmatch(url), url
    # CloudFormation takes https only: the credential travels in a header.
    assert not pattern.fullmatch("http://gateway.internal/v1")


def test_the_example_config_gives_a_url_that_works() -> None:
    config = tomllib.loads((REPO / "samconfig.example.toml").read_text())
    overrides = dict(o.split("=", 1) for o in config["default"]["deploy"]["parameters"]["parameter_overrides"])
    pattern = re.compile(load_template(TEMPLATE)["Parameters"]["UpstreamBaseUrl"]["AllowedPattern"])
    assert pattern.fullmatch(overrides["UpstreamBaseUrl"])
    Settings(UPSTREAM_BASE_URL=overrides["UpstreamBaseUrl"])


def test_a_worker_cold_start_fails_on_a_url_that_cannot_work() -> None:
    # A fresh interpreter imports the worker's handler module, as Lambda's init does.
    code = "import runpy; runpy.run_path('functions/worker/app.py')"
    env = {**os.environ, "UPSTREAM_BASE_URL": "https://gateway.internal", "POWERTOOLS_TRACE_DISABLED": "true",
           "AWS_DEFAULT_REGION": "us-east-1"}
    env.pop("UPSTREAM_API_KEY_SECRET", None)
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode != 0
    assert "must end in /v1" in result.stderr
    # ...and starts on one that can.
    env["UPSTREAM_BASE_URL"] = "https://gateway.internal/v1"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr


def test_the_local_stack_puts_a_given_credential_in_the_workers_secret(moto_env, monkeypatch):
    # `sam local`'s workers read the secret the template names: a credential given to the local
    # stack (UPSTREAM_API_KEY, for a real upstream) must be what they read.
    from freeinference_batch_local.stack import LocalStack

    template = load_template(TEMPLATE)
    clients = {"secretsmanager": boto3.client("secretsmanager")}
    resources = TemplateResources(template, clients)
    monkeypatch.setenv("UPSTREAM_API_KEY", "real-upstream-key")
    LocalStack._put_upstream_key(template, resources, clients["secretsmanager"])
    arn = resources.ensure("UpstreamApiKeySecret")["Ref"]
    assert clients["secretsmanager"].get_secret_value(SecretId=arn)["SecretString"] == "real-upstream-key"


# ---------------------------------------------------------------- a credential that cannot be read


def test_a_worker_that_cannot_read_the_credential_claims_nothing_and_its_messages_come_back_in_seconds(harness):
    # Given a queued request, and a worker whose every read of the credential's secret fails
    # (a fresh environment: nothing read before to fall back on)
    batch = harness.create([sample_request("c-0", "No credential yet")])
    secrets = boto3.client("secretsmanager")
    arn = next(s["ARN"] for s in secrets.list_secrets()["SecretList"] if s["Name"].endswith("UpstreamApiKeySecret"))
    harness.configure(UPSTREAM_API_KEY_SECRET=arn.replace("UpstreamApiKey", "Missing"))
    aws.reset_clients()
    parked: list[int] = []
    aws.sqs().meta.events.register("provide-client-params.sqs.ChangeMessageVisibility",
                                   lambda params, **_: parked.append(params["VisibilityTimeout"]))
    record = received_record(harness, batch["id"], 0)  # hidden for an hour, as the worker queue's 90 minutes

    # When an invocation gets its message
    with pytest.raises(CredentialUnavailable):
        harness.worker_handler({"Records": [{**record, "eventSourceARN": "arn:aws:sqs:us-east-1:1:q"}]},
                               LambdaContext("worker", 512, 900))

    # Then the invocation fails (the Errors alarm shows it), the request was not claimed (no
    # attempt spent, no lease for the sweep to wait out), and its message comes back in seconds
    state = state_of(harness, batch["id"], 0)
    # (no request item at all: never run)
    assert state is None or (state["status"] == "queued" and not int(state.get("attempts", 0))), state
    assert parked == [CREDENTIAL_WAIT_SECONDS]
    # And once the secret reads again, the request runs
    harness.configure(UPSTREAM_API_KEY_SECRET=arn)
    secrets.put_secret_value(SecretId=arn, SecretString="upstream-key-1")
    aws.sqs().change_message_visibility(QueueUrl=harness.queues[MODEL], ReceiptHandle=record["receiptHandle"],
                                                 VisibilityTimeout=0)  # its 10 s, passed
    assert harness.run_to_final(batch["id"])["request_counts"] == {"total": 1, "completed": 1, "failed": 0}
