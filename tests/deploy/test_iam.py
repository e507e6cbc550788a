"""Least privilege: each function's IAM statements grant the calls its code makes, and little more.

A scenario runs every function's handler on moto (batches created, run with retries, waits for
slots, a body and an answer too big for an item, results read, a batch cancelled, one deleted,
one expired, then swept and purged; webhook endpoints managed through every route, the batch
table's stream told, deliveries retried, given up and delivered) while a hook on botocore
records each AWS call as the IAM action it needs and the resource it touches, keyed by the
function whose handler made it. The template must grant every recorded (action, resource) to
that function, and every grant must be used in the scenario or be listed below with the reason
it is there.
"""

from __future__ import annotations

import ast
import base64
import fnmatch
import json
import random
import re
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.client import BaseClient
from freeinference_batch import accounts
from freeinference_batch.core import aws
from freeinference_batch.store import caches
from freeinference_batch.worker import upstream
from freeinference_batch_local.handlers import LOCAL_STACK_NAME, LambdaContext, load_handler
from freeinference_batch_local.pollers import failed_message_ids, sqs_record, stream_record
from freeinference_batch_local.stack import TemplateResources
from freeinference_batch_local.template import function_properties, load_template, resources_of_type

from tests.conftest import sample_request

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "template.yaml"
PACKAGE = REPO / "layers" / "batch_core" / "freeinference_batch"
MODELS = sorted(json.loads((PACKAGE / "core" / "models.json").read_text())["models"])

# Grants the scenario does not exercise, each with why the code needs it: (function, action, resource).
UNEXERCISED: dict[tuple[str, str, str], str] = {
    ("StatusEventsFunction", "sqs:SendMessage", "StatusEventsDeadLetterQueue"):
        "the stream mapping's OnFailure destination, which Lambda writes with the function's role (no code of ours)",
}


def _worker_queues(template: dict[str, Any]) -> dict[str, str]:
    """Worker function logical id -> the queue its SQS event reads: the models' workers
    (WORKER_MODEL), not the other SQS-triggered functions (the webhook deliveries)."""
    return {i: e["Properties"]["Queue"]["Fn::GetAtt"][0]
            for i in resources_of_type(template, "AWS::Serverless::Function")
            if "WORKER_MODEL" in (function_properties(template, i).get("Environment") or {}).get("Variables", {})
            for e in function_properties(template, i).get("Events", {}).values() if e["Type"] == "SQS"}


def _cross_model_wakes(template: dict[str, Any]) -> dict[tuple[str, str, str], str]:
    queues = _worker_queues(template)
    return {(worker, "sqs:ChangeMessageVisibility", other): "waking another model's waiting chain (an account's "
            "slots are shared by its models): whether the scenario's chains cross models is a matter of timing"
            for worker, own in queues.items() for other in queues.values() if other != own}


# botocore operation -> the IAM action it needs (the ones this code makes; transactions below).
ACTIONS = {
    ("dynamodb", "GetItem"): "dynamodb:GetItem",
    ("dynamodb", "PutItem"): "dynamodb:PutItem",
    ("dynamodb", "UpdateItem"): "dynamodb:UpdateItem",
    ("dynamodb", "DeleteItem"): "dynamodb:DeleteItem",
    ("dynamodb", "Query"): "dynamodb:Query",
    ("dynamodb", "BatchGetItem"): "dynamodb:BatchGetItem",
    ("dynamodb", "BatchWriteItem"): "dynamodb:BatchWriteItem",
    ("s3", "GetObject"): "s3:GetObject",
    ("s3", "HeadObject"): "s3:GetObject",
    ("s3", "PutObject"): "s3:PutObject",
    ("s3", "DeleteObject"): "s3:DeleteObject",
    ("s3", "ListObjectsV2"): "s3:ListBucket",
    ("sqs", "SendMessage"): "sqs:SendMessage",
    ("sqs", "SendMessageBatch"): "sqs:SendMessage",
    ("sqs", "ChangeMessageVisibility"): "sqs:ChangeMessageVisibility",
    ("sqs", "ChangeMessageVisibilityBatch"): "sqs:ChangeMessageVisibility",
    ("sqs", "DeleteMessage"): "sqs:DeleteMessage",
    ("secretsmanager", "GetSecretValue"): "secretsmanager:GetSecretValue",
    ("s3", "DeleteObjects"): "s3:DeleteObject",
    ("events", "PutEvents"): "events:PutEvents",
}
# TransactWriteItems is authorized item by item (DynamoDB's "IAM with transactions").
TRANSACT_ACTIONS = {"Put": "dynamodb:PutItem", "Update": "dynamodb:UpdateItem", "Delete": "dynamodb:DeleteItem",
                    "ConditionCheck": "dynamodb:ConditionCheckItem", "Get": "dynamodb:GetItem"}


