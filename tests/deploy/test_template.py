"""template.yaml's queues, models and tables: the invariants the rest of the system relies on.

The local stack creates its resources from this template, so a mistake here (a queue without a
dead-letter queue, a mapping allowed more concurrency than its function, a model's block that
disagrees with the catalog) would show up locally too, not only on AWS.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

from freeinference_batch.core.catalog import Catalog, ModelInfo
from freeinference_batch.core.settings import Settings
from freeinference_batch.worker.memory import FUNCTION_MEMORY_MB
from freeinference_batch_local.cloudformation.resources import TemplateResources
from freeinference_batch_local.cloudformation.template import load_template, resources_of_type

from tests.deploy.templates import (
    MODEL_TEMPLATE,
    REPO,
    TEMPLATE,
    events_of_type,
    getatt_resource,
    worker_functions,
)


def _on_failure_destinations(functions: dict[str, dict[str, Any]]) -> set[str]:
    """Queues a stream mapping sends the records it gave up on to (DestinationConfig.OnFailure)."""
    return {
        getatt_resource(event["DestinationConfig"]["OnFailure"]["Destination"])
        for properties in functions.values()
        for event in events_of_type(properties, "DynamoDB")
        if "OnFailure" in (event.get("DestinationConfig") or {})
    }


def test_every_queue_has_a_dead_letter_queue(template: dict[str, Any],
                                             functions: dict[str, dict[str, Any]]) -> None:
    queues = resources_of_type(template, "AWS::SQS::Queue")
    dead_letter = {
        getatt_resource(q["Properties"]["RedrivePolicy"]["deadLetterTargetArn"])
        for q in queues.values()
        if "RedrivePolicy" in q.get("Properties", {})
    }
    # A stream mapping's OnFailure queue is a dead-letter queue too: nothing consumes it, an
    # operator reads it (README runbook), so it needs none of its own.
    on_failure = _on_failure_destinations(functions)
    assert on_failure <= set(queues), on_failure - set(queues)
    assert not on_failure & dead_letter
    work_queues = set(queues) - dead_letter - on_failure
    assert work_queues, "no work queues"
    max_attempts = template["Parameters"]["MaxAttempts"]["MaxValue"]
    for logical_id in work_queues:
        policy = queues[logical_id]["Properties"].get("RedrivePolicy")
        assert policy, f"{logical_id} has no RedrivePolicy"
        assert getatt_resource(policy["deadLetterTargetArn"]) in queues
        if logical_id == "BatchJobsQueue":
            # A job's step never parks: a receive is a step that failed, and a few are enough.
            assert 3 <= policy["maxReceiveCount"] <= 10
            continue
        # Each park is a receive; our own attempt counter decides retries, not SQS's.
        assert policy["maxReceiveCount"] >= max(100, 10 * max_attempts), logical_id


def test_sqs_mappings_respect_concurrency_and_visibility(
    template: dict[str, Any], functions: dict[str, dict[str, Any]]
) -> None:
    queues = resources_of_type(template, "AWS::SQS::Queue")
    mapped = 0
    for logical_id, properties in functions.items():
        for event in events_of_type(properties, "SQS"):
            mapped += 1
            reserved = properties.get("ReservedConcurrentExecutions")
            assert reserved, f"{logical_id}: an SQS worker needs reserved concurrency"
            assert event["ScalingConfig"]["MaximumConcurrency"] <= reserved, logical_id
            assert event["FunctionResponseTypes"] == ["ReportBatchItemFailures"], logical_id
            queue = queues[getatt_resource(event["Queue"])]["Properties"]
            # AWS's guidance: visibility >= 6 x function timeout + batching window.
            window = event.get("MaximumBatchingWindowInSeconds", 0)
            assert queue["VisibilityTimeout"] >= 6 * properties["Timeout"] + window, logical_id
    assert mapped


def test_each_model_has_its_own_queue_and_worker(
    template: dict[str, Any], functions: dict[str, dict[str, Any]]
) -> None:
    packaged = resources.files("freeinference_batch.core").joinpath("models.json")
    catalog = Catalog.model_validate_json(packaged.read_text())
    names = TemplateResources(template, clients={})  # resolves names only: creates nothing
    prefix = names.resolve(template["Globals"]["Function"]["Environment"]["Variables"]["MODEL_QUEUE_URL_PREFIX"])
    settings = Settings(MODEL_QUEUE_URL_PREFIX=prefix)  # type: ignore[call-arg]
    worker_queue = {}
    for logical_id, properties in worker_functions(functions).items():
        for event in events_of_type(properties, "SQS"):
            model = properties["Environment"]["Variables"]["WORKER_MODEL"]
            assert model not in worker_queue, f"two workers for {model}"
            queue = template["Resources"][getatt_resource(event["Queue"])]
            worker_queue[model] = names.resolve(queue["Properties"]["QueueName"])
            # Both caps are the one the catalog derives from the model's batch capacity; the
            # number is written in the model's block (CloudFormation cannot compute it).
            info = catalog.models[model]
            must = (f"template.yaml block {logical_id.split('/')[0]}: WorkerConcurrency must be "
                    f"{info.worker_concurrency} (2 x batch_concurrency {info.batch_concurrency} of {model} in "
                    "models.json; README \"Sizing a model\")")
            assert properties["ReservedConcurrentExecutions"] == info.worker_concurrency, must
            assert event["ScalingConfig"]["MaximumConcurrency"] == info.worker_concurrency, must
            sizes = (f"template.yaml block {logical_id.split('/')[0]}: WorkerBatchSize must be "
                     f"{info.worker_batch_size} and WorkerBatchingWindowSeconds "
                     f"{info.worker_batching_window_seconds} (for batch_concurrency {info.batch_concurrency} of "
                     f"{model} in models.json; README \"Sizing a model\")")
            assert event["BatchSize"] == info.worker_batch_size, sizes
            assert event["MaximumBatchingWindowInSeconds"] == info.worker_batching_window_seconds, sizes
    assert set(worker_queue) == set(catalog.models)
    # The code finds each model's queue by name: the URL it derives is the queue's URL.
    for model, queue_name in worker_queue.items():
        assert settings.model_queue_url(model).rsplit("/", 1)[1] == queue_name, model


PER_MODEL_PARAMETERS = ("ModelId", "WorkerConcurrency", "WorkerBatchSize", "WorkerBatchingWindowSeconds")


def test_every_model_block_passes_the_same_shared_resources() -> None:
    # One block per model: its ModelId and its sizes, then the same shared values.
    root = load_template(TEMPLATE, nested=False)
    child = load_template(MODEL_TEMPLATE, nested=False)
    applications = {i: r["Properties"] for i, r in resources_of_type(root, "AWS::Serverless::Application").items()}
    blocks = {i: p for i, p in applications.items() if p["Location"] == "model/template.yaml"}
    assert blocks, "no model blocks"
    # The one other nested application is the alarms'.
    assert [p["Location"] for i, p in applications.items() if i not in blocks] == ["monitoring/template.yaml"]
    shared = []
    for logical_id, properties in blocks.items():
        assert set(properties["Parameters"]) == set(child["Parameters"]), logical_id
        shared.append({k: v for k, v in properties["Parameters"].items() if k not in PER_MODEL_PARAMETERS})
    assert all(values == shared[0] for values in shared)
    assert shared[0]["StackName"] == {"Ref": "AWS::StackName"}


def test_a_worker_has_the_environment_every_function_has(
    template: dict[str, Any], functions: dict[str, dict[str, Any]]
) -> None:
    # A nested stack has its own Globals: model/template.yaml repeats the root's environment,
    # and must keep repeating it as it is (plus what only a worker has).
    global_env = template["Globals"]["Function"]["Environment"]["Variables"]
    assert worker_functions(functions)
    for logical_id, properties in worker_functions(functions).items():
        if events_of_type(properties, "SQS"):
            own = properties["Environment"]["Variables"]
            assert {k: v for k, v in own.items() if k not in ("WORKER_MODEL", "UPSTREAM_API_KEY_SECRET")} == global_env
            assert own["UPSTREAM_API_KEY_SECRET"] == {"Ref": "UpstreamApiKeySecret"}, logical_id
            for key in ("Runtime", "Architectures", "Tracing", "Layers"):
                assert properties[key] == template["Globals"]["Function"][key], (logical_id, key)
            # Its own memory, which its permits for large requests are sized by by default
            assert properties["MemorySize"] == FUNCTION_MEMORY_MB, logical_id


def test_queue_names_fit_sqs_for_the_documented_stack_name_length(template: dict[str, Any]) -> None:
    # README: the stack name is at most 55 characters; SQS names are at most 80.
    names = TemplateResources(template, clients={})
    for logical_id, queue in resources_of_type(template, "AWS::SQS::Queue").items():
        name = names.resolve(queue["Properties"]["QueueName"])
        assert len(name.replace(names.stack_name, "s" * 55)) <= 80, (logical_id, name)


def test_batch_table_matches_the_architecture(template: dict[str, Any]) -> None:
    table = template["Resources"]["BatchTable"]
    assert table["DeletionPolicy"] == table["UpdateReplacePolicy"] == "Retain"
    properties = table["Properties"]
    assert properties["BillingMode"] == "PAY_PER_REQUEST"
    assert properties["TimeToLiveSpecification"] == {"AttributeName": "ttl", "Enabled": True}
    types = {a["AttributeName"]: a["AttributeType"] for a in properties["AttributeDefinitions"]}
    indexes = {
        index["IndexName"]: [(k["AttributeName"], types[k["AttributeName"]]) for k in index["KeySchema"]]
        for index in properties["GlobalSecondaryIndexes"]
        if index["Projection"] == {"ProjectionType": "KEYS_ONLY"}
    }
    assert [(k["AttributeName"], types[k["AttributeName"]]) for k in properties["KeySchema"]] == [
        ("pk", "S"),
        ("sk", "S"),
    ]
    assert indexes == {
        "owner-index": [("owner", "S"), ("created_key", "S")],
        "open-index": [("open_shard", "S"), ("expires_at", "N")],
        "purge-index": [("purge_shard", "S"), ("purge_at", "N")],
    }


def test_reserved_concurrency_leaves_the_account_pool_documented(template: dict[str, Any]) -> None:
    readme = (REPO / "README.md").read_text()
    assert "admin --stack-name freeinference-batch --region us-east-1 preflight" in readme
    assert "100" in readme.split("### Lambda concurrency")[1].split("###")[0]


def test_the_readme_sizing_table_is_the_catalog_rule() -> None:
    # The operator sizes a model from this table, not from the code: each row must be what the
    # catalog derives, and its largest capacity must be one the catalog takes.
    section = (REPO / "README.md").read_text().split("### Sizing a model\n")[1].split("\n### ")[0]
    rows = [tuple(int(cell) for cell in line.strip("|").split("|")) for line in section.splitlines()
            if re.fullmatch(r"(\| \d+ )+\|", line)]
    assert [row[0] for row in rows] == [4, 16, 64, 128, 500]
    for row in rows:
        info = ModelInfo(input_usd_per_million_tokens=0, output_usd_per_million_tokens=0, tiers=[],
                         batch_concurrency=row[0])
        derived = (info.batch_concurrency, info.worker_concurrency, info.worker_batch_size,
                   info.worker_batching_window_seconds)
        assert row == derived, f"README row {row[0]}: it is {derived}"
    words = " ".join(section.split())
    assert "needs a quota increase first" in words and "admin --stack-name … preflight" in words
