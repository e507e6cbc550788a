"""What no statement of template.yaml's roles may allow, whatever the code calls: scans or
item-by-item deletes, a list of every model's queue (a new model needs no IAM change), a queue
pattern another stack's queues fall into, a write to the accounts table outside the partitions
its function writes, a listing of the payload bucket outside the batches' prefixes."""

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
    # The accounts table holds the API keys (KEY#) and the accounts' settings (SETTINGS#: tier,
    # status, quota, concurrency): no function may write one (only the admin CLI does), so each
    # write statement names the partitions its function writes; and a listing
    # of the payload bucket is limited to the batches' prefixes.
    template = load_template(TEMPLATE)
    for function in resources_of_type(template, "AWS::Serverless::Function"):
        for actions, resources, conditions in statements(template, function):
            writes = actions & {"dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem",
                                "dynamodb:BatchWriteItem"}
            if writes and "AccountsTable" in resources:
                keys = conditions.get("dynamodb:LeadingKeys")
                assert keys and not any(fnmatch.fnmatchcase(admins, k) for k in keys
                                        for admins in ("KEY#x", "SETTINGS#x")), (function, sorted(writes))
            if "s3:ListBucket" in actions:
                assert conditions.get("s3:prefix"), function


def _queue_name_formats(template: dict) -> list[str]:
    """Each queue's QueueName as a format over the stack name and the model's queue suffix."""
    formats = []
    for resource in template["Resources"].values():
        if resource.get("Type") != "AWS::SQS::Queue":
            continue
        name = resource["Properties"]["QueueName"]["Fn::Sub"]
        text = name[0] if isinstance(name, list) else name
        assert text.startswith("${AWS::StackName}-"), text
        formats.append(text.replace("${AWS::StackName}", "{stack}").replace("${Suffix}", "{suffix}"))
    return formats


def _queue_patterns(template: dict) -> set[str]:
    """Every queue ARN pattern a statement allows, as a name pattern over the stack name."""
    prefix = "arn:${AWS::Partition}:sqs:${AWS::Region}:${AWS::AccountId}:"
    patterns = set()
    for function in resources_of_type(template, "AWS::Serverless::Function"):
        for policy in function_properties(template, function).get("Policies", []):
            for statement in policy["Statement"]:
                listed = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
                for resource in listed:
                    text = resource.get("Fn::Sub") if isinstance(resource, dict) else None
                    if isinstance(text, str) and text.startswith(prefix):
                        patterns.add(text.removeprefix(prefix).replace("${AWS::StackName}", "{stack}"))
    return patterns


def test_no_queue_pattern_matches_the_queues_of_another_stack_of_this_template() -> None:
    # Given stacks whose names extend each other (a stack name holds letters, digits and "-"),
    # with model ids as odd as the catalog allows ("_" included)
    template = load_template(TEMPLATE)
    patterns, formats = _queue_patterns(template), _queue_name_formats(template)
    assert patterns and any("{suffix}" in f for f in formats)
    base = "fib"
    stacks = [base, f"{base}-model", f"{base}-model-q", f"{base}-dlq", f"{base}-model-x-dlq", f"{base}-webhook"]
    suffixes = ["glm-5-3-flash", "model_x", "q-x", "x", "dlq_model_x"]
    for own in stacks:
        for other in stacks:
            if other == own:
                continue
            others_queues = {f.format(stack=other, suffix=s) for f in formats for s in suffixes}
            for pattern in patterns:
                # Then no queue another stack names is in a pattern of this stack's roles
                caught = sorted(q for q in others_queues if fnmatch.fnmatchcase(q, pattern.format(stack=own)))
                assert not caught, f"stack {own!r}'s {pattern} matches stack {other!r}'s queues {caught}"
    # And each pattern still matches its own stack's model queues
    for pattern in patterns:
        assert any(fnmatch.fnmatchcase(f.format(stack=base, suffix="m"), pattern.format(stack=base)) for f in formats)
