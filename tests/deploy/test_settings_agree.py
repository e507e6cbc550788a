"""Settings that must agree across files, held here rather than by comments: the names the
template passes are settings, and a bound one file puts on another's number holds (the upstream
timeout against the worker's Timeout)."""

from __future__ import annotations

from typing import Any

from freeinference_batch.core.settings import Settings

from tests.deploy.templates import worker_functions

# Environment variables the functions read that are not `Settings` fields.
NON_SETTINGS_ENV = {
    "AWS_ENDPOINT_URL",  # read by boto3 itself
    "AWS_SDK_UA_APP_ID",  # read by botocore itself: the local stack's mark on the service's calls
    "WORKER_MODEL",
    "POWERTOOLS_SERVICE_NAME",
    "POWERTOOLS_METRICS_NAMESPACE",
    "POWERTOOLS_LOG_LEVEL",
}


def test_global_environment_names_are_settings(template: dict[str, Any]) -> None:
    # A typo here would silently fall back to a default in settings.py.
    aliases = {field.alias for field in Settings.model_fields.values()}
    names = set(template["Globals"]["Function"]["Environment"]["Variables"])
    assert names - NON_SETTINGS_ENV <= aliases, names - NON_SETTINGS_ENV - aliases


def test_the_upstream_timeout_fits_the_worker_invocation(template: dict[str, Any],
                                                         functions: dict[str, dict[str, Any]]) -> None:
    # What a deployed stack uses is the template's parameter: its default is the settings' default
    # (what the interactive endpoint allows), and its most is what a worker invocation can give one
    # call: the worker's Timeout less the settle time at each end (call_budget.longest_call).
    parameter = template["Parameters"]["UpstreamTimeoutSeconds"]
    defaults = Settings()  # type: ignore[call-arg]
    assert parameter["Default"] == defaults.batch_upstream_timeout_seconds == 600
    workers = worker_functions(functions)
    assert workers
    for logical_id, properties in workers.items():
        assert parameter["MaxValue"] == properties["Timeout"] - 2 * defaults.batch_settle_seconds, logical_id
    # A running request's lease outlasts the longest call and its settle, so the sweep never takes
    # back a live call, at the default and at the most the parameter allows
    for timeout in (parameter["Default"], parameter["MaxValue"]):
        config = Settings(BATCH_UPSTREAM_TIMEOUT_SECONDS=str(timeout))  # type: ignore[call-arg]
        assert config.lease_seconds >= timeout + config.batch_settle_seconds
