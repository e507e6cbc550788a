"""Settings that must agree across files, held here rather than by comments.

Every setting a deployed stack runs with is either passed by the template (a parameter, or a
name of the stack's) or listed in README as fixed; the names the template passes are settings;
and each bound one file puts on another's number holds: the upstream timeout against the
worker's Timeout, the webhook retry window against its queue's retention and receive count, and
the longest webhook wait against SQS's visibility cap, which is written once
(`core/settings.py` SQS_MAX_VISIBILITY_SECONDS).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from freeinference_batch.core.settings import SQS_MAX_VISIBILITY_SECONDS, Settings
from freeinference_batch.webhooks import delivery
from freeinference_batch_local.cloudformation.resources import TemplateResources
from freeinference_batch_local.cloudformation.template import resources_of_type
from pydantic import ValidationError

from tests.deploy.templates import REPO, events_of_type, getatt_resource, worker_functions

PACKAGE = REPO / "layers" / "batch_core" / "freeinference_batch"
# AWS's own limit: SQS refuses a visibility timeout over 12 h from the message's receive.
SQS_VISIBILITY_LIMIT_SECONDS = 12 * 3600
# Where README lists the settings the template does not pass, each with why.
FIXED_LIST = "**Fixed on a deployed stack.**"

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


def _documented_fixed() -> set[str]:
    """The settings README's Configuration lists as fixed on a deployed stack."""
    text = (REPO / "README.md").read_text()
    assert FIXED_LIST in text, f"README has no {FIXED_LIST} list of the settings the template does not pass"
    return set(re.findall(r"`([A-Z][A-Z0-9_]+)`", text.split(FIXED_LIST, 1)[1].split("\n#", 1)[0]))


def _parameter_of(template: dict[str, Any], variable: str) -> dict[str, Any]:
    """The template parameter a variable of every function is given (`VARIABLE: !Ref Parameter`)."""
    value = template["Globals"]["Function"]["Environment"]["Variables"][variable]
    assert isinstance(value, dict) and set(value) == {"Ref"}, f"{variable} is not given a parameter: {value!r}"
    return template["Parameters"][value["Ref"]]


def _delivery_queue(template: dict[str, Any], functions: dict[str, dict[str, Any]]
                    ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The webhook deliveries' queue (the one WEBHOOK_DELIVERY_QUEUE_URL names) and the function
    its mapping invokes, their properties."""
    names = TemplateResources(template, clients={})  # resolves names only: creates nothing
    url = names.resolve(template["Globals"]["Function"]["Environment"]["Variables"]["WEBHOOK_DELIVERY_QUEUE_URL"])
    (queue,) = [i for i, q in resources_of_type(template, "AWS::SQS::Queue").items()
                if names.resolve(q["Properties"]["QueueName"]) == url.rsplit("/", 1)[1]]
    (function,) = [properties for properties in functions.values()
                   for event in events_of_type(properties, "SQS") if getatt_resource(event["Queue"]) == queue]
    return template["Resources"][queue]["Properties"], function


def test_every_setting_is_passed_by_the_template_or_documented_as_fixed(functions: dict[str, dict[str, Any]]) -> None:
    # A setting the template does not pass runs at settings.py's default on AWS, where only a code
    # change moves it: a new one must be decided, a parameter (or a name) the template passes, or
    # a line of README's fixed list saying why not.
    settings = {field.alias for field in Settings.model_fields.values()}
    passed = {name for p in functions.values() for name in (p.get("Environment") or {}).get("Variables", {})}
    fixed = _documented_fixed()
    undecided = settings - passed - fixed
    assert not undecided, (f"settings the template does not pass and README's {FIXED_LIST} list does not name: "
                           f"{sorted(undecided)}")
    assert not fixed & passed, f"README lists as fixed what the template passes: {sorted(fixed & passed)}"
    assert fixed <= settings, f"README lists as fixed what is not a setting: {sorted(fixed - settings)}"


def test_the_webhook_retry_window_ends_inside_its_queues_retention(template: dict[str, Any],
                                                                   functions: dict[str, dict[str, Any]]) -> None:
    # The window counts from when the event was queued, as the queue's retention does: the last
    # attempt, at the window's end, must find its message still there for as long as it is in flight.
    window = _parameter_of(template, "WEBHOOK_RETRY_WINDOW_SECONDS")
    queue, _ = _delivery_queue(template, functions)
    for seconds in (window["Default"], window["MaxValue"]):
        assert seconds + queue["VisibilityTimeout"] <= queue["MessageRetentionPeriod"], seconds


def test_a_webhook_events_attempts_in_its_window_stay_under_its_queues_receive_count(
    template: dict[str, Any], functions: dict[str, dict[str, Any]]
) -> None:
    # Every attempt is a receive (and, after one that marked the endpoint unreachable, at most one
    # more to wait out the rounding of its visibility): past maxReceiveCount SQS would give the
    # event to the dead-letter queue before its window ends. One event, every wait its shortest
    # (the jitter's half), at the defaults and over the longest window.
    window = _parameter_of(template, "WEBHOOK_RETRY_WINDOW_SECONDS")
    base = _parameter_of(template, "WEBHOOK_RETRY_BASE_SECONDS")["Default"]
    most = _parameter_of(template, "WEBHOOK_RETRY_MAX_SECONDS")["Default"]
    queue, _ = _delivery_queue(template, functions)
    for seconds in (window["Default"], window["MaxValue"]):
        settings = Settings(WEBHOOK_RETRY_WINDOW_SECONDS=str(seconds), WEBHOOK_RETRY_BASE_SECONDS=str(base),
                            WEBHOOK_RETRY_MAX_SECONDS=str(most))  # type: ignore[call-arg]
        attempts, waited = 1, 0.0
        while waited <= seconds:
            waited += delivery.retry_delay(settings, attempts, rng=lambda: 0.0)
            attempts += 1
        assert 2 * attempts < queue["RedrivePolicy"]["maxReceiveCount"], (seconds, attempts)


def test_the_longest_webhook_wait_is_sqs_visibility_cap_written_once(template: dict[str, Any],
                                                                     functions: dict[str, dict[str, Any]]) -> None:
    # One source, settings.py's SQS_MAX_VISIBILITY_SECONDS: the setting is bounded by it, the
    # delivery's ChangeMessageVisibility is cut to it, and the template's parameter says it too
    parameter = _parameter_of(template, "WEBHOOK_RETRY_MAX_SECONDS")
    assert parameter["MaxValue"] == SQS_MAX_VISIBILITY_SECONDS
    assert Settings(WEBHOOK_RETRY_MAX_SECONDS=str(SQS_MAX_VISIBILITY_SECONDS))  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        Settings(WEBHOOK_RETRY_MAX_SECONDS=str(SQS_MAX_VISIBILITY_SECONDS + 1))  # type: ignore[call-arg]
    written = [str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
               if re.search(rf"\b{SQS_MAX_VISIBILITY_SECONDS:_}\b|\b{SQS_MAX_VISIBILITY_SECONDS}\b", path.read_text())]
    assert written == ["core/settings.py"], written
    # And the cap leaves the delivery function's run inside what SQS takes
    _, function = _delivery_queue(template, functions)
    assert SQS_MAX_VISIBILITY_SECONDS + function["Timeout"] <= SQS_VISIBILITY_LIMIT_SECONDS