class Recorder:
    """(function logical id, IAM action, resource) for every AWS call a handler makes."""

    def __init__(self, template: dict[str, Any]) -> None:
        self.logical_ids = list(template["Resources"])
        # Queues the template names itself (`QueueName: !Sub "${StackName}-..."`), as the local stack does.
        self.named = {name: i for i, name in queue_names(template).items()}
        # And secrets the template names (`Name: !Sub "${AWS::StackName}-webhook-signing-key"`).
        self.named.update({name: i for i, name in secret_names(template).items()})
        self.function: str | None = None
        self.calls: set[tuple[str, str, str]] = set()
        # (function, action, resource, condition key, value): the leading key (pk) of each item a
        # DynamoDB call touches, and the prefix of each S3 listing, for the statements' conditions.
        self.keyed: set[tuple[str, str, str, str, str]] = set()
        self.operations: set[tuple[str, str]] = set()

    def logical(self, physical: str) -> str:
        name = physical.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]
        if name in self.named:
            return self.named[name]
        name = name.removeprefix(f"{LOCAL_STACK_NAME}-").lower()
        for logical_id in self.logical_ids:
            if name == logical_id.lower() or name.startswith(logical_id.lower() + "-"):
                return logical_id
        raise AssertionError(f"no template resource for {physical!r}")

    def record(self, service: str, operation: str, params: dict[str, Any]) -> None:
        self.operations.add((service, operation))
        if self.function is None:  # not a handler's call (the test's own, or the pump's receive)
            return
        for action, resource in self._needs(service, operation, params):
            self.calls.add((self.function, action, resource))
        for action, resource, condition, value in self._keyed(service, operation, params):
            self.keyed.add((self.function, action, resource, condition, value))

    def _keyed(self, service: str, operation: str, params: dict[str, Any]) -> Iterator[tuple[str, str, str, str]]:
        if service == "s3" and operation == "ListObjectsV2":
            yield "s3:ListBucket", self.logical(params["Bucket"]), "s3:prefix", params.get("Prefix", "")
        if service != "dynamodb":
            return

        def pk(request: dict[str, Any]) -> str:
            return (request.get("Key") or request.get("Item"))["pk"]["S"]

        if operation == "TransactWriteItems":
            for item in params["TransactItems"]:
                ((kind, request),) = item.items()
                yield TRANSACT_ACTIONS[kind], self.logical(request["TableName"]), "dynamodb:LeadingKeys", pk(request)
        elif operation == "BatchGetItem":
            for table, request in params["RequestItems"].items():
                for item_key in request["Keys"]:
                    yield "dynamodb:BatchGetItem", self.logical(table), "dynamodb:LeadingKeys", item_key["pk"]["S"]
        elif operation == "BatchWriteItem":
            for table, writes in params["RequestItems"].items():
                for write in writes:
                    ((_, request),) = write.items()
                    yield "dynamodb:BatchWriteItem", self.logical(table), "dynamodb:LeadingKeys", pk(request)
        elif operation in ("GetItem", "PutItem", "UpdateItem", "DeleteItem"):
            yield ACTIONS[service, operation], self.logical(params["TableName"]), "dynamodb:LeadingKeys", pk(params)

    def _needs(self, service: str, operation: str, params: dict[str, Any]) -> Iterator[tuple[str, str]]:
        if service == "dynamodb" and operation == "TransactWriteItems":
            for item in params["TransactItems"]:
                ((kind, request),) = item.items()
                yield TRANSACT_ACTIONS[kind], self.logical(request["TableName"])
            return
        if service == "dynamodb" and operation in ("BatchGetItem", "BatchWriteItem"):
            for table in params["RequestItems"]:
                yield ACTIONS[service, operation], self.logical(table)
            return
        action = ACTIONS.get((service, operation))
        assert action, f"{service}.{operation} has no IAM action in this test: add it"
        if service == "dynamodb":
            resource = self.logical(params["TableName"])
            yield action, resource + (f"/index/{params['IndexName']}" if params.get("IndexName") else "")
        elif service == "s3":
            bucket = self.logical(params["Bucket"])
            if operation == "ListObjectsV2":
                yield action, bucket
            elif operation == "DeleteObjects":
                for obj in params["Delete"]["Objects"]:
                    yield "s3:DeleteObject", f"{bucket}/{obj['Key']}"
            else:
                yield action, f"{bucket}/{params['Key']}"
        elif service == "sqs":
            yield action, self.logical(params["QueueUrl"])
        elif service == "secretsmanager":
            yield action, self.logical(params["SecretId"])
        elif service == "events":
            for entry in params["Entries"]:
                yield action, f"event-bus/{entry.get('EventBusName') or 'default'}"


