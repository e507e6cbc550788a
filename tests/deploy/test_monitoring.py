"""The stack's alarms (monitoring/template.yaml and each model's, read in the expanded template)
and its dashboard: every function's errors and throttles, schedules that stopped, API 5xx and
table throttles are alarmed on, each alarm has its runbook entry, and the dashboard charts the
per-model metrics the workers publish."""

from __future__ import annotations

import json
import re
from typing import Any

from freeinference_batch_local.cloudformation.template import resources_of_type

from tests.deploy.templates import REPO, events_of_type


def _alarms(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {i: r["Properties"] for i, r in resources_of_type(template, "AWS::CloudWatch::Alarm").items()}


def _alarm_on(alarms: dict[str, dict[str, Any]], namespace: str, metric: str, dimension: Any) -> list[dict[str, Any]]:
    return [a for a in alarms.values() if a.get("Namespace") == namespace and a.get("MetricName") == metric
            and dimension in [d["Value"] for d in a.get("Dimensions", [])]]


def test_alarms_cover_errors_throttles_schedules_api_and_tables(
    template: dict[str, Any], functions: dict[str, dict[str, Any]]
) -> None:
    alarms = _alarms(template)
    for alarm in alarms.values():
        assert alarm["AlarmActions"] == [{"Ref": "AlarmTopic"}]
    for logical_id, properties in functions.items():
        function = {"Ref": logical_id}
        assert _alarm_on(alarms, "AWS/Lambda", "Errors", function), f"{logical_id}: no Errors alarm"
        assert _alarm_on(alarms, "AWS/Lambda", "Throttles", function), f"{logical_id}: no Throttles alarm"
        if events_of_type(properties, "Schedule"):
            (stopped,) = _alarm_on(alarms, "AWS/Lambda", "Invocations", function)
            # No invocation writes no data: missing data must count as breaching.
            assert stopped["TreatMissingData"] == "breaching", logical_id
            assert stopped["ComparisonOperator"] == "LessThanThreshold" and stopped["Threshold"] == 1
            rate = events_of_type(properties, "Schedule")[0]["Schedule"]
            minutes = int(rate.split("(")[1].split()[0])
            assert stopped["Period"] * stopped["EvaluationPeriods"] >= 2 * 60 * minutes, logical_id
    assert _alarm_on(alarms, "AWS/ApiGateway", "5xx", {"Ref": "BatchApi"})
    for table in resources_of_type(template, "AWS::DynamoDB::Table"):
        metrics = [
            m["MetricStat"]["Metric"] for a in alarms.values() for m in a.get("Metrics", []) if "MetricStat" in m
            if {"Name": "TableName", "Value": {"Ref": table}} in m["MetricStat"]["Metric"]["Dimensions"]
        ]
        assert {m["MetricName"] for m in metrics} == {"ReadThrottleEvents", "WriteThrottleEvents"}, table


def test_every_alarm_has_a_runbook_entry_in_the_readme(template: dict[str, Any]) -> None:
    readme = (REPO / "README.md").read_text()
    for logical_id, alarm in _alarms(template).items():
        description = alarm["AlarmDescription"]
        if "README runbook: " in description:
            entry = description.split("README runbook: ")[1].rstrip(").")
            assert f"**{entry}**" in readme, f"{logical_id}: README has no runbook entry **{entry}**"


def test_the_dashboard_shows_the_per_model_metrics_the_workers_publish_beside_the_alarms(
    template: dict[str, Any]
) -> None:
    from freeinference_batch.ops.operator_status import BATCH_CAP_METRIC, SLOTS_HELD_METRIC
    from freeinference_batch.worker.outcomes import COMPLETED_BY_MODEL, FAILED_BY_MODEL

    (dashboard,) = resources_of_type(template, "AWS::CloudWatch::Dashboard").values()
    body, variables = dashboard["Properties"]["DashboardBody"]["Fn::Sub"]
    text = re.sub(r"\$\{[^}]+\}", "x", body)  # as CloudFormation substitutes them: plain strings
    widgets = json.loads(text)["widgets"]
    expressions = json.dumps([w["properties"].get("metrics") for w in widgets])
    for metric in (COMPLETED_BY_MODEL, FAILED_BY_MODEL, BATCH_CAP_METRIC, SLOTS_HELD_METRIC):
        assert f'{{FreeInferenceBatch,model,service}} MetricName=\\"{metric}\\"' in expressions, metric
    (alarms,) = [w for w in widgets if w["type"] == "alarm"]
    assert len(alarms["properties"]["alarms"]) == len(variables)
    assert all(value["Fn::GetAtt"][1] == "Arn" and value["Fn::GetAtt"][0].endswith("Alarm")
               for value in variables.values())
