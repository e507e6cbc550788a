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
import fnmatch
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from botocore.client import BaseClient
from freeinference_batch.store import caches
from freeinference_batch_local.cloudformation.template import function_properties, load_template, resources_of_type
from freeinference_batch_local.handlers import load_handler

from tests.deploy.iam_calls import Recorder
from tests.deploy.iam_grants import cross_model_wakes, grants, is_granted, statements, worker_queues
from tests.deploy.iam_scenario import run_scenario

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "template.yaml"
PACKAGE = REPO / "layers" / "batch_core" / "freeinference_batch"


# Grants the scenario does not exercise, each with why the code needs it: (function, action, resource).
UNEXERCISED: dict[tuple[str, str, str], str] = {
    ("StatusEventsFunction", "sqs:SendMessage", "StatusEventsDeadLetterQueue"):
        "the stream mapping's OnFailure destination, which Lambda writes with the function's role (no code of ours)",
    # A download's presigned GET (files.content) is authorized as its signer's s3:GetObject; the
    # API reads no whole input file or batch output file itself.
    ("ApiFunction", "s3:GetObject", "PayloadBucket/files/*"):
        "files/operations.content_url: the SDK's GET of a joined or files.create input file",
    ("ApiFunction", "s3:GetObject", "PayloadBucket/batch_*/files/*"):
        "files/operations.content_url: the SDK's GET of a batch's output or error file",
}


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
    queue_handlers = {  # SQS-triggered functions that are not workers, by their queue
        event["Properties"]["Queue"]["Fn::GetAtt"][0]: as_function(
            load_handler(Path(p["CodeUri"]).name, p["Handler"].partition(".")[2]), lambda i=i: i)
        for i, p in functions.items()
        if "WORKER_MODEL" not in p["Environment"]["Variables"]
        for event in p.get("Events", {}).values() if event["Type"] == "SQS"
    }
    rec.job_handler = queue_handlers.pop("BatchJobsQueue")  # type: ignore[attr-defined]
    rec.delivery_handlers = queue_handlers  # type: ignore[attr-defined]
    rec.schedules = {  # type: ignore[attr-defined]
        p["Handler"].partition(".")[2]: as_function(load_handler("schedules", p["Handler"].partition(".")[2]),
                                                    lambda i=i: i)
        for i, p in functions.items() if p["CodeUri"].rstrip("/").endswith("schedules")
    }
    return rec


# Operations in the package that no function makes: (service, operation) -> who makes them.
NOT_BY_FUNCTIONS = {
    ("dynamodb", "PutItem"): "accounts_table.put_model_load: `admin set-load` (and the interactive gateway)",
    # Signed locally, no call: the GET it signs is authorized as the signer's s3:GetObject on
    # the response, which the API is granted (and uses) to read responses.
    ("s3", "GeneratePresignedUrl"): "request_items.response_url: the client's GET of a result's body_url",
    ("cloudwatch", "GetMetricData"): "metric_data.sums: `admin status` (recent_counts), an operator's credentials",
    ("dynamodb", "Scan"): "accounts_table.account_items: `admin migrate-account-settings`, an operator's credentials",
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
    own_queue = worker_queues(template)
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
        missing = sorted((a, r) for a, r in needs[function] if not is_granted(granted, a, r))
        assert not missing, f"{function} calls what its role does not allow: {missing}"
        unused = sorted(
            (action, pattern) for action, pattern in granted
            if not any(a == action and fnmatch.fnmatchcase(r, pattern) for a, r in needs[function])
            and (function, action, pattern) not in {**UNEXERCISED, **cross_model_wakes(template)})
        assert not unused, f"{function} is granted what it never calls: {unused}"


def allows(template: dict[str, Any], function: str, action: str, resource: str, condition: str, value: str) -> bool:
    """Whether some statement of the function's granting `action` on `resource` lets `value` of
    `condition` through (a statement without that condition key lets everything through)."""
    fits = [conditions for actions, patterns, conditions in statements(template, function)
            if action in actions and any(fnmatch.fnmatchcase(resource, p) for p in patterns)]
    return any(condition not in conditions or any(fnmatch.fnmatchcase(value, p) for p in conditions[condition])
               for conditions in fits)


ACCOUNTS_TABLE_WRITES = ("dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem", "dynamodb:BatchWriteItem")


def test_each_statements_conditions_allow_the_keys_and_prefixes_its_function_touches(harness, recorder, monkeypatch):
    # Given the scenario's calls, each with the leading key (pk) of every item and the prefix of
    # every S3 listing it touched
    run_scenario(harness, recorder, monkeypatch)
    template = load_template(TEMPLATE)
    assert recorder.keyed
    for function, action, resource, condition, value in sorted(recorder.keyed):
        # Then some statement granting the call also lets its condition through
        assert allows(template, function, action, resource, condition, value), (
            f"{function}: {action} on {resource} with {condition} {value!r} is refused")

    # And no function can change an account's tier, status, quota or concurrency: the API (each
    # call's authentication) and the workers (the gates) read them from the account's settings
    # item, SETTINGS#<id>, and no function's role may write there (only the admin CLI, with an
    # operator's credentials, does).
    settings_reads = {(function, action) for function, action, resource, _, value in recorder.keyed
                      if resource == "AccountsTable" and value.startswith("SETTINGS#")}
    workers = set(worker_queues(template))
    assert ("ApiFunction", "dynamodb:BatchGetItem") in settings_reads
    assert {f for f, a in settings_reads if a == "dynamodb:BatchGetItem"} & workers, settings_reads
    assert not {a for _, a in settings_reads} & set(ACCOUNTS_TABLE_WRITES), settings_reads
    for function in resources_of_type(template, "AWS::Serverless::Function"):
        for action in ACCOUNTS_TABLE_WRITES:
            assert not allows(template, function, action, "AccountsTable", "dynamodb:LeadingKeys", "SETTINGS#acct-1"), (
                f"{function} may {action} an account's settings")
