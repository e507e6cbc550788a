"""What no statement of template.yaml's roles may allow, whatever the code calls: scans or
item-by-item deletes, a list of every model's queue (a new model needs no IAM change), a write to
the accounts table outside the partitions its function writes, a listing of the payload bucket
outside the batches' prefixes."""

from __future__ import annotations

import fnmatch
from pathlib import Path

from freeinference_batch_local.cloudformation.template import function_properties, load_template, resources_of_type

from tests.deploy.iam_grants import grants, statements, worker_queues

TEMPLATE = Path(__file__).resolve().parents[2] / "template.yaml"


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
    own = worker_queues(template)
    for function in resources_of_type(template, "AWS::Serverless::Function"):
        for policy in function_properties(template, function).get("Policies", []):
            for statement in policy["Statement"]:
                listed = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
                queues = {r["Fn::GetAtt"][0] for r in listed if isinstance(r, dict) and "Fn::GetAtt" in r
                          and template["Resources"][r["Fn::GetAtt"][0]]["Type"] == "AWS::SQS::Queue"
                          and "/" in r["Fn::GetAtt"][0]}  # a model's nested stack's
                assert queues <= {own.get(function)}, f"{function} lists queues {sorted(queues)}"


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
