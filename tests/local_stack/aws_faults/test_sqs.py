"""SQS's faults: a received message delivered again, an answer lost after the call was applied."""

from __future__ import annotations

from tests.local_stack.aws_faults.calls import client, counts, new_queue, receive_all


def test_a_received_message_is_delivered_again_with_the_same_id(moto):
    endpoint = moto("sqs.duplicate=0.2")
    url = new_queue(endpoint)
    sqs = client("sqs", endpoint)
    sent = {sqs.send_message(QueueUrl=url, MessageBody=str(n))["MessageId"] for n in range(100)}
    received = receive_all(sqs, url)
    ids = [message["MessageId"] for message in received]
    assert set(ids) == sent
    duplicated = counts(endpoint)["sqs.duplicate"]
    assert len(ids) == 100 + duplicated and 10 <= duplicated <= 40  # 20% of about 120 receipts
    again = [m for m in received if ids.count(m["MessageId"]) > 1]
    assert len({m["ReceiptHandle"] for m in again}) == len(again)  # a new receipt handle each time


def test_lost_sqs_answers_are_applied_and_sent_again(moto):
    endpoint = moto("sqs.lost_answer=0.3")
    url = new_queue(endpoint)
    sqs = client("sqs", endpoint, attempts=10)
    for n in range(50):
        sqs.send_message(QueueUrl=url, MessageBody=str(n))
    lost_sends = counts(endpoint)["sqs.lost_answer"]
    assert 8 <= lost_sends <= 30
    received = receive_all(client("sqs", endpoint, marked=False), url)
    assert len(received) == 50 + lost_sends  # each lost answer: the message sent once more
    for message in received:  # deleting twice (the re-send) succeeds, as on SQS
        sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    assert counts(endpoint)["sqs.lost_answer"] > lost_sends
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["ApproximateNumberOfMessages"] == attributes["ApproximateNumberOfMessagesNotVisible"] == "0"
