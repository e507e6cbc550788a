"""The service's CloudWatch metrics, read back (what it publishes goes out through Powertools'
embedded metric format in its logs: core/observability.py)."""

from __future__ import annotations

import datetime as dt

from freeinference_batch.core import aws


def sums(namespace: str, series: dict[str, tuple[str, dict[str, str]]], seconds: int,
         end: dt.datetime) -> dict[str, int]:
    """The sum of each series over the `seconds` before `end`, in one GetMetricData call. `series`:
    query id -> (metric name, dimensions); the answer is by query id."""
    queries = [
        {"Id": query_id, "ReturnData": True, "MetricStat": {
            "Metric": {"Namespace": namespace, "MetricName": metric_name,
                       "Dimensions": [{"Name": name, "Value": value} for name, value in dimensions.items()]},
            "Period": seconds, "Stat": "Sum"}}
        for query_id, (metric_name, dimensions) in series.items()
    ]
    answer = aws.cloudwatch().get_metric_data(MetricDataQueries=queries, StartTime=end - dt.timedelta(seconds=seconds),
                                              EndTime=end)
    return {result["Id"]: int(sum(result.get("Values") or [])) for result in answer["MetricDataResults"]}
