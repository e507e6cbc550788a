"""What a local stack stored, read straight from its moto server (endpoint and names from the
stack's `.local-stack/state.json`): what the API cannot show, or no longer shows once a batch is
deleted; and the events it put on its EventBridge bus."""

from __future__ import annotations

import json

import boto3
from freeinference_batch.store.accounts_table import usage_item_key
from freeinference_batch.store.batch_keys import meta_key
from freeinference_batch.store.dynamo import from_item


def _client_options(stack) -> dict:
    env = json.loads(stack.state_file.read_text())["env"]
    return {
        "endpoint_url": env["AWS_ENDPOINT_URL"],
        "region_name": env.get("AWS_DEFAULT_REGION", "us-east-1"),
        "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
    }


class StoredState:
    """The stack's tables and payload bucket, read straight from its moto server."""

    def __init__(self, stack) -> None:
        env = json.loads(stack.state_file.read_text())["env"]
        options = _client_options(stack)
        self.dynamodb = boto3.client("dynamodb", **options)
        self.s3 = boto3.client("s3", **options)
        self.table = env["BATCH_TABLE_NAME"]
        self.accounts_table = env["ACCOUNTS_TABLE_NAME"]
        self.bucket = env["PAYLOAD_BUCKET_NAME"]

    def items(self, batch_id: str) -> list[dict]:
        answer = self.dynamodb.query(
            TableName=self.table,
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": {"S": f"BATCH#{batch_id}"}},
            ConsistentRead=True,
        )
        return answer["Items"]

    def request_items(self, batch_id: str) -> list[dict]:
        """The batch's request items, decoded (one page: batches of up to a few thousand small requests)."""
        return [from_item(item) for item in self.items(batch_id) if item["sk"]["S"].startswith("REQ#")]

    def meta(self, batch_id: str) -> dict:
        answer = self.dynamodb.get_item(TableName=self.table, Key=meta_key(batch_id), ConsistentRead=True)
        found = from_item(answer.get("Item"))
        assert found is not None, f"no batch item for {batch_id}"
        return found

    def usage_nano(self, account_id: str, day: str) -> int:
        answer = self.dynamodb.get_item(
            TableName=self.accounts_table, Key=usage_item_key(account_id, day), ConsistentRead=True
        )
        found = from_item(answer.get("Item")) or {}
        return int(found.get("cost_nano", 0))

    def objects(self, batch_id: str) -> list[str]:
        answer = self.s3.list_objects_v2(Bucket=self.bucket, Prefix=f"{batch_id}/")
        return [o["Key"] for o in answer.get("Contents", [])]

    def wait_until_purged(self, api, batch_id: str, timeout: float = 30.0) -> None:
        api.wait_for(
            lambda: not self.items(batch_id) and not self.objects(batch_id),
            timeout=timeout,
            interval=0.2,
            message=f"every item and object of {batch_id} purged",
        )


class BusEvents:
    """The stack's EventBridge events (source `freeinference.batch`), routed as an operator would
    route them: a rule on the bus with a queue of the test's as its target. `seen()` answers every
    event so far, in the order they arrived."""

    def __init__(self, stack, name: str) -> None:
        options = _client_options(stack)
        self.sqs = boto3.client("sqs", **options)
        events = boto3.client("events", **options)
        self.queue_url = self.sqs.create_queue(QueueName=name)["QueueUrl"]
        arn = self.sqs.get_queue_attributes(QueueUrl=self.queue_url, AttributeNames=["QueueArn"])["Attributes"]
        events.put_rule(Name=name, EventPattern=json.dumps({"source": ["freeinference.batch"]}))
        events.put_targets(Rule=name, Targets=[{"Id": "queue", "Arn": arn["QueueArn"]}])
        self.events: list[dict] = []

    def seen(self) -> list[dict]:
        while messages := self.sqs.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=10).get("Messages"):
            for message in messages:
                self.events.append(json.loads(message["Body"]))
                self.sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"])
        return list(self.events)

    def of(self, batch_id: str) -> list[tuple[str, str, str | None]]:
        """(detail-type, status, the `waiting` reason or None) of each of the batch's events."""
        return [(event["detail-type"], event["detail"]["status"], (event["detail"].get("waiting") or {}).get("reason"))
                for event in self.seen() if event["detail"]["batch_id"] == batch_id]
