"""DynamoDB's faults, one at a time, on an in-process MotoServer with a fixed seed, through boto3
clients that carry the service's mark.

Each rate is checked over enough calls with a tolerance that a fixed seed cannot flake: the
schedule is a function of the seed and the calls (test_injector.py), so each test sees the same
draws on every run.
"""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.local_stack.aws_faults.calls import client, counts, error_code, key, stored, table


def test_throttling_refuses_a_share_of_the_calls_before_applying_them(moto):
    endpoint = moto("dynamodb.throttle=0.3")
    name = table(endpoint)
    once = client("dynamodb", endpoint, attempts=1)
    outcomes = [error_code(lambda n=n: once.put_item(TableName=name, Item={**key(n), "v": {"N": "1"}}))
                for n in range(300)]
    throttled = [n for n, code in enumerate(outcomes) if code]
    assert {outcomes[n] for n in throttled} == {"ThrottlingException", "ProvisionedThroughputExceededException"}
    assert 60 <= len(throttled) <= 120  # 30% of 300
    assert all(stored(endpoint, name, n) is None for n in throttled)
    assert all(stored(endpoint, name, n) is not None for n in set(range(300)) - set(throttled))
    # botocore retries them: with its 5 attempts a call almost always gets through (50 calls meet
    # about 21 throttles, each retried after a backoff: the test's time)
    retried = client("dynamodb", endpoint)
    for n in range(300, 350):
        retried.put_item(TableName=name, Item=key(n))
    assert counts(endpoint)["dynamodb.throttle"] > len(throttled) + 5


def test_a_throttled_batch_write_leaves_some_items_unprocessed_and_unwritten(moto):
    endpoint = moto("dynamodb.throttle=1")
    name = table(endpoint)
    dynamodb = client("dynamodb", endpoint)
    answer = dynamodb.batch_write_item(RequestItems={name: [{"PutRequest": {"Item": key(n)}} for n in range(25)]})
    left = {item["PutRequest"]["Item"]["pk"]["S"] for item in answer["UnprocessedItems"][name]}
    assert 0 < len(left) < 25
    for n in range(25):
        assert (stored(endpoint, name, n) is None) == (f"k{n}" in left)


def test_a_throttled_batch_get_leaves_some_keys_unprocessed(moto):
    endpoint = moto("dynamodb.throttle=1")
    name = table(endpoint)
    writer = client("dynamodb", endpoint, marked=False)
    for n in range(30):
        writer.put_item(TableName=name, Item=key(n))
    answer = client("dynamodb", endpoint).batch_get_item(
        RequestItems={name: {"Keys": [key(n) for n in range(30)], "ConsistentRead": True}})
    got = {item["pk"]["S"] for item in answer["Responses"][name]}
    left = {k["pk"]["S"] for k in answer["UnprocessedKeys"][name]["Keys"]}
    assert answer["UnprocessedKeys"][name]["ConsistentRead"] is True  # asked again as it was asked
    assert got and left and not got & left and got | left == {f"k{n}" for n in range(30)}
    # A batch of one key throttled is DynamoDB's exception, which botocore retries
    one = client("dynamodb", endpoint, attempts=1)
    assert error_code(lambda: one.batch_get_item(RequestItems={name: {"Keys": [key(0)]}})) == (
        "ProvisionedThroughputExceededException")


def test_an_internal_error_refuses_a_share_of_the_calls_with_500_before_applying_them(moto):
    endpoint = moto("dynamodb.error=0.25")
    name = table(endpoint)
    once = client("dynamodb", endpoint, attempts=1)
    failed = []
    for n in range(200):
        try:
            once.update_item(TableName=name, Key=key(n), UpdateExpression="ADD v :one",
                             ExpressionAttributeValues={":one": {"N": "1"}})
        except ClientError as error:
            assert error.response["Error"]["Code"] == "InternalServerError"
            assert error.response["ResponseMetadata"]["HTTPStatusCode"] == 500
            failed.append(n)
    assert 30 <= len(failed) <= 70  # 25% of 200
    assert all(stored(endpoint, name, n) is None for n in failed)
    assert counts(endpoint)["dynamodb.error"] == len(failed)


def test_a_lost_answer_is_applied_then_sent_again_by_botocore(moto):
    endpoint = moto("dynamodb.lost_answer=0.3")
    name = table(endpoint)
    dynamodb = client("dynamodb", endpoint, attempts=10)
    for _ in range(100):
        dynamodb.update_item(TableName=name, Key=key("counter"), UpdateExpression="ADD v :one",
                             ExpressionAttributeValues={":one": {"N": "1"}})
    lost = counts(endpoint)["dynamodb.lost_answer"]
    assert 25 <= lost <= 60  # 30% of about 140 sends
    # Each send was applied exactly once: 100 calls, plus one application per answer lost
    assert int(stored(endpoint, name, "counter")["v"]["N"]) == 100 + lost


