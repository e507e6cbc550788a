"""Handlers on moto: resources from template.yaml, the simulated upstream on loopback, and a
pump that delivers queue messages to the worker handler the way Lambda's poller does."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import boto3
import pytest
from botocore.client import BaseClient
from freeinference_batch import accounts
from freeinference_batch.core import aws, clock
from freeinference_batch.core.catalog import load_catalog
from freeinference_batch.core.settings import Settings, get_settings
from freeinference_batch_local.api_gateway.integration import build_event, invoke_integration, refuse_oversized_body
from freeinference_batch_local.cloudformation.resources import TemplateResources, template_environment
from freeinference_batch_local.cloudformation.template import load_template
from freeinference_batch_local.handlers import LambdaContext, load_handler, repo_root
from freeinference_batch_local.moto import expressions as moto_expressions
from freeinference_batch_local.moto import limits as aws_limits
from freeinference_batch_local.moto import serialization as moto_serialization
from freeinference_batch_local.moto import transactions as moto_transactions
from freeinference_batch_local.triggers.sqs import failed_message_ids, sqs_record
from freeinference_batch_local.upstream_sim import UpstreamSimulator
from moto import mock_aws
from moto.dynamodb.models import DynamoDBBackend


@pytest.fixture(scope="session")
def upstream():
    sim = UpstreamSimulator()
    base_url = sim.start()
    yield sim, base_url
    sim.stop()


class Harness:
    def __init__(self, settings_env: dict[str, str], monkeypatch, clock_file: str) -> None:
        self.monkeypatch = monkeypatch
        self.clock_file = clock_file
        self.api_handler = load_handler("api")
        self.worker_handler = load_handler("worker")
        # Model id -> its queue's URL, named as the template names it (<stack>-model_<suffix>).
        self.queues = {model: self.settings.model_queue_url(model)
                       for model in load_catalog(self.settings.model_catalog_path).models}
        self.key = accounts.create_key(self.settings, "acct-1", tier="internal", concurrency=16)

    @property
    def settings(self) -> Settings:
        return get_settings()

    def configure(self, **env: Any) -> None:
        for name, value in env.items():
            self.monkeypatch.setenv(name, str(value))
        get_settings.cache_clear()

    def advance_clock(self, seconds: float) -> None:
        current = clock.now(self.clock_file) - time.time()
        clock.set_offset(self.clock_file, current + seconds)

    # ---- API --------------------------------------------------------------------------

    def call(self, method: str, path: str, body: Any = None, *, key: str | None = None,
             headers: dict[str, str] | None = None, raw: bytes | None = None) -> tuple[int, Any]:
        all_headers = {"content-type": "application/json", **(headers or {})}
        if key is not False:
            all_headers.setdefault("authorization", f"Bearer {key or self.key}")
        payload = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        # Through API Gateway's and Lambda's limits, as the local stack and AWS would: a body
        # over 10 MB, an event or a response over 6 MB, a handler over 30 s never reach a test
        # as the handler's own answer.
        refused = refuse_oversized_body(len(payload or b""))
        if refused is None:
            route, params = _route(method, path.partition("?")[0])
            event = build_event(method=method, target=path, headers=list(all_headers.items()), body=payload,
                                route_key=route, path_parameters=params)
            status, _, answer = invoke_integration(self.api_handler, event, LambdaContext("api", 1769, 29))
        else:
            status, _, answer = refused
        try:
            return status, json.loads(answer)
        except ValueError:
            return status, answer.decode("utf-8", "replace")

    def create(self, requests: list[dict], **extra: Any) -> dict:
        status, body = self.call("POST", "/v1/batches", {"requests": requests, **extra})
        assert status == 200, body
        return body

    def results(self, batch_id: str) -> list[dict]:
        out, after = [], None
        while True:
            query = "?limit=1000" + (f"&after={after}" if after else "")
            status, page = self.call("GET", f"/v1/batches/{batch_id}/results{query}")
            assert status == 200, page
            out.extend(page["data"])
            if not page["has_more"]:
                return out
            after = page["last_id"]

    # ---- queues -----------------------------------------------------------------------

    def pump_once(self, queue_url: str, seconds: float = 150) -> int:
        """One worker invocation of `seconds` (its Lambda timeout) on what the queue holds; the
        messages it did not report failed are deleted, as Lambda's poller does."""
        sqs = aws.sqs()
        messages = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, AttributeNames=["All"],
                                       MessageAttributeNames=["All"]).get("Messages", [])
        if not messages:
            return 0
        arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        records = [sqs_record(m, arn) for m in messages]
        answer = self.worker_handler({"Records": records}, LambdaContext("worker", 512, seconds))
        keep = failed_message_ids(answer, [r["messageId"] for r in records]) or set()
        for message, record in zip(messages, records, strict=True):
            if record["messageId"] not in keep:
                sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
        return len(messages)

    def run_until(self, done: Callable[[], bool], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise AssertionError("condition not reached before the deadline")
            if not sum(self.pump_once(url) for url in self.queues.values()):
                time.sleep(0.05)

    def batch(self, batch_id: str) -> dict:
        status, body = self.call("GET", f"/v1/batches/{batch_id}")
        assert status == 200, body
        return body

    def run_to_final(self, batch_id: str, timeout: float = 30.0) -> dict:
        self.run_until(lambda: self.batch(batch_id)["status"] in ("completed", "failed", "expired", "cancelled"),
                       timeout)
        return self.batch(batch_id)


_ROUTES = [
    ("POST", "/v1/batches", "POST /v1/batches"),
    ("GET", "/v1/batches", "GET /v1/batches"),
    ("GET", "/v1/batches/{batch_id}", "GET /v1/batches/{batch_id}"),
    ("DELETE", "/v1/batches/{batch_id}", "DELETE /v1/batches/{batch_id}"),
    ("GET", "/v1/batches/{batch_id}/results", "GET /v1/batches/{batch_id}/results"),
    ("POST", "/v1/batches/{batch_id}/cancel", "POST /v1/batches/{batch_id}/cancel"),
    ("POST", "/v1/batches/{batch_id}/retry", "POST /v1/batches/{batch_id}/retry"),
]


def _route(method: str, path: str) -> tuple[str, dict[str, str] | None]:
    parts = path.strip("/").split("/")
    for route_method, pattern, key in _ROUTES:
        pattern_parts = pattern.strip("/").split("/")
        if route_method != method or len(pattern_parts) != len(parts):
            continue
        params = {}
        for want, got in zip(pattern_parts, parts, strict=True):
            if want.startswith("{"):
                params[want[1:-1]] = got
            elif want != got:
                break
        else:
            return key, params or None
    return "$default", None


def capture_answers(harness: Harness) -> list[dict]:
    """The api handler's raw answers from now on (status, headers, body), which `call` does not return."""
    answers: list[dict] = []
    original = harness.api_handler

    def handler(event, context):
        answers.append(original(event, context))
        return answers[-1]

    harness.api_handler = handler
    return answers


class StubUpstream:
    """An OpenAI-compatible upstream on loopback that answers every call with `answer` (raw
    bytes) and records each call's body size and Authorization header. It reads a body in small
    pieces and keeps none of it, so a test can measure the worker's memory beside it."""

    def __init__(self, answer: bytes = b"{}") -> None:
        self.answer = answer
        self.received: list[int] = []
        self.authorizations: list[str | None] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                remaining = int(self.headers.get("Content-Length") or 0)
                stub.received.append(remaining)
                stub.authorizations.append(self.headers.get("Authorization"))
                while remaining > 0:
                    remaining -= len(self.rfile.read(min(remaining, 64 * 1024)))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(stub.answer)))
                self.end_headers()
                self.wfile.write(stub.answer)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.server.server_port}/v1"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def sample_request(custom_id: str, content: str = "Say hello.", model: str = "glm-5.3-flash", **body: Any) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": content}], **body}}


