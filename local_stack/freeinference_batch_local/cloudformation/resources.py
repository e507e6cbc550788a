"""CloudFormation, as far as the local stack needs it: the template's tables, queues, bucket and
secrets created on the moto server from their `Properties`, and every `Ref` / `Fn::GetAtt` /
`Fn::Sub` / `Fn::Join` / `Fn::Split` / `Fn::Select` resolved to them as CloudFormation would
(pseudo parameters, parameter defaults, resource attributes). The functions' environment is the
template's `Globals.Function.Environment.Variables` resolved here (`template_environment`), and
each function's own variables on top (`function_environments`), each value rendered as
CloudFormation renders a value in a string (`env_string`).

Reading the file (short-form tags, nested applications expanded) is `template.py`'s.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from collections.abc import Mapping
from typing import Any

from freeinference_batch_local.cloudformation.template import function_properties
from freeinference_batch_local.handlers import LOCAL_ACCOUNT_ID, LOCAL_REGION, LOCAL_STACK_NAME

log = logging.getLogger(__name__)

_SUPPORTED_TYPES = ("AWS::DynamoDB::Table", "AWS::SQS::Queue", "AWS::S3::Bucket", "AWS::SecretsManager::Secret")
_PSEUDO = {
    "AWS::Region": LOCAL_REGION,
    "AWS::AccountId": LOCAL_ACCOUNT_ID,
    "AWS::StackName": LOCAL_STACK_NAME,
    "AWS::StackId": f"arn:aws:cloudformation:{LOCAL_REGION}:{LOCAL_ACCOUNT_ID}:stack/{LOCAL_STACK_NAME}/0",
    "AWS::Partition": "aws",
    "AWS::URLSuffix": "amazonaws.com",
}
# Attribute names of SQS queue properties that pass through as-is (CloudFormation -> SetQueueAttributes).
_QUEUE_ATTRIBUTES = (
    "ContentBasedDeduplication",
    "DeduplicationScope",
    "DelaySeconds",
    "FifoQueue",
    "FifoThroughputLimit",
    "KmsDataKeyReusePeriodSeconds",
    "KmsMasterKeyId",
    "MaximumMessageSize",
    "MessageRetentionPeriod",
    "ReceiveMessageWaitTimeSeconds",
    "SqsManagedSseEnabled",
    "VisibilityTimeout",
)
_SUB_VARIABLE = re.compile(r"\$\{([^}]*)\}")


class TemplateResources:
    """Creates the template's tables, queues and buckets on demand and resolves intrinsics to them.

    `resolve()` creates a resource the first time something refers to it, so a queue's dead-letter
    queue exists before the queue's RedrivePolicy names its ARN, with no dependency sorting.
    """

    def __init__(self, template: dict[str, Any], clients: dict[str, Any], stack_name: str = LOCAL_STACK_NAME):
        self.template = template
        self.resources: dict[str, dict[str, Any]] = template.get("Resources") or {}
        self.parameters: dict[str, dict[str, Any]] = template.get("Parameters") or {}
        self.clients = clients
        self.stack_name = stack_name
        self.physical: dict[str, dict[str, Any]] = {}  # logical id -> {"Ref": ..., attribute: ...}
        self._creating: set[str] = set()

    def create_all(self) -> dict[str, dict[str, Any]]:
        for logical_id, resource in self.resources.items():
            if resource.get("Type") in _SUPPORTED_TYPES:
                self.ensure(logical_id)
        return self.physical

    def queue_urls_by_arn(self) -> dict[str, str]:
        """Each created queue's URL by its ARN (an event source names its queue by ARN)."""
        return {physical["Arn"]: physical["QueueUrl"] for physical in self.physical.values() if "QueueUrl" in physical}

    def ensure(self, logical_id: str) -> dict[str, Any]:
        if logical_id in self.physical:
            return self.physical[logical_id]
        resource = self.resources.get(logical_id)
        if resource is None:
            raise KeyError(f"template has no resource {logical_id!r}")
        kind = resource.get("Type")
        if kind not in _SUPPORTED_TYPES:
            raise ValueError(f"the local stack cannot create {logical_id} ({kind}); only {', '.join(_SUPPORTED_TYPES)}")
        if logical_id in self._creating:
            raise ValueError(f"circular reference through {logical_id}")
        if "Condition" in resource:
            log.warning("%s has a Condition; the local stack creates it regardless", logical_id)
        self._creating.add(logical_id)
        try:
            properties = self.resolve(resource.get("Properties") or {})
            create = {
                "AWS::DynamoDB::Table": self._table,
                "AWS::SQS::Queue": self._queue,
                "AWS::S3::Bucket": self._bucket,
                "AWS::SecretsManager::Secret": self._secret,
            }[kind]
            self.physical[logical_id] = create(logical_id, properties)
        finally:
            self._creating.discard(logical_id)
        log.debug("created %s: %s", logical_id, self.physical[logical_id]["Ref"])
        return self.physical[logical_id]

    def _name(self, logical_id: str, limit: int) -> str:
        return f"{self.stack_name}-{logical_id}"[:limit]

    def _table(self, logical_id: str, properties: dict[str, Any]) -> dict[str, Any]:
        name = properties.get("TableName") or self._name(logical_id, 255)
        request: dict[str, Any] = {
            "TableName": name,
            "KeySchema": properties["KeySchema"],
            "AttributeDefinitions": properties["AttributeDefinitions"],
            "BillingMode": properties.get("BillingMode", "PROVISIONED"),
        }
        if request["BillingMode"] == "PROVISIONED":
            request["ProvisionedThroughput"] = properties.get(
                "ProvisionedThroughput", {"ReadCapacityUnits": 5, "WriteCapacityUnits": 5}
            )
        if properties.get("GlobalSecondaryIndexes"):
            request["GlobalSecondaryIndexes"] = [
                {
                    key: index[key]
                    for key in ("IndexName", "KeySchema", "Projection", "ProvisionedThroughput")
                    if key in index
                }
                for index in properties["GlobalSecondaryIndexes"]
            ]
        if properties.get("LocalSecondaryIndexes"):
            request["LocalSecondaryIndexes"] = [
                {key: index[key] for key in ("IndexName", "KeySchema", "Projection") if key in index}
                for index in properties["LocalSecondaryIndexes"]
            ]
        if properties.get("StreamSpecification"):
            request["StreamSpecification"] = {"StreamEnabled": True, **properties["StreamSpecification"]}
        dynamodb = self.clients["dynamodb"]
        description = dynamodb.create_table(**request)["TableDescription"]
        ttl = properties.get("TimeToLiveSpecification")
        if ttl and truthy(ttl.get("Enabled")):
            dynamodb.update_time_to_live(
                TableName=name,
                TimeToLiveSpecification={"Enabled": True, "AttributeName": ttl["AttributeName"]},
            )
        return {
            "Ref": name,
            "Arn": description["TableArn"],
            "StreamArn": description.get("LatestStreamArn", ""),
        }

    def _queue(self, logical_id: str, properties: dict[str, Any]) -> dict[str, Any]:
        fifo = truthy(properties.get("FifoQueue"))
        name = properties.get("QueueName") or self._name(logical_id, 75 if fifo else 80) + (".fifo" if fifo else "")
        attributes = {key: _attribute(properties[key]) for key in _QUEUE_ATTRIBUTES if key in properties}
        for key in ("RedrivePolicy", "RedriveAllowPolicy"):
            if key in properties:
                value = properties[key]
                attributes[key] = value if isinstance(value, str) else json.dumps(value)
        sqs = self.clients["sqs"]
        url = sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        return {"Ref": url, "Arn": arn, "QueueName": name, "QueueUrl": url}

    def _bucket(self, logical_id: str, properties: dict[str, Any]) -> dict[str, Any]:
        name = properties.get("BucketName") or re.sub(r"[^a-z0-9.-]", "-", self._name(logical_id, 63).lower())
        self.clients["s3"].create_bucket(Bucket=name)
        return {
            "Ref": name,
            "Arn": f"arn:aws:s3:::{name}",
            "DomainName": f"{name}.s3.amazonaws.com",
            "RegionalDomainName": f"{name}.s3.{LOCAL_REGION}.amazonaws.com",
        }

    def _secret(self, logical_id: str, properties: dict[str, Any]) -> dict[str, Any]:
        # As CloudFormation does: the given SecretString, else a generated value (the template's
        # secrets are placeholders an operator replaces; the simulated upstream ignores them).
        name = properties.get("Name") or self._name(logical_id, 512)
        value = properties.get("SecretString")
        if value is None:
            value = secrets.token_urlsafe(24)
        arn = self.clients["secretsmanager"].create_secret(Name=name, SecretString=value)["ARN"]
        return {"Ref": arn, "Id": arn}

    # ------------------------------------------------------------ intrinsics

    def resolve(self, value: Any, used: set[str] | None = None) -> Any:
        """`value` with intrinsics resolved; logical ids of resources it refers to are added to `used`."""
        if isinstance(value, list):
            return [self.resolve(item, used) for item in value]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            ((key, argument),) = value.items()
            if key == "Ref":
                return self._ref(argument, used)
            if key == "Fn::GetAtt":
                resource, attribute = argument.split(".", 1) if isinstance(argument, str) else argument
                return self._get_att(resource, attribute, used)
            if key == "Fn::Sub":
                return self._sub(argument, used)
            if key == "Fn::Join":
                delimiter, items = argument
                return str(delimiter).join(env_string(item) for item in self.resolve(items, used))
            if key == "Fn::Split":
                delimiter, source = argument
                return str(self.resolve(source, used)).split(str(delimiter))
            if key == "Fn::Select":
                index, items = argument
                return self.resolve(items, used)[int(self.resolve(index, used))]
            if key.startswith("Fn::"):
                raise ValueError(f"the local stack does not resolve {key}; keep local-stack properties literal")
        return {key: self.resolve(item, used) for key, item in value.items()}

    def _ref(self, name: str, used: set[str] | None) -> Any:
        if name in _PSEUDO:
            return _PSEUDO[name]
        if name in self.parameters:
            return self.parameters[name].get("Default", "")
        if used is not None:
            used.add(name)
        return self.ensure(name)["Ref"]

    def _get_att(self, resource: str, attribute: str, used: set[str] | None) -> Any:
        if used is not None:
            used.add(resource)
        physical = self.ensure(resource)
        if attribute not in physical:
            raise ValueError(f"the local stack has no {resource}.{attribute}")
        return physical[attribute]

    def _sub(self, argument: Any, used: set[str] | None) -> str:
        text, variables = (argument, {}) if isinstance(argument, str) else argument
        values = {name: self.resolve(item, used) for name, item in variables.items()}

        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            if name.startswith("!"):
                return "${" + name[1:] + "}"
            if name in values:
                return env_string(values[name])
            if "." in name and name.split(".", 1)[0] not in self.parameters:
                return env_string(self._get_att(*name.split(".", 1), used))
            return env_string(self._ref(name, used))

        return _SUB_VARIABLE.sub(replace, text)


