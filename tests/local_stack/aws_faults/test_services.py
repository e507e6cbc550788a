"""EventBridge's, Secrets Manager's and CloudWatch's faults: throttles and 500s before a call is
applied, a write's answer lost after it was, and PutEvents entries refused one by one."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from tests.local_stack.aws_faults.calls import client, counts, error_code, new_queue, receive_all, unique


def bus_to_queue(endpoint: str) -> tuple[str, str]:
    """A bus whose every event of source `test` lands in a queue: (bus name, queue URL)."""
    events = client("events", endpoint, marked=False)
    bus = events.create_event_bus(Name=unique("bus"))["EventBusArn"].rsplit("/", 1)[-1]
    url = new_queue(endpoint)
    arn = client("sqs", endpoint, marked=False).get_queue_attributes(
        QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    rule = unique("rule")
    events.put_rule(Name=rule, EventBusName=bus, EventPattern=json.dumps({"source": ["test"]}))
    events.put_targets(Rule=rule, EventBusName=bus, Targets=[{"Id": "q", "Arn": arn}])
    return bus, url


def entry(bus: str, n: int) -> dict:
    return {"Source": "test", "DetailType": "t", "Detail": json.dumps({"n": n}), "EventBusName": bus}


@pytest.mark.parametrize(("service", "call", "throttled", "internal"), [
    ("events", lambda c: c.list_event_buses(), "ThrottlingException", "InternalException"),
    ("secretsmanager", lambda c: c.list_secrets(), "ThrottlingException", "InternalServiceError"),
    ("cloudwatch", lambda c: c.list_metrics(), "Throttling", "InternalServiceError"),
])
def test_throttles_and_server_errors_answer_as_the_service_does(moto, service, call, throttled, internal):
    endpoint = moto(f"{service}.throttle=1")
    assert error_code(lambda: call(client(service, endpoint, attempts=2))) == throttled
    assert counts(endpoint)[f"{service}.throttle"] == 2  # botocore retried the throttle
    assert error_code(lambda: call(client(service, endpoint, marked=False))) is None  # never anyone else's
    endpoint = moto(f"{service}.error=1")
    assert error_code(lambda: call(client(service, endpoint, attempts=3))) == internal
    assert counts(endpoint)[f"{service}.error"] == 3
    # At a lower rate botocore's retries carry the calls through
    endpoint = moto(f"{service}.throttle=0.3,{service}.error=0.2")
    marked = client(service, endpoint, attempts=10)
    for _ in range(20):
        call(marked)
    assert counts(endpoint)[f"{service}.throttle"] + counts(endpoint)[f"{service}.error"] >= 3


def test_a_secret_read_meets_throttles_and_errors_and_botocore_carries_it_through(moto):
    endpoint = moto("secretsmanager.throttle=0.3,secretsmanager.error=0.2")
    arn = client("secretsmanager", endpoint, marked=False).create_secret(Name=unique("s"), SecretString="v")["ARN"]
    secrets = client("secretsmanager", endpoint, attempts=10)
    assert all(secrets.get_secret_value(SecretId=arn)["SecretString"] == "v" for _ in range(20))
    assert counts(endpoint)["secretsmanager.throttle"] and counts(endpoint)["secretsmanager.error"]


def test_a_lost_put_events_answer_puts_the_events_again(moto):
    endpoint = moto("events.lost_answer=0.3")
    bus, url = bus_to_queue(endpoint)
    events = client("events", endpoint, attempts=10)
    for n in range(20):
        assert events.put_events(Entries=[entry(bus, n)])["FailedEntryCount"] == 0
    lost = counts(endpoint)["events.lost_answer"]
    assert 1 <= lost <= 15
    # Each lost answer: the event put once more (EventBridge does not deduplicate)
    assert len(receive_all(client("sqs", endpoint, marked=False), url)) == 20 + lost


def test_put_events_refuses_entries_one_by_one_in_their_places(moto):
    endpoint = moto("events.failed_entry=0.4")
    bus, url = bus_to_queue(endpoint)
    answer = client("events", endpoint).put_events(Entries=[entry(bus, n) for n in range(10)])
    refused = [n for n, result in enumerate(answer["Entries"]) if "ErrorCode" in result]
    assert answer["FailedEntryCount"] == len(refused) == counts(endpoint)["events.failed_entry"]
    assert 0 < len(refused) < 10
    assert all(answer["Entries"][n]["ErrorCode"] == "InternalFailure" for n in refused)
    assert all("EventId" in result for n, result in enumerate(answer["Entries"]) if n not in refused)
    # Only the entries not refused were put
    delivered = receive_all(client("sqs", endpoint, marked=False), url)
    assert sorted(json.loads(m["Body"])["detail"]["n"] for m in delivered) == sorted(set(range(10)) - set(refused))


def test_a_lost_put_metric_data_answer_puts_the_data_again(moto):
    endpoint = moto("cloudwatch.lost_answer=1")
    namespace, now = unique("ns"), dt.datetime.now(dt.UTC)
    cloudwatch = client("cloudwatch", endpoint, attempts=2)
    assert error_code(lambda: cloudwatch.put_metric_data(
        Namespace=namespace, MetricData=[{"MetricName": "m", "Value": 1, "Timestamp": now}])) == "InternalServiceError"
    statistics = client("cloudwatch", endpoint, marked=False).get_metric_statistics(
        Namespace=namespace, MetricName="m", StartTime=now - dt.timedelta(minutes=5),
        EndTime=now + dt.timedelta(minutes=5), Period=600, Statistics=["SampleCount"])
    assert sum(point["SampleCount"] for point in statistics["Datapoints"]) == 2  # applied at each try
    assert counts(endpoint)["cloudwatch.lost_answer"] == 2
