"""What a local stack stored, read straight from its moto server (endpoint and names from the
stack's `.local-stack/state.json`): what the API cannot show, or no longer shows once a batch is
deleted."""

from __future__ import annotations

import json

import boto3
from freeinference_batch.store.accounts_table import usage_item_key
from freeinference_batch.store.batch_keys import meta_key
from freeinference_batch.store.dynamo import from_item


class StoredState:
    """The stack's tables and payload bucket, read straight from its moto server."""

    def __init__(self, stack) -> None:
        env = json.loads(stack.state_file.read_text())["env"]
        options = {
            "endpoint_url": env["AWS_ENDPOINT_URL"],
            "region_name": env.get("AWS_DEFAULT_REGION", "us-east-1"),
            "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
        }
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
