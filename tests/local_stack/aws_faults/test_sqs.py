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


def test_batch_entries_fail_one_by_one_and_are_not_applied(moto):
    endpoint = moto("sqs.failed_entry=0.4")
    url = new_queue(endpoint)
    sqs = client("sqs", endpoint)
    # SendMessageBatch: the entries listed Failed were not sent, the others were
    sent = sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(n), "MessageBody": str(n)} for n in range(10)])
    failed = {entry["Id"] for entry in sent.get("Failed") or []}
    assert failed and len(failed) < 10 and len(sent["Successful"]) == 10 - len(failed)
    assert all(entry["Code"] == "InternalError" and entry["SenderFault"] is False for entry in sent["Failed"])
    assert counts(endpoint)["sqs.failed_entry"] == len(failed)
    received = receive_all(client("sqs", endpoint, marked=False), url)
    assert sorted(message["Body"] for message in received) == sorted(set(map(str, range(10))) - failed)
    # DeleteMessageBatch and ChangeMessageVisibilityBatch: a Failed entry's message is untouched
    entries = [{"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(received)]
    deleted = sqs.delete_message_batch(QueueUrl=url, Entries=entries)
    kept = {entry["Id"] for entry in deleted.get("Failed") or []}
    assert len(deleted["Successful"]) == len(entries) - len(kept)
    left = int(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"])
               ["Attributes"]["ApproximateNumberOfMessagesNotVisible"])
    assert left == len(kept)
    changed = sqs.change_message_visibility_batch(QueueUrl=url, Entries=[
        {**entry, "VisibilityTimeout": 0} for entry in entries if entry["Id"] in kept])
    assert len(changed.get("Successful") or []) + len(changed.get("Failed") or []) == len(kept)


def test_a_delete_by_an_old_receipt_handle_succeeds_without_deleting(moto):
    # Given a message received twice (it came back after its visibility timeout)
    endpoint = moto("sqs.stale_receipt=1")
    url = new_queue(endpoint)
    sqs = client("sqs", endpoint)
    sqs.send_message(QueueUrl=url, MessageBody="once")
    first = sqs.receive_message(QueueUrl=url, VisibilityTimeout=0)["Messages"][0]
    latest = sqs.receive_message(QueueUrl=url, VisibilityTimeout=0)["Messages"][0]
    assert first["MessageId"] == latest["MessageId"] and first["ReceiptHandle"] != latest["ReceiptHandle"]
    # When it is deleted by the first receipt handle, alone or in a batch
    sqs.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])
    batch = sqs.delete_message_batch(QueueUrl=url, Entries=[{"Id": "a", "ReceiptHandle": first["ReceiptHandle"]}])
    # Then both calls succeed, as on SQS, and the message is still there
    assert batch["Successful"] == [{"Id": "a"}] and not batch.get("Failed")
    assert counts(endpoint)["sqs.stale_receipt"] == 2
    again = sqs.receive_message(QueueUrl=url, VisibilityTimeout=0)["Messages"]
    assert [message["MessageId"] for message in again] == [first["MessageId"]]
    # And only the latest receipt handle deletes it
    sqs.delete_message(QueueUrl=url, ReceiptHandle=again[0]["ReceiptHandle"])
    assert not sqs.receive_message(QueueUrl=url).get("Messages")