def test_a_conditional_put_whose_answer_was_lost_meets_its_own_success(moto):
    endpoint = moto("dynamodb.lost_answer=1")
    name = table(endpoint)
    dynamodb = client("dynamodb", endpoint, attempts=2)
    with pytest.raises(ClientError) as raised:
        dynamodb.put_item(TableName=name, Item={**key("new"), "v": {"N": "1"}},
                          ConditionExpression="attribute_not_exists(pk)")
    # As on DynamoDB: the first send wrote it, the re-send's condition fails on that write
    assert raised.value.response["Error"]["Code"] == "ConditionalCheckFailedException"
    assert stored(endpoint, name, "new") == {**key("new"), "v": {"N": "1"}}


def _add_one(table_name: str) -> list[dict[str, Any]]:
    return [{"Update": {"TableName": table_name, "Key": key("counter"), "UpdateExpression": "ADD v :one",
                        "ConditionExpression": "attribute_not_exists(done)",
                        "ExpressionAttributeValues": {":one": {"N": "1"}}}}]


def test_a_transaction_sent_again_with_its_token_answers_its_success_and_applies_once(moto):
    endpoint = moto("dynamodb.lost_answer=1")
    name = table(endpoint)
    # Every answer is lost once: botocore re-sends with the ClientRequestToken it filled in
    client("dynamodb", endpoint, attempts=2).transact_write_items(TransactItems=_add_one(name))
    assert stored(endpoint, name, "counter")["v"] == {"N": "1"}
    assert counts(endpoint)["dynamodb.lost_answer"] == 1
    # The same token and request again (anyone's): success, nothing applied
    plain = client("dynamodb", endpoint, marked=False)
    plain.transact_write_items(TransactItems=_add_one(name), ClientRequestToken="token-1")
    plain.transact_write_items(TransactItems=_add_one(name), ClientRequestToken="token-1")
    assert stored(endpoint, name, "counter")["v"] == {"N": "2"}
    # The same token with another request: DynamoDB's mismatch
    other = _add_one(name)
    other[0]["Update"]["ExpressionAttributeValues"] = {":one": {"N": "5"}}
    assert error_code(lambda: plain.transact_write_items(TransactItems=other, ClientRequestToken="token-1")) == (
        "IdempotentParameterMismatchException")
    assert stored(endpoint, name, "counter")["v"] == {"N": "2"}


def test_conflicts_cancel_transactions_and_plain_writes_unretried_and_unapplied(moto):
    endpoint = moto("dynamodb.conflict=0.3")
    name = table(endpoint)
    dynamodb = client("dynamodb", endpoint)  # botocore's 5 attempts: it must not use them
    cancelled = []
    for n in range(100):
        elements = [{"Put": {"TableName": name, "Item": key(f"{n}-{i}")}} for i in range(3)]
        try:
            dynamodb.transact_write_items(TransactItems=elements)
        except ClientError as error:
            assert error.response["Error"]["Code"] == "TransactionCanceledException"
            codes = [reason["Code"] for reason in error.response["CancellationReasons"]]
            assert sorted(codes) == ["None", "None", "TransactionConflict"]
            assert "[" + ", ".join(codes) + "]" in error.response["Error"]["Message"]
            cancelled.append(n)
    conflicting_puts = []
    for n in range(100):
        if error_code(lambda n=n: dynamodb.put_item(TableName=name, Item=key(f"plain-{n}"))) is not None:
            conflicting_puts.append(n)
    assert 15 <= len(cancelled) <= 45 and 15 <= len(conflicting_puts) <= 45  # 30% of 100 each
    # Not retried: one injected conflict per call that failed, and nothing of them applied
    assert counts(endpoint)["dynamodb.conflict"] == len(cancelled) + len(conflicting_puts)
    assert all(stored(endpoint, name, f"{n}-{i}") is None for n in cancelled for i in range(3))
    assert all(stored(endpoint, name, f"plain-{n}") is None for n in conflicting_puts)


def test_a_plain_write_in_conflict_answers_transaction_conflict_exception(moto):
    endpoint = moto("dynamodb.conflict=1")
    name = table(endpoint)
    dynamodb = client("dynamodb", endpoint)
    for call in (lambda: dynamodb.put_item(TableName=name, Item=key(1)),
                 lambda: dynamodb.update_item(TableName=name, Key=key(1), UpdateExpression="SET v = :v",
                                              ExpressionAttributeValues={":v": {"N": "1"}}),
                 lambda: dynamodb.delete_item(TableName=name, Key=key(1))):
        assert error_code(call) == "TransactionConflictException"
    assert counts(endpoint)["dynamodb.conflict"] == 3  # none of them retried
