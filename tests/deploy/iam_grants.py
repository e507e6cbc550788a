"""What template.yaml's roles grant, as the IAM tests read them: each function's statements as
(action, resource) pairs named by logical id (a queue ARN pattern as every queue it matches), and
the names the template gives its queues and secrets (as the local stack resolves them)."""

from __future__ import annotations

import fnmatch
import re
from typing import Any

from freeinference_batch_local.cloudformation.resources import TemplateResources
from freeinference_batch_local.cloudformation.template import function_properties, resources_of_type
from freeinference_batch_local.handlers import LOCAL_STACK_NAME


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
    """A statement's resource as `<LogicalId>[/rest]`; a queue ARN pattern (`<stack>-model_*`)
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


def is_granted(granted: set[tuple[str, str]], action: str, resource: str) -> bool:
    return any(a == action and fnmatch.fnmatchcase(resource, pattern) for a, pattern in granted)


def worker_queues(template: dict[str, Any]) -> dict[str, str]:
    """Worker function logical id -> the queue its SQS event reads: the models' workers
    (WORKER_MODEL), not the other SQS-triggered functions (the webhook deliveries)."""
    return {i: e["Properties"]["Queue"]["Fn::GetAtt"][0]
            for i in resources_of_type(template, "AWS::Serverless::Function")
            if "WORKER_MODEL" in (function_properties(template, i).get("Environment") or {}).get("Variables", {})
            for e in function_properties(template, i).get("Events", {}).values() if e["Type"] == "SQS"}


def cross_model_wakes(template: dict[str, Any]) -> dict[tuple[str, str, str], str]:
    queues = worker_queues(template)
    return {(worker, "sqs:ChangeMessageVisibility", other): "waking another model's waiting chain (an account's "
            "slots are shared by its models): whether the scenario's chains cross models is a matter of timing"
            for worker, own in queues.items() for other in queues.values() if other != own}
