"""What each AWS call a handler makes needs from IAM: a hook on botocore (`Recorder.record`)
notes the action and the resource (by the template's logical id), and for DynamoDB items and S3
listings the leading key or prefix its statement's condition must let through, keyed by the
function whose handler made the call."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from freeinference_batch_local.handlers import LOCAL_STACK_NAME

from tests.deploy.iam_grants import queue_names, secret_names

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
    # S3's multipart upload: every step is s3:PutObject (an input file's parts joined, files/content.py)
    ("s3", "CreateMultipartUpload"): "s3:PutObject",
    ("s3", "UploadPart"): "s3:PutObject",
    ("s3", "CompleteMultipartUpload"): "s3:PutObject",
    ("s3", "ListObjectsV2"): "s3:ListBucket",
    ("s3", "ListParts"): "s3:ListMultipartUploadParts",
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
