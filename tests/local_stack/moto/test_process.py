"""moto in its own process, as the local stack runs it."""

from __future__ import annotations

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import EndpointConnectionError
from freeinference_batch_local.moto.process import MotoProcess


def sqs_client(endpoint: str):
    return boto3.client("sqs", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="test",
                        aws_secret_access_key="test", config=Config(retries={"max_attempts": 1}))


def test_moto_in_a_child_process_serves_until_stopped_and_then_is_gone():
    server = MotoProcess()
    endpoint = server.start()
    child = server._process
    try:
        sqs = sqs_client(endpoint)
        url = sqs.create_queue(QueueName="in-a-child")["QueueUrl"]
        sqs.send_message(QueueUrl=url, MessageBody="hello")
        assert [m["Body"] for m in sqs.receive_message(QueueUrl=url).get("Messages", [])] == ["hello"]
    finally:
        server.stop()
    assert child is not None and child.returncode is not None
    with pytest.raises(EndpointConnectionError):
        sqs_client(endpoint).list_queues()
    server.stop()  # stopping twice is harmless


def test_the_child_stops_when_its_parent_closes_its_stdin():
    # What happens when the stack's process dies: the pipe closes and the child must not linger
    server = MotoProcess()
    server.start()
    child = server._process
    assert child is not None and child.stdin is not None
    child.stdin.close()
    assert child.wait(timeout=10) == 0
    server.stop()