# ---------------------------------------------------------------- what the template grants


def queue_names(template: dict[str, Any]) -> dict[str, str]:
    """Queue logical id -> the name the template gives it, as the local stack resolves it
    (`${AWS::StackName}` is the local stack's name; models' queues are in nested stacks)."""
    resolver = TemplateResources(template, clients={})
    return {i: resolver.resolve(r["Properties"]["QueueName"]) for i, r in template["Resources"].items()
            if r.get("Type") == "AWS::SQS::Queue" and "QueueName" in (r.get("Properties") or {})}


def secret_names(template: dict[str, Any]) -> dict[str, str]:
    """Secret logical id -> the name the template gives it, as the local stack resolves it."""
    resolver = TemplateResources(template, clients={})
    return {i: resolver.resolve(r["Properties"]["Name"]) for i, r in template["Resources"].items()
            if r.get("Type") == "AWS::SecretsManager::Secret" and "Name" in (r.get("Properties") or {})}


_QUEUE_ARN = "arn:${AWS::Partition}:sqs:${AWS::Region}:${AWS::AccountId}:"
_EVENT_BUS_ARN = "arn:${AWS::Partition}:events:${AWS::Region}:${AWS::AccountId}:event-bus/"


def _resources(value: Any, template: dict[str, Any]) -> list[str]:
    """A statement's resource as `<LogicalId>[/rest]`; a queue ARN pattern (`<stack>-model-*`)
    as every queue of the template whose name it matches."""
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        resource, attribute = value["Fn::GetAtt"]
        assert attribute == "Arn", value
        return [resource]
    if isinstance(value, dict) and "Ref" in value:
        return [value["Ref"]]
    if isinstance(value, dict) and isinstance(value.get("Fn::Sub"), str):
        text = value["Fn::Sub"]
        if text.startswith(_QUEUE_ARN):
            pattern = text.removeprefix(_QUEUE_ARN)
            assert pattern.startswith("${AWS::StackName}-"), f"a queue pattern must stay in the stack's names: {text}"
            pattern = pattern.replace("${AWS::StackName}", LOCAL_STACK_NAME)
            matched = [i for i, name in queue_names(template).items() if fnmatch.fnmatchcase(name, pattern)]
            assert matched, f"{text} matches no queue of the template"
            return matched
        if text.startswith(_EVENT_BUS_ARN):
            # A bus named by a parameter: the bus of its default, which the scenario's functions use.
            bus = re.fullmatch(r"\$\{(\w+)\}", text.removeprefix(_EVENT_BUS_ARN))
            assert bus, f"an event bus must be named by a parameter: {text}"
            return [f"event-bus/{template['Parameters'][bus.group(1)]['Default']}"]
        match = re.fullmatch(r"\$\{([\w/]+)\.Arn\}(/.*)?", text)
        assert match, f"cannot read resource {value!r}"
        return [match.group(1) + (match.group(2) or "")]
    raise AssertionError(f"a resource must name a template resource, not {value!r}")


def grants(template: dict[str, Any], logical_id: str) -> set[tuple[str, str]]:
    """(action, resource pattern) for every Allow statement of a function's Policies."""
    out = set()
    for policy in function_properties(template, logical_id).get("Policies", []):
        assert isinstance(policy, dict) and set(policy) == {"Statement"}, (
            f"{logical_id}: only inline statements, no managed or SAM policy templates ({policy!r})")
        for statement in policy["Statement"]:
            assert statement["Effect"] == "Allow"
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            for action in actions:
                assert "*" not in action, f"{logical_id}: wildcard action {action}"
                out.update((action, name) for resource in resources for name in _resources(resource, template))
    return out


