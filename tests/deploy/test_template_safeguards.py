"""The template's safeguards from the security review (issue 21), one rule each: the API and each
schedule reserve their own concurrency (and README's sum counts them); the tables are protected
from deletion; a refused upstream credential pages the on-call. (That a gzip body must be a
complete stream is held by tests/service/test_api_create_validation.py.)"""

from __future__ import annotations

from typing import Any

from freeinference_batch.worker.upstream import CREDENTIAL_REJECTED_METRIC
from freeinference_batch_client.cli import preflight
from freeinference_batch_local.cloudformation.template import function_properties, resources_of_type

from tests.deploy.templates import REPO


def test_the_api_and_each_schedule_reserve_their_own_concurrency(template: dict[str, Any]):
    # A flood of API calls (throttled per route for all callers; unauthenticated ones still invoke
    # the function) takes at most the API's reservation, and cannot starve the schedules
    reserved = preflight.template_reserved_concurrency(template)
    functions = resources_of_type(template, "AWS::Serverless::Function")
    assert reserved["ApiFunction"] == template["Parameters"]["ApiReservedConcurrency"]["Default"] > 0
    schedules = [f for f in functions if any(e["Type"] == "Schedule"
                                             for e in function_properties(template, f).get("Events", {}).values())]
    assert sorted(schedules) == ["ExpireFunction", "PurgeFunction", "SweepFunction"]
    for schedule in schedules:
        assert 1 <= reserved[schedule] <= 5, schedule  # small: a tick or two at once
    # Every function reserves, so the preflight counts them all against the account's pool
    assert set(reserved) == set(functions)
    section = (REPO / "README.md").read_text().split("### Lambda concurrency")[1].split("\n### ")[0]
    assert f"{sum(reserved.values()) + preflight.MIN_UNRESERVED}" in section.replace(",", "")


def test_both_tables_are_protected_from_deletion_and_the_teardown_says_how_to_lift_it(template: dict[str, Any]):
    tables = resources_of_type(template, "AWS::DynamoDB::Table")
    assert sorted(tables) == ["AccountsTable", "BatchTable"]
    for properties in tables.values():
        assert properties["Properties"]["DeletionProtectionEnabled"] is True
    teardown = (REPO / "README.md").read_text().split("### Teardown")[1].split("\n### ")[0]
    assert teardown.count("--no-deletion-protection-enabled") == 2
    assert teardown.index("--no-deletion-protection-enabled") < teardown.index("aws dynamodb delete-table")


def test_a_refused_upstream_credential_pages_the_on_call(template: dict[str, Any]):
    alarms = [r["Properties"] for r in resources_of_type(template, "AWS::CloudWatch::Alarm").values()
              if r["Properties"].get("MetricName") == CREDENTIAL_REJECTED_METRIC]
    assert len(alarms) == 1
    (alarm,) = alarms
    assert alarm["Namespace"] == "FreeInferenceBatch" and alarm["Threshold"] == 0
    assert alarm["Dimensions"] == [{"Name": "service", "Value": "freeinference-batch"}]