def truthy(value: Any) -> bool:
    """A template's boolean as CloudFormation reads it: true, or the text "true" in any case."""
    return value is True or str(value).lower() == "true"


def _attribute(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def env_string(value: Any) -> str:
    """How CloudFormation renders a value in a string (environment variables are strings)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


def template_environment(template: dict[str, Any], resources: TemplateResources) -> tuple[dict[str, str], set[str]]:
    """Globals.Function.Environment.Variables resolved, and the names whose values name a resource."""
    variables = ((template.get("Globals") or {}).get("Function") or {}).get("Environment", {}).get("Variables") or {}
    env, from_resources = {}, set()
    for name, value in variables.items():
        used: set[str] = set()
        env[name] = env_string(resources.resolve(value, used))
        if used:
            from_resources.add(name)
    return env, from_resources


def function_environments(template: dict[str, Any], resources: TemplateResources, functions: Mapping[str, Any],
                          environ: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Each function's environment variables, by logical id: `environ` (the stack's process, where
    the global variables are set) without any variable the template declares for a function and
    not for this one, plus this function's own (its `Environment` with `Globals` applied, as SAM
    applies them), resolved. As for the globals, a value that names a resource is the stack's;
    any other already in `environ` wins over the template's (tests pass short durations so)."""
    declared = {logical_id: _variables(function_properties(template, logical_id)) for logical_id in functions}
    everyone = set().union(*declared.values()) if declared else set()
    environments = {}
    for logical_id, variables in declared.items():
        env = {name: value for name, value in environ.items() if name not in everyone or name in variables}
        for name, value in variables.items():
            used: set[str] = set()
            resolved = env_string(resources.resolve(value, used))
            env[name] = environ[name] if not used and name in environ else resolved
        environments[logical_id] = env
    return environments


def _variables(properties: Mapping[str, Any]) -> dict[str, Any]:
    return (properties.get("Environment") or {}).get("Variables") or {}