def statements(template: dict[str, Any], logical_id: str) -> list[tuple[set[str], list[str], dict[str, list[str]]]]:
    """(actions, resource patterns, condition key -> StringLike patterns) of each statement."""
    out = []
    for policy in function_properties(template, logical_id).get("Policies", []):
        for statement in policy["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            conditions: dict[str, list[str]] = {}
            for operator, tests in (statement.get("Condition") or {}).items():
                # Only the operators whose meaning this test knows: anything else fails it.
                assert operator in ("StringLike", "ForAllValues:StringLike"), f"{logical_id}: condition {operator}"
                for name, patterns in tests.items():
                    conditions[name] = patterns if isinstance(patterns, list) else [patterns]
            out.append((set(actions), [n for r in resources for n in _resources(r, template)], conditions))
    return out


def _granted(granted: set[tuple[str, str]], action: str, resource: str) -> bool:
    return any(a == action and fnmatch.fnmatchcase(resource, pattern) for a, pattern in granted)


# ---------------------------------------------------------------- the scenario


@pytest.fixture
def recorder(harness, monkeypatch) -> Recorder:
    template = load_template(TEMPLATE)
    rec = Recorder(template)
    make_api_call = BaseClient._make_api_call

    def recording(self: BaseClient, operation: str, params: dict[str, Any]) -> Any:
        rec.record(self.meta.service_model.service_name, operation, params)
        return make_api_call(self, operation, params)

    monkeypatch.setattr(BaseClient, "_make_api_call", recording)

    functions = {i: function_properties(template, i) for i in resources_of_type(template, "AWS::Serverless::Function")}
    queue_function = {}
    for logical_id, properties in functions.items():
        for event in properties.get("Events", {}).values():
            if event["Type"] == "SQS":
                queue_function[event["Properties"]["Queue"]["Fn::GetAtt"][0]] = logical_id
    api_function = next(i for i, p in functions.items() if p["CodeUri"].rstrip("/").endswith("api"))

    def as_function(handler: Callable, function: Callable[[], str]) -> Callable:
        def run(event: Any, context: Any) -> Any:
            # Each function has its own caches on AWS: one function's cached reads must not hide
            # another's calls here, where they share one process.
            caches.chunks.clear()
            rec.function = function()
            try:
                return handler(event, context)
            finally:
                rec.function = None
        return run

    pumping: list[str] = []
    harness.api_handler = as_function(harness.api_handler, lambda: api_function)
    harness.worker_handler = as_function(harness.worker_handler, lambda: queue_function[pumping[-1]])
    pump_once = harness.pump_once

    def pump(queue_url: str) -> int:
        pumping.append(rec.logical(queue_url))
        return pump_once(queue_url)

    harness.pump_once = pump
    rec.stream_handlers = {  # type: ignore[attr-defined]
        i: as_function(load_handler(Path(p["CodeUri"]).name, p["Handler"].partition(".")[2]), lambda i=i: i)
        for i, p in functions.items()
        if any(e["Type"] == "DynamoDB" for e in p.get("Events", {}).values())
    }
    rec.delivery_handlers = {  # type: ignore[attr-defined]  # SQS-triggered functions that are not workers
        event["Properties"]["Queue"]["Fn::GetAtt"][0]: as_function(
            load_handler(Path(p["CodeUri"]).name, p["Handler"].partition(".")[2]), lambda i=i: i)
        for i, p in functions.items()
        if "WORKER_MODEL" not in p["Environment"]["Variables"]
        for event in p.get("Events", {}).values() if event["Type"] == "SQS"
    }
    rec.schedules = {  # type: ignore[attr-defined]
        p["Handler"].partition(".")[2]: as_function(load_handler("schedules", p["Handler"].partition(".")[2]),
                                                    lambda i=i: i)
        for i, p in functions.items() if p["CodeUri"].rstrip("/").endswith("schedules")
    }
    return rec


def big_answer(letter: str) -> upstream.Outcome:
    body = {"object": "chat.completion", "choices": [{"message": {"content": letter * 400_000}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
    return upstream.Outcome("completed", response={"status_code": 200, "request_id": "r", "body": body})


class Receiver:
    """A webhook receiver on loopback: answers 500 while `failing`, else 204."""

    def __init__(self) -> None:
        self.failing = False
        self.got: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["content-length"]))
                receiver.got.append(self.headers["webhook-id"])
                self.send_response(500 if receiver.failing else 204)
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def manage_webhook_endpoints(harness, receiver: Receiver) -> tuple[str, str]:
    """Every webhook route once: an endpoint to the receiver and one to a port nobody listens on."""
    harness.configure(WEBHOOK_ALLOW_LOOPBACK_HTTP="true", WEBHOOK_RETRY_BASE_SECONDS=0,
                      # every call reads the signing key, so each function's read is seen
                      WEBHOOK_SIGNING_KEY_MAX_AGE_SECONDS=0)
    every = ["batch.completed", "batch.failed", "batch.expired", "batch.cancelled"]
    status, live = harness.call("POST", "/v1/webhook_endpoints", {"url": receiver.url, "name": "live",
                                                                  "event_types": every})
    assert status == 200, live
    closed = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    dead_url = f"http://127.0.0.1:{closed.server_port}/hook"
    closed.server_close()  # refused connections from now on
    status, dead = harness.call("POST", "/v1/webhook_endpoints", {"url": dead_url, "name": "dead",
                                                                  "event_types": every})
    assert status == 200, dead
    for method, path, body in (("GET", "/v1/webhook_endpoints", None),
                               ("GET", f"/v1/webhook_endpoints/{live['id']}", None),
                               ("POST", f"/v1/webhook_endpoints/{live['id']}", {"name": "live (renamed)"}),
                               ("POST", f"/v1/webhook_endpoints/{live['id']}/rotate_secret",
                                {"keep_old_secret_active_for_24_hours": True}),
                               ("POST", f"/v1/webhook_endpoints/{live['id']}/test", {"event_type": "batch.completed"}),
                               ("GET", "/v1/webhook_event_types", None)):
        status, answer = harness.call(method, path, body)
        assert status == 200, (path, answer)
    return live["id"], dead["id"]


def tell_status_changes(recorder: Recorder) -> None:
    """The batch table's stream, as its mapping gives it to the status-events function: MODIFY
    records of META items (the mapping's filter), in batches of 100."""
    # The regional endpoint: botocore derives an account-based one from a stream ARN, which
    # moto's in-process mock does not serve (the test's own client: the mapping's reads, not the function's)
    streams = boto3.client("dynamodbstreams", endpoint_url="https://streams.dynamodb.us-east-1.amazonaws.com")
    table = aws.dynamodb().describe_table(TableName=f"{LOCAL_STACK_NAME}-BatchTable")["Table"]
    stream_arn = table["LatestStreamArn"]
    records = []
    for shard in streams.describe_stream(StreamArn=stream_arn)["StreamDescription"]["Shards"]:
        iterator = streams.get_shard_iterator(StreamArn=stream_arn, ShardId=shard["ShardId"],
                                              ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        while iterator:
            page = streams.get_records(ShardIterator=iterator, Limit=1000)
            records += page["Records"]
            iterator = page.get("NextShardIterator") if page["Records"] else None
    told = [stream_record(r, stream_arn) for r in records
            if r["eventName"] == "MODIFY" and r["dynamodb"]["Keys"]["sk"]["S"] == "META"]
    assert told
    (handler,) = recorder.stream_handlers.values()  # type: ignore[attr-defined]
    for start in range(0, len(told), 100):
        answer = handler({"Records": told[start:start + 100]}, LambdaContext("status_events", 256, 60))
        assert answer == {"batchItemFailures": []}


def pump_deliveries(harness, recorder: Recorder) -> int:
    """One receive of the delivery queue given to its function, as its mapping would."""
    ((queue, handler),) = recorder.delivery_handlers.items()  # type: ignore[attr-defined]
    url, sqs = aws.sqs().get_queue_url(QueueName=queue_names(load_template(TEMPLATE))[queue])["QueueUrl"], aws.sqs()
    messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"]).get("Messages", [])
    if messages:
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        records = [sqs_record(m, arn) for m in messages]
        answer = handler({"Records": records}, LambdaContext("webhook_delivery", 256, 60))
        keep = failed_message_ids(answer, [r["messageId"] for r in records]) or set()
        for message, record in zip(messages, records, strict=True):
            if record["messageId"] not in keep:
                sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    return len(messages)


def deliver_webhooks(harness, recorder: Recorder, receiver: Receiver, live: str) -> None:
    # First attempts: the receiver answers 500 and the dead endpoint refuses, both retried (their
    # visibility set; the dead one marked unreachable)
    receiver.failing = True
    while pump_deliveries(harness, recorder):
        pass
    assert receiver.got
    # Then the receiver answers, and the dead endpoint's retry window is over: given up
    receiver.failing = False
    harness.configure(WEBHOOK_RETRY_WINDOW_SECONDS=1)
    harness.advance_clock(5)
    harness.run_until(lambda: not pump_deliveries(harness, recorder) and not _in_flight(harness, recorder))
    status, _ = harness.call("DELETE", f"/v1/webhook_endpoints/{live}")
    assert status == 200


def _in_flight(harness, recorder: Recorder) -> int:
    ((queue, _),) = recorder.delivery_handlers.items()  # type: ignore[attr-defined]
    url = aws.sqs().get_queue_url(QueueName=queue_names(load_template(TEMPLATE))[queue])["QueueUrl"]
    attributes = aws.sqs().get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesNotVisible"])


class WorkerDied(BaseException):
    """The Lambda running a request is killed mid-run: nothing cleans up."""


def run_scenario(harness, recorder: Recorder, monkeypatch) -> None:
    # The workers read the upstream credential from the template's secret, as deployed.
    secret_arn = aws._client("secretsmanager").describe_secret(
        SecretId=f"{LOCAL_STACK_NAME}-UpstreamApiKeySecret")["ARN"]
    # (max age 0: every run reads it, so each worker's read is seen, as on AWS where each has its own cache)
    harness.configure(UPSTREAM_API_KEY_SECRET=secret_arn, UPSTREAM_API_KEY_MAX_AGE_SECONDS=0)
    real_call = upstream.call

    def call(settings, body: bytes, **kwargs: Any) -> upstream.Outcome:
        if b"Dies" in body:
            raise WorkerDied
        return big_answer("A") if b"BigAnswer" in body else real_call(settings, body, **kwargs)

    monkeypatch.setattr(upstream, "call", call)
    context = LambdaContext("schedule", 512, 300)
    # An account with two concurrent requests: chains of both models wait for its slots and
    # wake each other (across queues).
    accounts.set_account(harness.settings, "acct-1", concurrency=2)
    receiver = Receiver()
    live, _ = manage_webhook_endpoints(harness, receiver)
    # A body too big for an item, whatever the compression (random text).
    big_body = base64.b64encode(random.Random(7).randbytes(450_000)).decode()

    def requests(tag: str) -> list[dict]:
        out = []
        for model in MODELS:
            out += [sample_request(f"{tag}-{model}-{i}", model=model) for i in range(5)]
            out += [sample_request(f"{tag}-{model}-retry", "[sim:fail=503*1] again", model=model),
                    sample_request(f"{tag}-{model}-big-answer", "BigAnswer", model=model)]
        return out

    status, first = harness.call("POST", "/v1/batches", {"requests": [*requests("a"),
                                                                    sample_request("big-body", big_body)]},
                                 headers={"idempotency-key": "scenario-first"})
    assert status == 200, first
    second = harness.create(requests("b"))
    # A create refused at the limit takes back what it stored, its S3 body included.
    harness.configure(BATCH_MAX_UNFINISHED=2)
    status, refused = harness.call("POST", "/v1/batches", {"requests": [sample_request("big-again", big_body)]})
    assert status == 429, refused
    harness.configure(BATCH_MAX_UNFINISHED=10)
    for batch in (first, second):
        assert harness.run_to_final(batch["id"], timeout=90)["status"] == "completed"
    status, page = harness.call("GET", f"/v1/batches/{first['id']}/results?limit=1000")
    assert status == 200 and len(page["data"]) == 15
    status, _ = harness.call("GET", "/v1/batches?limit=5")
    assert status == 200

    # A run that dies mid-request after settling one, and a message that is lost: the sweep counts
    # what the run settled (the account's usage), and takes both back.
    lost = harness.create([*(sample_request(f"d-{n}") for n in range(4)), sample_request("d-4", "Dies"),
                           sample_request("l-0", model=MODELS[1])])
    with pytest.raises(WorkerDied):
        harness.pump_once(harness.queues[MODELS[0]])
    sqs = aws.sqs()
    for message in sqs.receive_message(QueueUrl=harness.queues[MODELS[1]], MaxNumberOfMessages=10)["Messages"]:
        sqs.delete_message(QueueUrl=harness.queues[MODELS[1]], ReceiptHandle=message["ReceiptHandle"])
    harness.advance_clock(harness.settings.lease_seconds + harness.settings.batch_dispatch_lease_seconds + 60)
    recorder.schedules["sweep_handler"]({}, context)
    monkeypatch.setattr(upstream, "call", real_call)
    assert harness.run_to_final(lost["id"])["status"] == "completed"

    cancelled = harness.create([sample_request("c-0")])
    status, _ = harness.call("POST", f"/v1/batches/{cancelled['id']}/cancel")
    assert status == 200
    status, _ = harness.call("DELETE", f"/v1/batches/{first['id']}")
    assert status == 200

    expiring = harness.create([sample_request("e-0"), sample_request("e-1", model=MODELS[1])])
    harness.advance_clock(harness.settings.batch_completion_window_seconds + 3700)
    recorder.schedules["expire_handler"]({}, context)
    recorder.schedules["sweep_handler"]({}, context)
    harness.run_until(lambda: harness.batch(expiring["id"])["status"] == "expired")
    recorder.schedules["purge_handler"]({}, context)  # the deleted batch goes at once
    harness.advance_clock(harness.settings.batch_retention_seconds + 60)
    recorder.schedules["purge_handler"]({}, context)

    # Every status change above, told; each final one delivered to the two endpoints
    tell_status_changes(recorder)
    try:
        deliver_webhooks(harness, recorder, receiver, live)
    finally:
        receiver.close()


# Operations in the package that no function makes: (service, operation) -> who makes them.
NOT_BY_FUNCTIONS = {
    ("dynamodb", "PutItem"): "accounts_table.put_model_load: `admin set-load` (and the interactive gateway)",
    # Signed locally, no call: the GET it signs is authorized as the signer's s3:GetObject on
    # the response, which the API is granted (and uses) to read responses.
    ("s3", "GeneratePresignedUrl"): "request_items.response_url: the client's GET of a result's body_url",
    ("cloudwatch", "GetMetricData"): "metric_data.sums: `admin status` (recent_counts), an operator's credentials",
}


# Functions whose code makes no AWS call at all (so the scenario records none for them).
CALLS_NOTHING = {"ConsoleFunction"}


def package_operations() -> set[tuple[str, str]]:
    """Every AWS operation the package's code can call (`aws.<service>().<method>(...)`)."""
    found = {("secretsmanager", "GetSecretValue")}  # through Powertools Parameters (aws.secret_string)
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            client = node.func.value
            if (isinstance(client, ast.Call) and isinstance(client.func, ast.Attribute)
                    and isinstance(client.func.value, ast.Name) and client.func.value.id == "aws"):
                method = node.func.attr
                if method == "get_paginator":
                    method = node.args[0].value  # type: ignore[attr-defined]
                found.add((client.func.attr, "".join(part.title() for part in method.split("_"))))
    return found - set(NOT_BY_FUNCTIONS)


def needs_by_function(recorder: Recorder, template: dict[str, Any]) -> dict[str, set[tuple[str, str]]]:
    """What each function must be allowed. The workers run the same code, so what one was seen
    to need every worker needs: on its own queue what a worker did on its own, on every model's
    queue what a worker did on another's (waking another model's waiting chain)."""
    own_queue = _worker_queues(template)
    needs: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for function, action, resource in recorder.calls:
        needs[function].add((action, resource))
    shared = set()
    for worker, queue in own_queue.items():
        for action, resource in needs.pop(worker, set()):
            if resource == queue:
                shared.add((action, "<own>"))
            elif resource in own_queue.values():
                shared.update((action, q) for q in own_queue.values())
            else:
                shared.add((action, resource))
    for worker, queue in own_queue.items():
        needs[worker] = {(a, queue if r == "<own>" else r) for a, r in shared}
    return needs


def test_each_function_is_granted_what_it_calls_and_little_more(harness, recorder, monkeypatch):
    run_scenario(harness, recorder, monkeypatch)
    template = load_template(TEMPLATE)

    # The scenario reached every operation the code can make (else a grant could be missing).
    assert package_operations() <= recorder.operations, package_operations() - recorder.operations

    needs = needs_by_function(recorder, template)
    functions = resources_of_type(template, "AWS::Serverless::Function")
    # The console's function serves files and makes no AWS call: it is granted none (checked below).
    assert {f for f, calls in needs.items() if calls} == set(functions) - CALLS_NOTHING, "every function ran"

    for function in functions:
        granted = grants(template, function)
        missing = sorted((a, r) for a, r in needs[function] if not _granted(granted, a, r))
        assert not missing, f"{function} calls what its role does not allow: {missing}"
        unused = sorted(
            (action, pattern) for action, pattern in granted
            if not any(a == action and fnmatch.fnmatchcase(r, pattern) for a, r in needs[function])
            and (function, action, pattern) not in {**UNEXERCISED, **_cross_model_wakes(template)})
        assert not unused, f"{function} is granted what it never calls: {unused}"


def test_no_function_may_scan_or_delete_items_one_by_one() -> None:
    # The calls DynamoDBCrudPolicy used to allow on whole tables, which no code makes.
    template = load_template(TEMPLATE)
    for function in resources_of_type(template, "AWS::Serverless::Function"):
        actions = {action for action, _ in grants(template, function)}
        assert not actions & {"dynamodb:Scan", "dynamodb:DeleteItem", "dynamodb:DeleteTable"}, function


def test_no_statement_lists_every_models_queue() -> None:
    # A new model must need no IAM change: what reaches every model's queue does so by the
    # stack's name pattern; a model's queue named in a statement is a worker's own (the root
    # stack's own queues, the webhook deliveries' and status events', are named by their users).
    template = load_template(TEMPLATE)
    own = _worker_queues(template)
    for function in resources_of_type(template, "AWS::Serverless::Function"):
        for policy in function_properties(template, function).get("Policies", []):
            for statement in policy["Statement"]:
                listed = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
                queues = {r["Fn::GetAtt"][0] for r in listed if isinstance(r, dict) and "Fn::GetAtt" in r
                          and template["Resources"][r["Fn::GetAtt"][0]]["Type"] == "AWS::SQS::Queue"
                          and "/" in r["Fn::GetAtt"][0]}  # a model's nested stack's
                assert queues <= {own.get(function)}, f"{function} lists queues {sorted(queues)}"


def test_each_statements_conditions_allow_the_keys_and_prefixes_its_function_touches(harness, recorder, monkeypatch):
    # Given the scenario's calls, each with the leading key (pk) of every item and the prefix of
    # every S3 listing it touched
    run_scenario(harness, recorder, monkeypatch)
    template = load_template(TEMPLATE)
    assert recorder.keyed
    for function, action, resource, condition, value in sorted(recorder.keyed):
        # Then some statement granting the call also lets its condition through (a statement
        # without that condition key lets everything through)
        fits = [conditions for actions, patterns, conditions in statements(template, function)
                if action in actions and any(fnmatch.fnmatchcase(resource, p) for p in patterns)]
        assert any(condition not in conditions or any(fnmatch.fnmatchcase(value, p) for p in conditions[condition])
                   for conditions in fits), f"{function}: {action} on {resource} with {condition} {value!r} is refused"


def test_writes_to_the_accounts_table_and_bucket_listings_are_limited_to_their_partitions_and_prefixes():
    # The accounts table holds the API keys (KEY#): no function may write one (only the admin
    # CLI does), so each write statement names the partitions its function writes; and a listing
    # of the payload bucket is limited to the batches' prefixes.
    template = load_template(TEMPLATE)
    for function in resources_of_type(template, "AWS::Serverless::Function"):
        for actions, resources, conditions in statements(template, function):
            writes = actions & {"dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem",
                                "dynamodb:BatchWriteItem"}
            if writes and "AccountsTable" in resources:
                keys = conditions.get("dynamodb:LeadingKeys")
                assert keys and not any(fnmatch.fnmatchcase("KEY#x", k) for k in keys), (function, sorted(writes))
            if "s3:ListBucket" in actions:
                assert conditions.get("s3:prefix"), function