_moto_lock = threading.RLock()


def _serialized(call):
    # moto's in-process backends are not thread-safe and the worker runs its records in
    # threads; the local stack serializes its moto server the same way.
    def locked(self, *args, **kwargs):
        with _moto_lock:
            return call(self, *args, **kwargs)

    return locked


@pytest.fixture
def harness(request, monkeypatch, tmp_path, upstream):
    monkeypatch.setattr(BaseClient, "_make_api_call", _serialized(BaseClient._make_api_call))
    monkeypatch.setattr(DynamoDBBackend, "transact_write_items", moto_transactions.transact_write_items)
    # moto refuses what DynamoDB and SQS refuse, as in the local stack
    aws_limits.install()
    request.addfinalizer(aws_limits.uninstall)
    moto_serialization.install()  # as the local stack serves moto
    request.addfinalizer(moto_serialization.uninstall)
    moto_expressions.install()
    request.addfinalizer(moto_expressions.uninstall)
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
    clock_file = str(tmp_path / "clock-offset")
    with mock_aws():
        aws.reset_clients()
        template = load_template(repo_root() / "template.yaml")
        clients = {name: boto3.client(name) for name in ("dynamodb", "sqs", "s3", "secretsmanager")}
        resources = TemplateResources(template, clients)
        resources.create_all()
        env, _ = template_environment(template, resources)
        env.update(UPSTREAM_BASE_URL=upstream[1], BATCH_CLOCK_OFFSET_FILE=clock_file,
                   BATCH_RETRY_BASE_SECONDS="0.01", BATCH_UPSTREAM_TIMEOUT_SECONDS="2",
                   # the tests' loopback receivers listen on whatever port was free
                   WEBHOOK_LOOPBACK_PORTS="1024-65535")
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        get_settings.cache_clear()
        yield Harness(env, monkeypatch, clock_file)
        get_settings.cache_clear()
        aws.reset_clients()
